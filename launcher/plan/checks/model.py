"""training.model: the architecture's sizes."""

from __future__ import annotations

from common.config import Config
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


def check(cfg: Config, sizes: Sizes, found: Findings) -> None:
    model = cfg.training.model
    if model.num_attention_heads % model.num_query_groups:
        found.problem(
            f"training.model.num_attention_heads={model.num_attention_heads} must be a multiple of "
            f"training.model.num_query_groups={model.num_query_groups}"
        )
