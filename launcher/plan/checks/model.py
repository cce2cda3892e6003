"""training.model: the architecture's sizes, and what megatron-core and the Hugging Face form can build of it."""

from __future__ import annotations

from common import hf_config
from common.config import Config, ModelConfig, Stage
from launcher.plan.findings import Findings
from launcher.plan.sizes import Sizes

# megatron-core's Llama 3 RoPE scaling takes only the factor (GPTModel's rope_scaling_factor) and fixes the rest
# (RotaryEmbedding._apply_scaling's defaults; tests/recipes/test_recipes_cpu.py holds them to megatron-core's).
MEGATRON_ROPE_SCALING = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def check(cfg: Config, sizes: Sizes, found: Findings) -> None:
    model = cfg.training.model
    if model.num_attention_heads % model.num_query_groups:
        found.problem(
            f"training.model.num_attention_heads={model.num_attention_heads} must be a multiple of "
            f"training.model.num_query_groups={model.num_query_groups}"
        )
    for line in rope_scaling_problems(model):
        found.problem(line)
    for line in hugging_face_problems(cfg):
        found.problem(line)


def rope_scaling_problems(model: ModelConfig) -> list[str]:
    scaling = model.rope_scaling
    if scaling is None:
        return []
    return [
        f"training.model.rope_scaling.{key}={getattr(scaling, key)}: megatron-core's Llama 3 RoPE scaling fixes "
        f"{fixed}; set it to {fixed} (or training.model.rope_scaling=null for none)"
        for key, fixed in MEGATRON_ROPE_SCALING.items()
        if getattr(scaling, key) != fixed
    ]


def hugging_face_problems(cfg: Config) -> list[str]:
    """What the Hugging Face weights in (init_from_hf) and out (the export stage) cannot hold of training.model."""
    uses = [
        what
        for what, used in (
            (hf_config.KEY, cfg.training.checkpoint.init_from_hf),
            ("the export stage", Stage.export in cfg.stages),
        )
        if used
    ]
    if not uses:
        return []
    return [
        f"{problem}: the Hugging Face weights of {' and '.join(uses)} cannot hold it"
        for problem in hf_config.not_llama_problems(cfg.training.model)
    ]
