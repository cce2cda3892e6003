"""parallelism=auto: the layout search, the step-time model that ranks layouts, and the measured runs it is fit to."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from common.config import Config


def is_auto(cfg: Config) -> bool:
    """Whether the config searches its layout. Here rather than in search.py: main.py asks it of every run, and the
    search (with its step-time model and measured runs) then loads for the runs that search only."""
    return cfg.parallelism.auto is not None
