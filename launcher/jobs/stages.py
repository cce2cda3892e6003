"""Stages (container, data_preparation, preflight, training, export) as jobs, in order, laid out by the cluster's
platform (launcher/platforms/). What the stages ask of the platform is checked before (launcher/plan/checks/)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from common.plan import Plan
from data_prep.shards import list_shards
from common.config import Stage
from launcher.jobs.render import Job
from launcher.platforms import platform_of

# Execution order; `stages=[...]` picks a subset, dependencies follow this order.
STAGES = tuple(stage.name for stage in Stage)


@dataclass
class StagePlan:
    jobs: list[Job]
    command: str  # the training launch command (plan.command)
    notes: list[str] = field(default_factory=list)  # e.g. a stage skipped because its output exists


def stage_order(stages: list[str]) -> list[str]:
    """cfg.stages in run order; a stage named twice stays twice, for the check that refuses it."""
    return [stage for stage in STAGES for _ in range(stages.count(stage))]


def plan_stages(cfg: Mapping[str, Any], plan: Plan, run_dir: Path) -> StagePlan:
    """The jobs of cfg.stages, in order, for a config the checks accepted (launcher/plan/validate.py)."""
    selected = cfg["stages"]
    cluster = cfg["cluster"]
    platform = platform_of(cfg)
    jobs: list[Job] = []
    notes: list[str] = []
    if "container" in selected:
        if not Path(cluster["container"]).exists():
            jobs.append(platform.container_job(cfg, run_dir))
        else:
            notes.append(f"container: {cluster['container']} exists; nothing to build")
    if "data_preparation" in selected:
        jobs += platform.data_preparation_jobs(cfg, run_dir, len(list_shards(cfg["data_preparation"])))
    if "preflight" in selected:
        jobs.append(platform.preflight_job(cfg, plan, run_dir))
    # Built whatever the stages: plan.command records how training is launched.
    training, command = platform.training_job(cfg, plan, run_dir, platform.rank_entry(cfg, run_dir))
    if "training" in selected:
        jobs.append(training)
    if "export" in selected:
        jobs.append(platform.export_job(cfg, run_dir))
    for job in jobs[:-1]:
        job.followed = True
    return StagePlan(jobs=jobs, command=command, notes=notes)
