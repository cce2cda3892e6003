"""Stages (container, data_preparation, preflight, training, export, evaluation) in run order, and the jobs they
make, which the cluster's platform lays out (launcher/platforms/base.py: Platform.plan_stages). What the stages ask
of the platform is checked before (launcher/plan/checks/)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from common.config import Stage
from launcher.jobs.render import Job

# Execution order; `stages=[...]` picks a subset, dependencies follow this order.
STAGES = tuple(stage.name for stage in Stage)


@dataclass
class StagePlan:
    jobs: list[Job]
    command: str  # the training launch command (plan.command)
    notes: list[str] = field(default_factory=list)  # e.g. a stage skipped because its output exists


def stage_order(stages: Sequence[str]) -> list[str]:
    """cfg.stages in run order; a stage named twice stays twice, for the check that refuses it."""
    return [stage for stage in STAGES for _ in range(stages.count(stage))]
