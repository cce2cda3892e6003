"""The stages against the platform: what each platform can run (launcher/platforms/), the image the jobs run in or
the container stage builds, and data preparation having something to prepare."""
from __future__ import annotations

from typing import Any, Mapping

from launcher.plan.findings import Findings
from launcher.plan.sizes import Sizes
from launcher.platforms import Platform, containers, platform_of


def check(cfg: Mapping[str, Any], sizes: Sizes, found: Findings) -> None:
    selected = cfg["stages"]
    platform = platform_of(cfg)
    problems, warnings = platform.problems(cfg, selected, found.dry_run)
    if "container" in selected:
        problems += container_stage_problems(cfg, platform, found.dry_run)
    problems += _unsupported(cfg, platform, selected)
    for line in problems:
        found.problem(line)
    for line in warnings:
        found.warning(line)


def container_stage_problems(cfg: Mapping[str, Any], platform: Platform, dry_run: bool) -> list[str]:
    if platform.container_job is None:
        return [f"stages has container but cluster={cfg['cluster']['name']} runs images by name from a registry "
                "and builds none: build and push the image with docker (README: Images for NGC Base Command and "
                "Kubernetes), set cluster.container to its name and drop container from stages"]
    return containers.build_problems(cfg, platform.client is None, dry_run)[0]


def _unsupported(cfg: Mapping[str, Any], platform: Platform, selected: list[str]) -> list[str]:
    """What the stages ask of a platform that it cannot do yet."""
    name = cfg["cluster"]["name"]
    problems = []
    if "export" in selected and platform.export_job is None:
        problems.append(f"stages has export but cluster={name} has no export job yet: drop export from stages and "
                        "run `python -m recipes.hf.exporter --checkpoint RUN_DIR/checkpoints --out DIR` where the "
                        "checkpoint is")
    if "preflight" in selected and platform.preflight_job is None:
        problems.append(f"stages has preflight but cluster={name} has no preflight job yet: drop preflight from "
                        "stages, or run it on cluster=local or a Slurm cluster")
    profile = cfg.get("profile") or {}
    if profile.get("enabled") and profile.get("tool") == "nsys" and platform.rank_variable is None:
        problems.append(f"profile.tool=nsys cannot wrap the profiled ranks on cluster={name} yet: use "
                        "profile.tool=torch")
    return problems
