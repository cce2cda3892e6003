"""training.model: the architecture's sizes."""

from __future__ import annotations

from typing import Any, Mapping

from launcher.plan.findings import Findings
from launcher.plan.sizes import Sizes

POSITIVE = (
    "num_layers",
    "hidden_size",
    "ffn_hidden_size",
    "num_attention_heads",
    "num_query_groups",
    "kv_channels",
    "vocab_size",
    "make_vocab_size_divisible_by",
    "max_position_embeddings",
)


def check(cfg: Mapping[str, Any], sizes: Sizes, found: Findings) -> None:
    model = cfg["training"]["model"]
    ok = all([found.at_least(f"training.model.{key}", model[key], 1) for key in POSITIVE])
    if model["rotary_base"] <= 0 or model["rope_scaling_factor"] <= 0 or model["norm_epsilon"] <= 0:
        found.problem("training.model.rotary_base, rope_scaling_factor and norm_epsilon must be positive")
    if model["init_method_std"] <= 0:
        found.problem(f"training.model.init_method_std={model['init_method_std']} must be positive")
    if ok and model["num_attention_heads"] % model["num_query_groups"]:
        found.problem(
            f"training.model.num_attention_heads={model['num_attention_heads']} must be a multiple of "
            f"training.model.num_query_groups={model['num_query_groups']}"
        )
