"""What `python main.py ...` does: plan and validate (nothing written on error), write the run directory, then
submit (a cluster platform), run here (cluster=local), or stop there (dry_run=true)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import yaml
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from hydra.types import RunMode
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from common import run_events
from common.checkpoints import latest_checkpoint
from common.config import Config, load_config
from common.typed import TypedConfigError
from common.plan import Plan
from launcher.autoconf import is_auto
from launcher.config import sweep
from launcher.config.compose import Bases, compose, default_layout_of, hydra_state_kept, search_path, to_plain
from launcher.jobs.rundir import record_jobs, run_dir_of, write_run_dir
from launcher.jobs.stages import StagePlan
from launcher.jobs.submit import SubmitError, run_here
from launcher.plan.errors import PlanError
from launcher.plan.hardware import LocalGpus, detect_local_gpus
from launcher.plan.table import format_plan
from launcher.plan.validate import normalized, validate
from launcher.platforms.base import Platform
from launcher.platforms.registry import platform_of
from launcher.usage import config_dirs_of

Say = Callable[[str], None]


def _err(line: str) -> None:
    print(line, file=sys.stderr)


@dataclass
class Prepared:
    cfg: Config
    plan: Plan
    run_dir: Path
    stages: StagePlan
    warnings: list[str]
    platform: Platform[Any]  # cluster.platform's, which writes, runs or submits the jobs


def prepare(cfg: Config, local_gpus: LocalGpus | None = None) -> Prepared:
    """Everything derived and validated, nothing written. Raises PlanError."""
    platform = platform_of(cfg.cluster)
    if cfg.cluster.runs_here and local_gpus is None:
        local_gpus = detect_local_gpus()
    validated = validate(cfg, local_gpus, platform=platform)
    cfg, plan = validated.cfg, validated.plan
    run_dir = run_dir_of(cfg)
    stages = platform.plan_stages(cfg, plan, run_dir)
    plan.command = stages.command
    client = platform.client
    if client and not cfg.dry_run and stages.jobs and shutil.which(client) is None:
        raise PlanError(
            [
                f"cluster={cfg.cluster.name} submits with {client}, which is not on this machine's "
                "PATH: run where its client is installed and configured, or add dry_run=true to only "
                "write the jobs"
            ]
        )
    return Prepared(cfg, plan, run_dir, stages, validated.warnings, platform)


def launch(cfg: Config, local_gpus: LocalGpus | None = None, say: Say = print) -> int:
    """Returns the exit status for main.py."""
    try:
        prepared = prepare(cfg, local_gpus)
    except PlanError as err:
        for problem in err.problems:
            _err(f"error: {problem}")
        return 2
    return execute(prepared, say)


def execute(prepared: Prepared, say: Say = print) -> int:
    """Write the run directory, then stop (a dry run), run the jobs here or submit them. The exit status."""
    cfg, plan, run_dir, stages = prepared.cfg, prepared.plan, prepared.run_dir, prepared.stages
    platform = prepared.platform
    newest = latest_checkpoint(str(run_dir / "checkpoints"))
    try:
        written = write_run_dir(run_dir, cfg, plan, stages.jobs, platform)
    except OSError as err:
        _err(
            f"error: cannot write the run directory {run_dir}: {err.strerror or err}; set results_dir to a "
            "writable directory"
        )
        return 2

    if "training" in cfg.stages:
        say(f"Plan for {run_dir.name}")
        say(format_plan(plan, cfg))
    scripts = written.scripts
    say(f"Run directory: {run_dir}")
    say("  " + "  ".join(["config.yaml", "plan.json", *[p.name for p in scripts]]))
    if written.history:
        say(f"note: moved the earlier job files {', '.join(written.retired)} to {written.history}")
    if newest is not None:
        say(f"note: {_checkpoint_note(cfg, newest)}")
    for note in stages.notes:
        say(f"note: {note}")
    for warning in prepared.warnings:
        say(f"warning: {warning}")

    if cfg.dry_run:
        say("dry run: nothing was submitted or run. Job script" + ("s, in order:" if len(scripts) > 1 else ":"))
        for path in scripts:
            say(f"  {path}")
        chain = platform.chain_as_shell(stages.jobs, run_dir, cfg)
        if chain:
            more = cfg.resilience.job_restarts if "training" in cfg.stages else 0
            how = platform.chain + (
                f"; the training job's {more} more copies each once the one before it ended, however it ended"
                if more
                else ""
            )
            say(f"Submitting runs these, {how}:" if len(chain) > 1 else "Submitting runs:")
            for line in chain:
                say(f"  {line}")
        return 0
    if not stages.jobs:
        say("nothing to do for the selected stages")
        return 0
    if platform.runs_here:
        return _run_here(prepared, say)
    return _submit(prepared, say)


def _checkpoint_note(cfg: Config, newest: tuple[int, str]) -> str:
    """What the selected stages do with the run's checkpoints, naming the one they read."""
    which = f"{newest[1]} (step {newest[0]}), the newest complete checkpoint"
    if "training" not in cfg.stages:
        if "export" in cfg.stages:
            return f"the export reads {which}"
        if cfg.evaluation.blends and "evaluation" in cfg.stages:
            return f"evaluation.blends are evaluated from {which}"
        return f"this run directory has {which}"
    if not cfg.training.checkpoint.load:
        return f"training.checkpoint.load=false: training starts from scratch, not from {which}"
    return f"training resumes from {which}"


def _submit(prepared: Prepared, say: Say) -> int:
    run_dir, jobs, platform = prepared.run_dir, prepared.stages.jobs, prepared.platform
    chained = prepared.cfg.resilience.job_restarts
    if chained and "training" in prepared.cfg.stages:
        # Before the first job can start: each job of the chain counts the jobs since this record.
        run_events.record(str(run_dir), "chain", jobs=1 + chained)
    try:
        submitted = platform.submit(jobs, run_dir, prepared.cfg, say)
    except SubmitError as err:
        if err.submitted:
            record_jobs(run_dir, [s.as_dict() for s in err.submitted])
        _err(f"error: {err}")
        return 1
    record_jobs(run_dir, [s.as_dict() for s in submitted])
    for line in platform.follow(jobs, submitted, run_dir):
        say(line)
    return 0


def _run_here(prepared: Prepared, say: Say) -> int:
    plan, run_dir = prepared.plan, prepared.run_dir
    jobs = prepared.stages.jobs
    if plan.cannot_train_reason:  # the stages that need this machine's GPUs, and the export of what they train
        skipped = {"preflight", "training", "eval_loss", "evaluation"}
        if "training" in prepared.cfg.stages:
            skipped.add("export")
        jobs = [j for j in jobs if j.stage not in skipped]
    code = run_here(jobs, run_dir, say)
    if code:
        return code
    if plan.cannot_train_reason and any(j.stage == "training" for j in prepared.stages.jobs):
        say(f"did not train: {plan.cannot_train_reason}.")
        say(
            "  The plan and the launch script are in the run directory above. To train on a Slurm cluster: "
            "python main.py cluster=bcm cluster.partition=... cluster.account=... (add dry_run=true to write the "
            "sbatch script without submitting it; cluster=sge, cluster=bcp and cluster=k8s are the other "
            "platforms)."
        )
        return 0
    if plan.cannot_train_reason and any(j.stage in ("eval_loss", "evaluation") for j in prepared.stages.jobs):
        say(f"did not evaluate: {plan.cannot_train_reason}; the evaluation jobs are in the run directory above.")
        return 0
    if any(j.stage == "training" for j in jobs):
        say(f"done: log {run_dir / 'logs' / 'training.log'}, report {run_dir / 'logs' / 'report.txt'}")
    elif any(j.stage in ("eval_loss", "evaluation") for j in jobs):
        say(f"done: evaluation rows in {run_dir / 'evaluation'}; print them with python -m launcher.report {run_dir}")
    return 0


# --------------------------------------------------------------------------- Hydra entry
def _raised_in_omegaconf(err: BaseException) -> bool:
    frame = err.__traceback__
    while frame and frame.tb_next:
        frame = frame.tb_next
    return frame is not None and "omegaconf" in frame.tb_frame.f_code.co_filename


@contextlib.contextmanager
def one_line_errors():
    """A config that does not compose (a wrong type, an unknown key or option, a bad override) ends as one line per
    problem and exit status 2, like every other bad input, instead of Hydra's multi-line report. HYDRA_FULL_ERROR=1
    set by the user keeps Hydra's full traceback."""
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        yield
        return
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra then raises instead of printing its own report
    try:
        yield
    except (HydraException, OmegaConfBaseException, yaml.YAMLError) as err:
        # A YAML file that does not parse (in conf/ or a --config-dir) raises PyYAML's error through Hydra.
        from launcher.config.errors import every_error_line  # loaded when a config fails to compose only

        config_dirs = config_dirs_of(sys.argv[1:])
        for line in every_error_line(err, sweep.cli_overrides(sys.argv[1:]), config_dirs=config_dirs):
            _err(f"error: {line}")
        sys.exit(2)
    except AssertionError as err:
        if not _raised_in_omegaconf(err):
            raise
        # OmegaConf asserts when an override reaches into a section that is null in this config.
        _err(
            "error: an override sets a key inside a section this config does not have (parallelism.auto.* needs "
            "parallelism=auto, mlperf.* needs training=mlperf/...)"
        )
        sys.exit(2)
    finally:
        os.environ.pop("HYDRA_FULL_ERROR", None)


def plan_sweep(overrides: Sequence[str]) -> tuple[list[Prepared], list[str]]:
    """Every point of a sweep composed once, named and planned, nothing written: (the points, problems as lines
    naming the point, two points that would share a run directory among them)."""
    keys = sweep.swept_keys(overrides)
    points: list[Prepared] = []
    problems: list[str] = []
    seen: dict[Path, str] = {}
    bases: Bases = {}
    for point in sweep.sweep_points(overrides):
        label = " ".join(sweep.swept_items(point, keys)) or "(single point)"
        try:
            cfg = compose(point, bases)
            local_gpus = detect_local_gpus() if cfg.cluster.runs_here else None
            # the search prints its table once per sweep, for the first point that searches
            cfg = _layout_searched(point, cfg, local_gpus, say=None if points or problems else print)
            cfg = normalized(cfg)
            cfg = dataclasses.replace(cfg, run_name=f"{cfg.run_name}{sweep.run_name_suffix(point, keys)}")
            prepared = prepare(cfg, local_gpus)
        except (HydraException, OmegaConfBaseException) as err:
            from launcher.config.errors import error_lines  # loaded when a point fails to compose only

            problems += [f"sweep point {label}: {line}" for line in error_lines(err)]
            continue
        except TypedConfigError as err:
            problems.append(f"sweep point {label}: {err}")
            continue
        except PlanError as err:
            problems += [f"sweep point {label}: {p}" for p in err.problems]
            continue
        if prepared.run_dir in seen:
            problems.append(
                f"sweep points {seen[prepared.run_dir]} and {label} share the run directory "
                f"{prepared.run_dir}; set run_name per point"
            )
        seen[prepared.run_dir] = label
        points.append(prepared)
    return points, problems


def run_sweep(argv: Sequence[str]) -> int:
    """`python main.py -m a=1,2 b=x,y`: every point is composed and planned before the first is written or
    submitted, then each runs in turn as a single run would. Hydra's own multirun would compose every point three
    times (its check, the point's job, and this plan); the points are the same: Hydra's parser and basic sweeper
    expand them (launcher/config/sweep.py)."""
    points, problems = plan_sweep(sweep.cli_overrides(argv))
    if problems:
        for problem in problems:
            _err(f"error: {problem}")
        _err("error: nothing was written or submitted for any point of this sweep")
        return 2
    for prepared in points:
        code = execute(prepared)
        if code:
            return code
    return 0


def run_hydra_app(cfg: DictConfig) -> None:
    """main.py's single run through Hydra's app, for a command line with Hydra's own flags (--config-dir, --cfg,
    ...): the config it composed, typed."""
    hydra = HydraConfig.get()
    if hydra.mode == RunMode.MULTIRUN:
        _err("error: -m with Hydra's --config-path/--config-name/--config-dir is not supported; sweep without them")
        sys.exit(2)
    overrides = list(hydra.overrides.task)
    try:
        if default_layout_of(hydra.runtime.choices, cfg) is None:
            config = load_config(to_plain(cfg))
        else:  # composed again by compose(), which names that layout (with the --config-dir directories)
            with hydra_state_kept():
                config = compose([*overrides, *search_path(config_dirs_of(sys.argv[1:]))])
    except TypedConfigError as err:  # a value composition let through that the typed config refuses
        _err(f"error: {err}")
        sys.exit(2)
    except (HydraException, OmegaConfBaseException) as err:  # here, not in Hydra's app: it would add its own line
        from launcher.config.errors import error_lines  # loaded when a config fails to compose only

        for line in error_lines(err, config_dirs_of(sys.argv[1:])):
            _err(f"error: {line}")
        sys.exit(2)
    run(config, overrides)


def run_overrides(overrides: Sequence[str]) -> None:
    """main.py's single run for a command line of overrides alone: composed once here (Hydra's app composes the
    config twice, once to choose its mode and once to run), errors raised to one_line_errors as Hydra's are."""
    try:
        config = compose(overrides)
    except TypedConfigError as err:
        _err(f"error: {err}")
        sys.exit(2)
    run(config, list(overrides))


def run(config: Config, overrides: list[str]) -> None:
    """main.py's single run (a sweep goes through run_sweep) of the composed config and the overrides it came
    from (the auto-configurator names its pick by them)."""
    local_gpus = detect_local_gpus() if config.cluster.runs_here else None
    try:
        config = _layout_searched(overrides, config, local_gpus, say=print)
    except PlanError as err:
        for problem in err.problems:
            _err(f"error: {problem}")
        sys.exit(2)
    code = launch(config, local_gpus)
    if code:
        sys.exit(code)


def _layout_searched(overrides: Sequence[str], cfg: Config, local_gpus: LocalGpus | None, say: Say | None) -> Config:
    """parallelism=auto: the config of the layout the search picks (raises PlanError); any other config as it is.
    The search loads here, for the runs that search: a dry run of a named layout does without its import."""
    if not is_auto(cfg):
        return cfg
    from launcher.autoconf import search

    return search.resolve(overrides, cfg, local_gpus, say=say)
