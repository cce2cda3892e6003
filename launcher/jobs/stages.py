"""Stages (container, data_preparation, training) as jobs, in order, laid out by the cluster's platform
(launcher/platforms/). Validates what only the stages know (stage names, container paths, time limits) before
anything is written."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from common.plan import Plan
from launcher.jobs import commands
from launcher.jobs.nsys import nsys_entry
from launcher.jobs.render import Job
from launcher.plan.errors import PlanError
from launcher.platforms import Platform, containers, platform_of

# Execution order; `stages=[...]` picks a subset, dependencies follow this order.
STAGES = ("container", "data_preparation", "preflight", "training", "export")


@dataclass
class StagePlan:
    jobs: list[Job]
    command: str                                         # the training launch command (plan.command)
    notes: list[str] = field(default_factory=list)       # e.g. a stage skipped because its output exists
    warnings: list[str] = field(default_factory=list)    # would be errors outside a dry run


def list_data_shards(dp_cfg: Mapping[str, Any]) -> list[Any]:
    """data_prep.shards.list_shards, imported late: it lives in data_prep/ and only this stage needs it."""
    try:
        from data_prep.shards import list_shards
    except ImportError as err:
        raise PlanError([f"stages has data_preparation but data_prep.shards cannot be imported ({err})"]) from err
    try:
        return list(list_shards(dp_cfg))
    except (ValueError, KeyError, FileNotFoundError, OSError) as err:
        raise PlanError([f"data_preparation ({dp_cfg.get('name')}): {err}"]) from err


def selected_stages(cfg: Mapping[str, Any]) -> list[str]:
    """cfg.stages validated and in run order (a bare `stages=training` counts as a one-element list)."""
    stages = cfg.get("stages")
    if isinstance(stages, str):
        stages = [stages]
    if not stages:
        raise PlanError([f"stages is empty; pick from {', '.join(STAGES)} (default: [training])"])
    unknown = [s for s in stages if s not in STAGES]
    if unknown:
        raise PlanError([f"stages: unknown {', '.join(map(str, unknown))}; pick from {', '.join(STAGES)}"])
    return [s for s in STAGES if s in stages]


def _container_stage(cfg: Mapping[str, Any], platform: Platform, dry_run: bool) -> tuple[list[str], bool]:
    """(problems, build_needed) for stages=[container, ...]."""
    if platform.container_job is None:
        return [f"stages has container but cluster={cfg['cluster']['name']} runs images by name from a registry "
                "and builds none: build and push the image with docker (README: Images for NGC Base Command and "
                "Kubernetes), set cluster.container to its name and drop container from stages"], False
    return containers.build_problems(cfg, platform.client is None, dry_run)


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


def plan_stages(cfg: Mapping[str, Any], plan: Plan, run_dir: Path) -> StagePlan:
    """The jobs of cfg.stages (as selected_stages returned them), in order. Raises PlanError before anything is
    written."""
    selected = cfg["stages"]
    cluster = cfg["cluster"]
    dry_run = bool(cfg.get("dry_run"))
    platform = platform_of(cfg)
    problems, warnings = platform.problems(cfg, selected, dry_run)
    build_needed = False
    if "container" in selected:
        found, build_needed = _container_stage(cfg, platform, dry_run)
        problems += found
    problems += _unsupported(cfg, platform, selected)
    shards: list[Any] = []
    if "data_preparation" in selected and not problems:
        shards = list_data_shards(cfg["data_preparation"])
        if not shards:
            problems.append(f"data_preparation ({cfg['data_preparation'].get('name')}) has no shards to prepare")
    if problems:
        raise PlanError(problems)
    if {"data_preparation", "training"} <= set(selected) and cfg["training"]["data"].get("mock"):
        warnings.append("training.data.mock=true: training will not read the prepared data; set "
                        "training.data.mock=false and training.data.blend to the prepared prefixes "
                        "(python -m data_prep list --config RUN_DIR/config.yaml --prefixes)")

    jobs: list[Job] = []
    notes: list[str] = []
    if "container" in selected:
        if build_needed:
            jobs.append(platform.container_job(cfg, run_dir))
        else:
            notes.append(f"container: {cluster['container']} exists; nothing to build")
    if "data_preparation" in selected:
        jobs += platform.data_preparation_jobs(cfg, run_dir, len(shards))
    if "preflight" in selected:
        jobs.append(platform.preflight_job(cfg, plan, run_dir))
    # profile.tool=nsys: the profiled ranks run under nsys, found by the platform's rank variable.
    entry = commands.training_entry(run_dir)
    entry = nsys_entry(cfg, run_dir, entry, platform.rank_variable or "RANK") or entry
    training, command = platform.training_job(cfg, plan, run_dir, entry)
    if "training" in selected:
        jobs.append(training)
    if "export" in selected:
        jobs.append(platform.export_job(cfg, run_dir))
    for job in jobs[:-1]:
        job.followed = True
    return StagePlan(jobs=jobs, command=command, notes=notes, warnings=warnings)
