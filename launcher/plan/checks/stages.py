"""The stages against the platform: what each platform can run (launcher/platforms/), the image the jobs run in or
the container stage builds, and data preparation having something to prepare."""

from __future__ import annotations

from common.config import Config
from launcher.plan.findings import Findings
from launcher.plan.sizes import Sizes


def check(cfg: Config, sizes: Sizes, found: Findings) -> None:
    if found.platform is None:
        return
    # Its own problems, the image the container stage builds, and what the stages ask of the platform that it
    # cannot do, one line each (launcher/platforms/base.py: stage_problems).
    problems, warnings = found.platform.stage_problems(cfg, found.dry_run)
    for line in problems:
        found.problem(line)
    for line in warnings:
        found.warning(line)
