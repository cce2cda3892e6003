"""Every check of a config, by concern (launcher/plan/checks/), run before anything is written. validate checks every
value against its declared range first (checks/ranges.py), then collects every problem of every concern and raises
them together (PlanError, one line each); only then is the plan derived
(launcher/plan/build.py) and checked against the GPU's memory."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from common import hf_config
from common.config import Config, Stage
from common.plan import Plan
from launcher.jobs.rundir import default_run_name
from launcher.jobs.stages import stage_order
from launcher.plan.build import build_plan
from launcher.plan.checks import (
    batch,
    cluster,
    cuda_graphs,
    data,
    data_preparation,
    evaluation,
    init_weights,
    memory,
    mlperf,
    model,
    observability,
    optimizer,
    parallelism,
    peft,
    precision,
    ranges,
    resilience,
    run,
    run_dir,
    stages,
)
from launcher.plan.errors import PlanError
from launcher.plan.findings import Findings, PlatformChecks
from launcher.plan.hardware import LocalGpus
from launcher.plan.sizes import Sizes, sizes_of

Check = Callable[[Config, Sizes, Findings], None]

# What a layout decides: the auto-configurator runs these for every layout it tries.
LAYOUT_CHECKS: tuple[Check, ...] = (
    model.check,
    parallelism.check,
    batch.check,
    precision.check,
    cuda_graphs.check,
    cluster.check,
)
CHECKS: tuple[Check, ...] = (
    run.check,
    *LAYOUT_CHECKS,
    optimizer.check,
    data.check,
    data_preparation.check,
    init_weights.check,
    peft.check,
    stages.check,
    evaluation.check,
    observability.check,
    resilience.check,
    mlperf.check,
    run_dir.check,
)


@dataclass
class Validated:
    cfg: Config  # as normalized() made it: what config.yaml records
    plan: Plan
    warnings: list[str]


def normalized(cfg: Config) -> Config:
    """The config as every later step reads it: the architecture from Hugging Face where training.model.from_hf
    says so, stages in run order, results_dir absolute, the run named. Raises PlanError."""
    cfg = dataclasses.replace(
        with_hf_architecture(cfg),
        stages=[Stage(name) for name in stage_order(cfg.stages)],
        results_dir=str(Path(cfg.results_dir).expanduser().absolute()),
    )
    # The default name describes the run, stages included, so it is made from the config normalized so far.
    return dataclasses.replace(cfg, run_name=cfg.run_name or default_run_name(cfg))


def with_hf_architecture(cfg: Config) -> Config:
    """training.model.from_hf: its architecture keys from init_from_hf's config.json, read on this machine, so that
    config.yaml records them and every check sees them."""
    model, value = cfg.training.model, cfg.training.checkpoint.init_from_hf
    if not model.from_hf:
        return cfg
    if not value:
        raise PlanError(
            [f"training.model.from_hf=true needs {hf_config.KEY}: the checkpoint whose config.json gives the model"]
        )
    directory = hf_config.local_directory(value)
    if directory is None:
        where = (
            f"fetch it first (python -m recipes.hf.importer fetch {value})"
            if hf_config.is_hub_id(value)
            else "it is no directory here"
        )
        raise PlanError(
            [
                f"training.model.from_hf=true reads the config.json of {hf_config.KEY}={value} on this machine, and "
                f"{where}; or set the training.model keys and training.model.from_hf=false"
            ]
        )
    try:
        found = hf_config.model_from_config(hf_config.read_config(directory), model, value)
    except hf_config.HFConfigError as err:
        raise PlanError([str(err)]) from None
    return dataclasses.replace(cfg, training=dataclasses.replace(cfg.training, model=found))


def validate(
    cfg: Config,
    local_gpus: LocalGpus | None = None,
    checks: tuple[Check, ...] = CHECKS,
    ranges_checked: bool = False,
    platform: PlatformChecks | None = None,
) -> Validated:
    """The config normalized, the plan of it if every check accepts it, and the warnings found. Raises PlanError
    with every problem: first those of values out of their declared range (ranges_checked: the caller did that,
    as the auto-configurator does once for all the layouts it tries), then those of combinations. `platform` is
    the cluster's (launcher/platforms/registry.py: platform_of), for the checks of what it can run."""
    cfg = normalized(cfg)
    out_of_range = [] if ranges_checked else ranges.problems(cfg)
    if out_of_range:
        raise PlanError(out_of_range)
    sizes = sizes_of(cfg, local_gpus)
    found = Findings(dry_run=cfg.dry_run, platform=platform)
    for check in checks:
        check(cfg, sizes, found)
    if found.problems:
        raise PlanError(found.problems)
    plan = build_plan(cfg, local_gpus)
    memory.check(cfg, sizes, plan, found)
    if found.problems:
        raise PlanError(found.problems)
    return Validated(cfg, plan, found.warnings)
