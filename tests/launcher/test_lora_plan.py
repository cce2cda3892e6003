"""What the plan counts for LoRA (peft=lora), against plain computations written out here: the memory of a frozen
base (its weights only) and of the adapters (weights, gradients, fp32 main weights and Adam state), and the FLOPs of
a step whose base computes no weight gradients."""

from __future__ import annotations

import dataclasses

import pytest

from common.config import LoraConfig, LoraTarget
from launcher.config.compose import compose
from launcher.plan.build import build_plan
from launcher.plan.checks import peft as peft_checks
from launcher.plan.findings import Findings
from launcher.plan.memory import GIB, estimate_memory_gib
from launcher.plan.sizes import sizes_of
from launcher.plan.table import format_plan

BASE = ["training=llama31/8b", "cluster=bcm", "training.checkpoint.init_from=/checkpoints/base"]
LORA_OVERRIDES = ["peft=lora", "peft.rank=16"]


def weights_and_adapters(cfg, lora: LoraConfig) -> tuple[int, int]:
    """Every weight of the model (decoder layers, embedding, output layer, norms) and every adapter parameter
    (A: r x in, B: out x r per target per layer), counted from the shapes."""
    m = cfg.training.model
    h, ffn, q, kv = (
        m.hidden_size,
        m.ffn_hidden_size,
        m.num_attention_heads * m.kv_channels,
        m.num_query_groups * m.kv_channels,
    )
    shapes = {
        LoraTarget.linear_qkv: (h, q + 2 * kv),
        LoraTarget.linear_proj: (q, h),
        LoraTarget.linear_fc1: (h, 2 * ffn),
        LoraTarget.linear_fc2: (ffn, h),
    }
    layer = sum(i * o for i, o in shapes.values()) + 2 * h
    # One adapter per Hugging Face projection, as PEFT: A is r x in for each of q, k, v (gate, up), B r per row.
    projections = {
        LoraTarget.linear_qkv: 3,
        LoraTarget.linear_proj: 1,
        LoraTarget.linear_fc1: 2,
        LoraTarget.linear_fc2: 1,
    }
    adapters = m.num_layers * sum(
        lora.rank * (projections[t] * shapes[t][0] + shapes[t][1]) for t in lora.target_modules
    )
    return m.num_layers * layer, adapters


def test_lora_flops_are_the_base_without_weight_gradients_and_the_adapters_in_full():
    full_cfg, lora_cfg = compose(BASE), compose([*BASE, *LORA_OVERRIDES])
    assert isinstance(lora_cfg.peft, LoraConfig)
    m, seq = lora_cfg.training.model, lora_cfg.training.seq_length
    layer_weights, adapters = weights_and_adapters(lora_cfg, lora_cfg.peft)
    matmul_weights = layer_weights - 2 * m.hidden_size * m.num_layers + m.vocab_size * m.hidden_size  # + output layer
    attention_products = 4 * m.num_layers * m.hidden_size * seq  # forward of QK^T and of the scores times V, per token
    full = seq * (6 * matmul_weights + 3 * attention_products)
    lora = seq * (4 * matmul_weights + 3 * attention_products + 6 * adapters)
    assert build_plan(full_cfg).model_flops_per_sample == pytest.approx(full, rel=1e-9)
    assert build_plan(lora_cfg).model_flops_per_sample == pytest.approx(lora, rel=1e-9)
    # Above 2/3 of full training's: attention's products (large at seq 8192) and the adapters keep their backward.
    assert 2 / 3 < lora / full < 0.8
    # The plan says which FLOPs its MFU divides.
    assert "LoRA: frozen base without weight gradients, adapters in full" in format_plan(build_plan(lora_cfg), lora_cfg)


@pytest.mark.parametrize("tp", [1, 4])
def test_lora_memory_is_the_frozen_weights_and_the_trained_adapters(tp):
    cfg = compose([*BASE, *LORA_OVERRIDES])
    assert isinstance(cfg.peft, LoraConfig)
    m = cfg.training.model
    # One stage, fp32 gradient buffers (no gradient copy in the step) and one optimizer shard: what differs between
    # full training and LoRA is then only the weights' state, whatever the activations are.
    kwargs = dict(
        tp=tp, pp=1, cp=1, dp=1, vp=None, stage_layers=[m.num_layers], padded_vocab=m.vocab_size, seq_length=8192,
        micro_batch_size=1, distributed_optimizer=True, grad_fp32=True, fp8_params=False, recompute=None,
        num_microbatches=1,
    )  # fmt: skip
    full = estimate_memory_gib(m, **kwargs)  # type: ignore[arg-type]
    lora = estimate_memory_gib(m, **kwargs, peft=cfg.peft)  # type: ignore[arg-type]
    layer_weights, _ = weights_and_adapters(cfg, cfg.peft)
    weights = (layer_weights + 2 * m.vocab_size * m.hidden_size) / tp  # + embedding and output layer
    # This rank's adapters: a column-parallel target's whole A (q, k, v: three r x h blocks; gate, up: two) and its
    # rows of B, a row-parallel one's columns of A and whole B.
    r, h, ffn = cfg.peft.rank, m.hidden_size, m.ffn_hidden_size
    qkv_out = (m.num_attention_heads + 2 * m.num_query_groups) * m.kv_channels
    adapters = m.num_layers * r * ((3 * h + qkv_out / tp) + (h / tp + h) + (2 * h + 2 * ffn / tp) + (ffn / tp + h))
    # Full training: bf16 weights, fp32 gradients, fp32 main weights and Adam's m and v (4 + 12 bytes more per
    # weight); LoRA: the same 16 bytes for each adapter parameter, and 2 for an adapter's bf16 weight.
    expected_saving = (weights * (4 + 12) - adapters * (2 + 4 + 12)) / GIB
    assert full - lora == pytest.approx(expected_saving, abs=0.11)  # each estimate is rounded to 0.1 GiB
    assert lora > weights * 2 / GIB  # the frozen base's bf16 weights stay


def test_the_plan_of_a_lora_run_uses_the_lora_estimate():
    full, lora = build_plan(compose(BASE)), build_plan(compose([*BASE, *LORA_OVERRIDES]))
    assert lora.est_memory_gib_per_gpu < full.est_memory_gib_per_gpu
    cfg = compose([*BASE, *LORA_OVERRIDES])
    assert isinstance(cfg.peft, LoraConfig)
    more = dataclasses.replace(cfg, peft=dataclasses.replace(cfg.peft, rank=256))
    assert build_plan(more).est_memory_gib_per_gpu > lora.est_memory_gib_per_gpu


def test_a_tied_embedding_is_one_frozen_matrix_under_lora():
    cfg = compose(["training=llama32/1b", "training.checkpoint.init_from=/checkpoints/base", *LORA_OVERRIDES])
    assert isinstance(cfg.peft, LoraConfig)
    tied = cfg.training.model
    assert tied.share_embeddings_and_output_weights
    untied = dataclasses.replace(tied, share_embeddings_and_output_weights=False)
    kwargs = dict(
        tp=1, pp=1, cp=1, dp=1, vp=None, stage_layers=[tied.num_layers], padded_vocab=tied.vocab_size,
        seq_length=8192, micro_batch_size=1, distributed_optimizer=True, grad_fp32=True, fp8_params=False,
        recompute=None, num_microbatches=1,
    )  # fmt: skip
    matrix = tied.vocab_size * tied.hidden_size

    def more(peft) -> float:
        """What untying adds: a second vocabulary x hidden matrix on the one stage."""
        return estimate_memory_gib(untied, **kwargs, peft=peft) - estimate_memory_gib(tied, **kwargs, peft=peft)  # type: ignore[arg-type]

    # Trained: its bf16 weight, fp32 gradient, fp32 main weight and Adam's m and v; frozen: its bf16 weight alone.
    assert more(None) == pytest.approx(matrix * (2 + 4 + 12) / GIB, abs=0.11)
    assert more(cfg.peft) == pytest.approx(matrix * 2 / GIB, abs=0.11)


def lora_warnings(*overrides: str) -> list[str]:
    cfg = compose(["cluster=bcm", "peft=lora", "peft.random_base=true", *overrides])
    found = Findings(dry_run=True)
    peft_checks.check(cfg, sizes_of(cfg), found)
    return [w for w in found.warnings if w.startswith("peft=lora keeps")]


def test_lora_on_a_pretraining_layout_names_the_models_lora_preset():
    (warning,) = lora_warnings("training=llama31/70b")
    assert "(64 GPUs, GBS 128)" in warning and "training=finetune/llama31_70b_lora " in warning
    # The preset itself, the 8B (its pretraining layout is its LoRA preset's), a layout the user names, and a model
    # with no LoRA preset: nothing to say.
    assert lora_warnings("training=finetune/llama31_70b_lora") == []
    assert lora_warnings("training=llama31/8b") == []
    assert lora_warnings("training=llama31/70b", "parallelism=tp4_cp2", "parallelism.num_gpus=8") == []
    assert lora_warnings("training=llama2/70b") == []
