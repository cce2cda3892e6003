"""Stages (container, data_preparation, training) as jobs: what each runs, on what resources, in which order.
Validates what only the stages know (stage names, container paths, Slurm time limits) before anything is
written."""
from __future__ import annotations

import re
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from launcher import commands
from launcher.plan import Plan, PlanError
from launcher.render import Job

# Execution order; `stages=[...]` picks a subset, dependencies follow this order.
STAGES = ("container", "data_preparation", "training", "export")


@dataclass
class StagePlan:
    jobs: list[Job]
    command: str                                         # the training launch command (plan.command)
    notes: list[str] = field(default_factory=list)       # e.g. a stage skipped because its output exists
    warnings: list[str] = field(default_factory=list)    # would be errors outside a dry run


def script_name(stage: str, local: bool) -> str:
    if stage == "training":
        return "launch.sh" if local else "submission.sbatch"
    return f"{stage}.sh" if local else f"{stage}.sbatch"


def slurm_time_seconds(value: Any) -> int | None:
    """Seconds in a Slurm time limit (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS); None for unlimited.
    Raises ValueError for anything sbatch would reject."""
    text = str(value).strip()
    if text.upper() in ("UNLIMITED", "INFINITE"):
        return None
    match = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text)
    if not match:
        raise ValueError(text)
    days, a, b, c = match.groups()
    if days is not None:  # D-HH[:MM[:SS]]
        return int(days) * 86400 + int(a) * 3600 + int(b or 0) * 60 + int(c or 0)
    if c is not None:     # HH:MM:SS
        return int(a) * 3600 + int(b) * 60 + int(c)
    return int(a) * 60 + int(b or 0)  # MM[:SS]


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


def _container_problems(cfg: Mapping[str, Any], selected: list[str], dry_run: bool
                        ) -> tuple[list[str], list[str], bool]:
    """(problems, warnings, import_needed) for cluster.container."""
    cluster = cfg["cluster"]
    image = cluster.get("container")
    local = cluster["name"] == "local"
    problems: list[str] = []
    warnings: list[str] = []
    is_sqsh = bool(image) and str(image).endswith(".sqsh")
    if "container" in selected:
        if not is_sqsh:
            problems.append(f"stages has container but cluster.container={image!r} is not a .sqsh path to import "
                            "into; set cluster.container=/abs/path/image.sqsh or drop container from stages")
        elif not str(image).startswith("/"):
            problems.append(f"cluster.container={image} must be an absolute path (pyxis and enroot resolve "
                            "relative paths on the compute node)")
        elif Path(image).exists():
            return problems, warnings, False
        elif local and not dry_run and shutil.which("enroot") is None:
            problems.append("stages has container with cluster=local but enroot is not installed here; install "
                            "enroot, or import on a compute node with cluster=bcm")
        return problems, warnings, not problems
    if local or not image:
        return problems, warnings, False
    if is_sqsh and not str(image).startswith("/"):
        problems.append(f"cluster.container={image} must be an absolute path (pyxis resolves relative paths on "
                        "the compute node)")
    elif is_sqsh and not Path(image).exists():
        msg = (f"cluster.container={image} does not exist: run `bash setup.sh`, add the container stage "
               "(stages=[container,training]), or set cluster.container to an existing image")
        (warnings if dry_run else problems).append(msg)
    return problems, warnings, False


def _time_problem(key: str, value: Any) -> str | None:
    try:
        slurm_time_seconds(value)
    except ValueError:
        return f"{key}={value!r} is not a Slurm time (HH:MM:SS, D-HH:MM:SS or minutes)"
    return None


def _cluster_problems(cfg: Mapping[str, Any], selected: list[str]) -> list[str]:
    cluster = cfg["cluster"]
    problem = _time_problem("cluster.time_limit", cluster["time_limit"])
    if problem:
        return [problem]
    limit = slurm_time_seconds(cluster["time_limit"])
    margin = cluster.get("signal_before_timeout_s") or 0
    if limit is not None and margin >= limit:
        return [f"cluster.signal_before_timeout_s={margin} must be shorter than cluster.time_limit="
                f"{cluster['time_limit']} ({limit} s)"]
    if "data_preparation" in selected:
        job = cfg["data_preparation"].get("job") or {}
        problem = job.get("time_limit") and _time_problem("data_preparation.job.time_limit", job["time_limit"])
        if problem:
            return [problem]
        for key in ("cpus_per_task", "max_parallel"):
            value = job.get(key)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                return [f"data_preparation.job.{key}={value!r} must be null or a positive integer"]
    return []


def _gpus(n: int) -> str:
    return f"{n} GPU" + ("s" if n != 1 else "")


def _tee(cmd: str, log: Path, append: bool = True) -> str:
    """Output to the console and into the run directory's log, through render.py's `keep_log`."""
    return f"{cmd} 2>&1 | keep_log {'-a ' if append else ''}{shlex.quote(str(log))}"


def _bare_path(cluster: Mapping[str, Any]) -> str | None:
    # Local and bare-metal jobs run with the Python that runs main.py; container jobs with the image's.
    return None if commands.in_container(cluster) else commands.python_bin_dir()


def _data_preparation_jobs(cfg: Mapping[str, Any], run_dir: Path, num_shards: int) -> list[Job]:
    cluster = cfg["cluster"]
    name = cfg["data_preparation"].get("name")
    check = shlex.join(commands.data_check_command(run_dir))
    if cluster["name"] == "local":
        log = run_dir / "logs" / "data_preparation.log"
        return [Job("data_preparation", script_name("data_preparation", True),
                    f"Data preparation ({name}, {num_shards} shards) on this machine, then a check of every shard",
                    [_tee(commands.data_prep_command(run_dir), log), _tee(check, log)],
                    path_first=_bare_path(cluster))]
    srun = commands.srun_prefix(cfg)
    prep = commands.data_prep_command(run_dir, shard='"$SLURM_ARRAY_TASK_ID"')
    job = cfg["data_preparation"].get("job") or {}
    array = f"0-{num_shards - 1}" + (f"%{job['max_parallel']}" if job.get("max_parallel") else "")
    cpus = job.get("cpus_per_task")
    return [
        Job("data_preparation", script_name("data_preparation", False),
            f"Data preparation ({name}): one array task per shard ({num_shards} shards)",
            [commands.shell_line(srun, prep)], path_first=_bare_path(cluster), array=array, cpus_per_task=cpus,
            # Tokenizer workers use every CPU they get: a whole node per task unless sized.
            exclusive=bool(cluster.get("exclusive")) and not cpus, time_limit=job.get("time_limit")),
        Job("data_check", script_name("data_check", False),
            f"Check every prepared shard ({num_shards}) before training starts",
            [commands.shell_line(srun, check)], path_first=_bare_path(cluster), time_limit=job.get("time_limit")),
    ]


def _training_job(cfg: Mapping[str, Any], plan: Plan, run_dir: Path) -> tuple[Job, str]:
    """The training job and its launch command (plan.command); the job ends with the report."""
    cluster = cfg["cluster"]
    report = shlex.join(commands.report_command(run_dir))
    if cluster["name"] == "local":
        command = shlex.join(commands.torchrun_command(plan.num_gpus, run_dir))
        lines = [_tee(command, run_dir / "logs" / "training.log"),
                 "# The throughput / MFU table and the loss and step-time plot of this run.",
                 _tee(report, run_dir / "logs" / "report.txt", append=False)
                 + " || echo 'report: nothing to report (see above)'"]
        return Job("training", script_name("training", True),
                   f"Train {plan.model} ({plan.dtype}) on {_gpus(plan.num_gpus)} of this machine",
                   lines, env=dict(plan.env), path_first=_bare_path(cluster)), command

    srun = commands.srun_prefix(cfg, env_keys=[*plan.env, "MASTER_ADDR", "MASTER_PORT"],
                                mpi=plan.tp_comm_overlap, extra=["--kill-on-bad-exit=1"])
    entry = shlex.join(commands.training_entry(run_dir))
    report_srun = commands.srun_prefix(cfg, extra=["--nodes=1", "--ntasks=1"])
    lines = [
        "# torch.distributed rendezvous on the first node; the port follows the job id so that jobs sharing",
        "# a node never collide. Ranks come from SLURM_PROCID / SLURM_LOCALID / SLURM_NTASKS.",
        'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "export MASTER_PORT=$((20000 + SLURM_JOB_ID % 40000))",
        commands.shell_line(srun, entry),
        "# The throughput / MFU table (into this log) and the loss and step-time plot (into the run directory).",
        commands.shell_line(report_srun, report) + " || echo 'report: nothing to report (see above)'",
    ]
    margin = cluster.get("signal_before_timeout_s")
    job = Job("training", script_name("training", False),
              f"Train {plan.model} ({plan.dtype}) on {_gpus(plan.num_gpus)}: {plan.num_nodes} node"
              f"{'s' if plan.num_nodes > 1 else ''} x {plan.gpus_per_node}, one task per GPU",
              lines, env=dict(plan.env), path_first=_bare_path(cluster), nodes=plan.num_nodes,
              ntasks_per_node=plan.gpus_per_node,
              gpus_per_node=plan.gpus_per_node if cluster.get("gpus_per_node") else None,
              exclusive=bool(cluster.get("exclusive")), signal=f"USR1@{margin}" if margin else None)
    return job, f"{shlex.join(srun)} {entry}"


def _export_job(cfg: Mapping[str, Any], run_dir: Path) -> Job:
    """The run's newest complete checkpoint to Hugging Face format: one process on one node (CPU work, next to
    the checkpoint)."""
    cluster = cfg["cluster"]
    export = shlex.join(commands.export_hf_command(cfg, run_dir))
    title = f"Export the newest checkpoint of {run_dir.name} to Hugging Face format"
    if cluster["name"] == "local":
        return Job("export", script_name("export", True), title, [_tee(export, run_dir / "logs" / "export.log")],
                   path_first=_bare_path(cluster))
    srun = commands.srun_prefix(cfg, extra=["--nodes=1", "--ntasks=1"])
    return Job("export", script_name("export", False), title, [commands.shell_line(srun, export)],
               path_first=_bare_path(cluster), exclusive=bool(cluster.get("exclusive")))


def plan_stages(cfg: Mapping[str, Any], plan: Plan, run_dir: Path) -> StagePlan:
    """The jobs of cfg.stages (as selected_stages returned them), in order. Raises PlanError before anything is
    written."""
    selected = cfg["stages"]
    cluster = cfg["cluster"]
    problems, warnings, import_needed = _container_problems(cfg, selected, bool(cfg.get("dry_run")))
    if cluster["name"] != "local":
        problems += _cluster_problems(cfg, selected)
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
        if import_needed:
            jobs.append(Job("container", script_name("container", cluster["name"] == "local"),
                            f"Import {cluster['container_source']} into {cluster['container']}",
                            commands.enroot_import_lines(cluster["container"], cluster["container_source"])))
        else:
            notes.append(f"container: {cluster['container']} exists; nothing to import")
    if "data_preparation" in selected:
        jobs += _data_preparation_jobs(cfg, run_dir, len(shards))
    training, command = _training_job(cfg, plan, run_dir)
    if "training" in selected:
        jobs.append(training)
    if "export" in selected:
        jobs.append(_export_job(cfg, run_dir))
    return StagePlan(jobs=jobs, command=command, notes=notes, warnings=warnings)
