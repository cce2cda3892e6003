"""The plan: every size the job needs, derived once from a resolved config the checks accepted
(launcher/plan/validate.py). The recipes read plan.json and never re-derive these numbers."""

from __future__ import annotations

from functools import partial
from typing import Any, Mapping

from common.plan import Plan
from launcher.plan.env import training_env
from launcher.plan.formulas import (
    layer_parameters,
    layers_per_pipeline_stage,
    model_flops_per_sample,
    padded_vocab_size,
)
from launcher.plan.hardware import LocalGpus
from launcher.plan.memory import estimate_memory_gib
from launcher.plan.sizes import Sizes, sizes_of

# parallelism.rank_order -> megatron-core's initialize_model_parallel(order=...): the first name varies fastest
# over consecutive ranks.
RANK_ORDERS = {"pp_last": "tp-cp-ep-dp-pp", "dp_last": "tp-cp-ep-pp-dp"}


def build_plan(cfg: Mapping[str, Any], local_gpus: LocalGpus | None = None) -> Plan:
    """Derive only: validate() runs the checks first, and this assumes they passed."""
    model, train, par, dtype = cfg["training"]["model"], cfg["training"], cfg["parallelism"], cfg["dtype"]
    sizes = sizes_of(cfg, local_gpus)
    tp, pp, cp, vp, dp = sizes.tp, sizes.pp, sizes.cp, sizes.vp, sizes.dp
    fp8, fp4 = dtype.get("fp8"), dtype.get("fp4")
    stage_layers = layers_per_pipeline_stage(model["num_layers"], pp, bool(par["asymmetric_pipeline"]))
    vocab = padded_vocab_size(model["vocab_size"], model["make_vocab_size_divisible_by"], tp)
    memory_of = partial(
        estimate_memory_gib,
        model,
        tp=tp,
        pp=pp,
        cp=cp,
        dp=dp,
        vp=vp,
        stage_layers=stage_layers,
        padded_vocab=vocab,
        seq_length=train["seq_length"],
        micro_batch_size=sizes.micro_batch_size,
        distributed_optimizer=par["use_distributed_optimizer"],
        grad_fp32=par["grad_reduce_in_fp32"],
        recompute=par.get("recompute_granularity"),
    )
    fp8_param_gather = resolve_fp8_param_gather(cfg, sizes, lambda: memory_of(fp8_params=False))
    memory = memory_of(fp8_params=fp8_param_gather)
    spec = sizes.spec
    kind = "fp4" if fp4 else "fp8" if fp8 else "bf16"
    peak = (
        None
        if spec is None
        else {"fp4": spec.fp4_peak_flops, "fp8": spec.fp8_peak_flops, "bf16": spec.bf16_peak_flops}[kind]
    )
    return Plan(
        model=train["name"],
        dtype=dtype["name"],
        num_gpus=sizes.num_gpus,
        num_nodes=sizes.num_nodes,
        gpus_per_node=sizes.gpus_per_node,
        tp=tp,
        pp=pp,
        cp=cp,
        vp=vp,
        dp=dp,
        sequence_parallel=bool(par["sequence_parallel"]),
        micro_batch_size=sizes.micro_batch_size,
        global_batch_size=sizes.global_batch_size,
        num_microbatches=sizes.num_microbatches,
        seq_length=train["seq_length"],
        layers_per_pipeline_stage=stage_layers,
        asymmetric_pipeline=bool(par["asymmetric_pipeline"]),
        fp8=fp8,
        fp8_param_gather=fp8_param_gather,
        tp_comm_overlap=bool(par["tp_comm_overlap"]),
        model_flops_per_sample=model_flops_per_sample(model, train["seq_length"]),
        est_memory_gib_per_gpu=memory,
        padded_vocab_size=vocab,
        num_parameters=model["num_layers"] * layer_parameters(model)
        + 2 * model["vocab_size"] * model["hidden_size"]
        + model["hidden_size"],
        gpu_type=sizes.gpu_type,
        peak_flops_per_gpu=peak,
        peak_flops_kind=kind,
        rank_order=RANK_ORDERS[par.get("rank_order") or "pp_last"],
        cuda_graphs=train.get("cuda_graphs") or "none",
        env=training_env(par, cfg["cluster"], train),
        cannot_train_reason=sizes.cannot_train_reason,
    )


def resolve_fp8_param_gather(cfg: Mapping[str, Any], sizes: Sizes, memory_without) -> bool:
    """What dtype.fp8_param_gather means for this layout: the user's true or false; for null, on where the
    distributed optimizer shards over several data-parallel x context-parallel ranks (its all-gather then moves
    FP8 bytes: NVIDIA's reference setting), and with one shard only where bf16 weights would not fit the GPU
    (`memory_without()`: the estimate without FP8 weights, GiB). With one shard there is no all-gather to shrink,
    and FP8 weights cost a cast and transpose of every weight each step."""
    dtype, par = cfg["dtype"], cfg["parallelism"]
    chosen = dtype.get("fp8_param_gather")
    if chosen is not None:
        return bool(chosen)
    if not dtype.get("fp8") or not par["use_distributed_optimizer"]:
        return False
    if (sizes.dp or 1) * (sizes.cp or 1) > 1:
        return True
    return sizes.spec is not None and memory_without() > sizes.spec.memory_gib
