"""The stages against the platform: what each platform can run (launcher/platforms/), the image the jobs run in or
the container stage builds, and data preparation having something to prepare."""

from __future__ import annotations

from common.config import Config, Stage
from launcher.plan.findings import Findings
from launcher.plan.sizes import Sizes
from launcher.platforms import containers, platform_of


def check(cfg: Config, sizes: Sizes, found: Findings) -> None:
    selected = cfg.stages
    platform = platform_of(cfg)
    problems, warnings = platform.problems(cfg, selected, found.dry_run)
    if Stage.container in selected and platform.supports("container"):
        problems += containers.build_problems(cfg, platform.runs_here, found.dry_run)[0]
    # What the stages ask of the platform that it cannot do, one line each (launcher/platforms/base.py).
    problems += platform.refusals(cfg, selected)
    for line in problems:
        found.problem(line)
    for line in warnings:
        found.warning(line)
