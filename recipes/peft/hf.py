"""LoRA adapters as Hugging Face PEFT has them on a `LlamaForCausalLM`: one adapter per projection (q_proj, k_proj,
v_proj, o_proj, gate_proj, up_proj, down_proj), `lora_A.weight` [r, in] and `lora_B.weight` [out, r] each, under
`base_model.model.model.layers.<i>.<self_attn|mlp>.<proj>`. Our adapter of a fused layer stacks its projections'
A blocks (q, k, v; gate, up) and keeps B in the layer's row order (recipes/peft/lora.py), so B's rows split as the
layer's weight does (recipes/hf/mapping.py) and A's blocks in order: the mapping is one to one, both ways.

Torch only (no megatron-core, no distributed state): the exports (recipes/peft/export.py) and tests use it on whole,
unsharded tensors as a checkpoint stores them."""

from __future__ import annotations

from typing import Iterator, Mapping

import torch

from common.config import LoraConfig, LoraTarget, ModelConfig
from common.hf_config import hf_layer_name
from recipes.hf import mapping

PEFT_PREFIX = "base_model.model."
# Each target's Hugging Face modules, in the order of its A blocks and of megatron-core's rows.
HF_MODULES: dict[LoraTarget, tuple[str, ...]] = {
    LoraTarget.linear_qkv: ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    LoraTarget.linear_proj: ("self_attn.o_proj",),
    LoraTarget.linear_fc1: ("mlp.gate_proj", "mlp.up_proj"),
    LoraTarget.linear_fc2: ("mlp.down_proj",),
}
# The megatron-core weight each target adapts (recipes/hf/mapping.py's names, after decoder.layers.).
WEIGHTS: dict[LoraTarget, str] = {
    LoraTarget.linear_qkv: mapping.QKV,
    LoraTarget.linear_proj: mapping.PROJ,
    LoraTarget.linear_fc1: mapping.FC1,
    LoraTarget.linear_fc2: mapping.FC2,
}


def adapter_names(target: LoraTarget) -> tuple[str, str]:
    """The global (dist_checkpointing) names of the target's A and B, stacked over layers."""
    parent, name = WEIGHTS[target].rsplit(".", 1)[0].split(".")
    stem = f"{mapping.LAYER_PREFIX}{parent}.{name}_lora"
    return f"{stem}.a", f"{stem}.b"


def peft_modules(targets: list[LoraTarget]) -> list[str]:
    """adapter_config.json's target_modules: the projections' short names (q_proj, ...)."""
    return [module.rsplit(".", 1)[1] for target in targets for module in HF_MODULES[target]]


def peft_module(layer: int, module: str) -> str:
    """A projection's module name in a PeftModel's state dict, without the lora_A / lora_B part."""
    return PEFT_PREFIX + hf_layer_name(layer, module + ".weight").removesuffix(".weight")


def to_peft(
    target: LoraTarget, layer: int, a: torch.Tensor, b: torch.Tensor, model: ModelConfig
) -> dict[str, torch.Tensor]:
    """One layer's whole A [n r, in] and B [out, r] of `target` -> PEFT's lora_A / lora_B tensors (0-based layer)."""
    modules = HF_MODULES[target]
    if a.shape[0] % len(modules):
        raise ValueError(f"{target}: A has {a.shape[0]} rows, not {len(modules)} blocks of r")
    b_rows = mapping.split_to_hf(mapping.LAYER_PREFIX + WEIGHTS[target], layer, b, model)
    out = {}
    for module, a_block in zip(modules, a.chunk(len(modules))):
        name = peft_module(layer, module)
        out[f"{name}.lora_A.weight"] = a_block.contiguous()
        out[f"{name}.lora_B.weight"] = b_rows[hf_layer_name(layer, module + ".weight")].contiguous()
    return out


def from_peft(
    target: LoraTarget, layer: int, peft: Mapping[str, torch.Tensor], model: ModelConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """The inverse of to_peft: our whole A and B of one layer from PEFT's tensors."""
    modules = HF_MODULES[target]
    names = [peft_module(layer, module) for module in modules]
    a = torch.cat([peft[f"{name}.lora_A.weight"] for name in names])
    rows = {hf_layer_name(layer, m + ".weight"): peft[f"{n}.lora_B.weight"] for m, n in zip(modules, names)}
    b = mapping.join_from_hf(mapping.LAYER_PREFIX + WEIGHTS[target], layer, rows, model, model.vocab_size)
    return a, b


def deltas(
    layer: int, target: LoraTarget, a: torch.Tensor, b: torch.Tensor, model: ModelConfig, lora: LoraConfig
) -> Iterator[tuple[str, torch.Tensor]]:
    """(Hugging Face weight name, alpha / r * B_p A_p) of each projection: what merging adds to its weight (fp32)."""
    scale = lora.alpha / lora.rank
    peft = to_peft(target, layer, a, b, model)
    for module in HF_MODULES[target]:
        name = peft_module(layer, module)
        delta = scale * (peft[f"{name}.lora_B.weight"].float() @ peft[f"{name}.lora_A.weight"].float())
        yield hf_layer_name(layer, module + ".weight"), delta


def adapter_config(lora: LoraConfig, base: str) -> dict:
    """adapter_config.json for PEFT's LoraConfig: the same r, alpha, dropout and projections, no bias."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base,
        "r": lora.rank,
        "lora_alpha": lora.alpha,
        "lora_dropout": lora.dropout,
        "target_modules": peft_modules(list(lora.target_modules)),
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "init_lora_weights": True,
        "inference_mode": True,
    }
