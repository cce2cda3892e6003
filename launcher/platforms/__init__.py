"""Platforms: where the stage jobs run. A platform is a `cluster` config (its `platform` key picks one here) plus
the functions that lay out, render and submit the same stage jobs; the plan and the stage commands
(launcher/jobs/commands.py) are shared by all of them."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

from common.plan import Plan
from launcher.jobs.render import Job
from launcher.jobs.submit import Submitted
from launcher.plan.errors import PlanError

Say = Callable[[str], None]
Cfg = Mapping[str, Any]


@dataclass(frozen=True)
class Platform:
    name: str
    # The command that submits jobs; None: the jobs run on this machine, one after another.
    client: Optional[str]
    # How each submitted job waits for the one before it (the dry run says it before the chain).
    chain: str
    script_name: Callable[[str], str]
    # (problems, warnings) only this platform knows about, before anything is written.
    problems: Callable[[Cfg, list[str], bool], tuple[list[str], list[str]]]
    data_preparation_jobs: Callable[[Cfg, Path, int], list[Job]]
    # The training job and its launch command (plan.command); the last argument is what every rank runs (the
    # training entry, or a wrapper of it such as nsys around the profiled ranks).
    training_job: Callable[[Cfg, Plan, Path, list[str]], tuple[Job, str]]
    # File name -> text; the job's own script (job.script) first.
    render: Callable[[Job, Cfg, Path], dict[str, str]]
    # The job that builds cluster.container; None where images run by name from a registry.
    container_job: Optional[Callable[[Cfg, Path], Job]] = None
    submit: Optional[Callable[[list[Job], Path, Cfg, Say], list[Submitted]]] = None
    # What submit runs, as shell lines (the dry run prints them; they also submit by hand).
    chain_as_shell: Optional[Callable[[list[Job], Path, Cfg], list[str]]] = None
    # Lines printed after submitting: where the logs go and how to follow the jobs.
    follow: Optional[Callable[[list[Job], list[Submitted], Path], list[str]]] = None
    # One process on one node exporting the run's newest checkpoint to Hugging Face format; None where the
    # platform has none yet.
    export_job: Optional[Callable[[Cfg, Path], Job]] = None
    # The network preflight in the training job's shape; None where the platform has none yet.
    preflight_job: Optional[Callable[[Cfg, Plan, Path], Job]] = None
    # The variable holding a rank's global number, which the nsys wrapper reads (profile.tool=nsys); None where
    # the platform cannot wrap ranks yet.
    rank_variable: Optional[str] = None


def _registry() -> dict[str, Platform]:
    from launcher.platforms import bcp, k8s, local, sge, slurm

    return {p.name: p for p in (local.PLATFORM, slurm.PLATFORM, sge.PLATFORM, bcp.PLATFORM, k8s.PLATFORM)}


def platform_of(cfg: Cfg) -> Platform:
    """The one place a platform is chosen: cfg.cluster.platform."""
    platforms = _registry()
    name = cfg["cluster"].get("platform")
    if name not in platforms:
        raise PlanError([f"cluster.platform={name!r}: use one of {', '.join(platforms)} (conf/cluster/*.yaml)"])
    return platforms[name]
