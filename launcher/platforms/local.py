"""cluster=local: the stages as bash scripts run one after another on this machine; training with torchrun over
its GPUs, with the Python that runs main.py."""
from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any, Mapping

from common.plan import Plan
from launcher.jobs import commands
from launcher.jobs.commands import REPORT_FALLBACK, bare_path
from launcher.jobs.render import Job, render_local, tee
from launcher.platforms import Platform, containers
from launcher.platforms.common import export_title, gpus, preflight_title


def script_name(stage: str) -> str:
    return "launch.sh" if stage == "training" else f"{stage}.sh"


def problems(cfg: Mapping[str, Any], selected: list[str], dry_run: bool) -> tuple[list[str], list[str]]:
    # Jobs here never run in a container; only the container stage reads cluster.container.
    if "container" in selected:
        return containers.runtime_problems(cfg["cluster"], ("pyxis", "apptainer")), []
    return [], []


def container_job(cfg: Mapping[str, Any], run_dir: Path) -> Job:
    lines, files = containers.build_lines(cfg, run_dir)
    return Job("container", script_name("container"), containers.build_title(cfg["cluster"]) + " on this machine",
               lines, files=files)


def data_preparation_jobs(cfg: Mapping[str, Any], run_dir: Path, num_shards: int) -> list[Job]:
    name = cfg["data_preparation"].get("name")
    log = run_dir / "logs" / "data_preparation.log"
    check = shlex.join(commands.data_check_command(run_dir))
    return [Job("data_preparation", script_name("data_preparation"),
                f"Data preparation ({name}, {num_shards} shards) on this machine, then a check of every shard",
                [tee(commands.data_prep_command(run_dir), log), tee(check, log)],
                path_first=bare_path(cfg["cluster"]))]


def training_job(cfg: Mapping[str, Any], plan: Plan, run_dir: Path, entry: list[str]) -> tuple[Job, str]:
    """The stack check, then torchrun over this machine's GPUs; the job ends with the report."""
    command = shlex.join(commands.torchrun_command(plan.num_gpus, run_dir, entry))
    report = shlex.join(commands.report_command(run_dir))
    log = run_dir / "logs" / "training.log"
    lines = ["# The training stack (conf/stack.yaml) first: one line and exit status 2 on a mismatch.",
             tee(shlex.join(commands.stack_check_command(run_dir)), log),
             tee(command, log),
             "# The throughput / MFU table and the loss and step-time plot of this run.",
             tee(report, run_dir / "logs" / "report.txt", append=False) + REPORT_FALLBACK]
    return Job("training", script_name("training"),
               f"Train {plan.model} ({plan.dtype}) on {gpus(plan.num_gpus)} of this machine",
               lines, env=dict(plan.env), path_first=bare_path(cfg["cluster"])), command


def preflight_job(cfg: Mapping[str, Any], plan: Plan, run_dir: Path) -> Job:
    """torchrun over the training job's GPUs running recipes.preflight: a non-zero exit below
    preflight.min_busbw_gbps stops the stages before training."""
    command = shlex.join(commands.torchrun_command(plan.num_gpus, run_dir, commands.preflight_entry(run_dir)))
    return Job("preflight", script_name("preflight"), preflight_title(plan),
               [tee(command, run_dir / "logs" / "preflight.log")], env=dict(plan.env),
               path_first=bare_path(cfg["cluster"]))


def export_job(cfg: Mapping[str, Any], run_dir: Path) -> Job:
    export = shlex.join(commands.export_hf_command(cfg, run_dir))
    return Job("export", script_name("export"), export_title(run_dir), [tee(export, run_dir / "logs" / "export.log")],
               path_first=bare_path(cfg["cluster"]))


def render(job: Job, cfg: Mapping[str, Any], run_dir: Path) -> dict[str, str]:
    return {job.script: render_local(job, run_dir), **job.files}


PLATFORM = Platform(
    name="local", client=None, chain="one after another on this machine", script_name=script_name,
    problems=problems, data_preparation_jobs=data_preparation_jobs, training_job=training_job, render=render,
    container_job=container_job, export_job=export_job, preflight_job=preflight_job,
    rank_variable="RANK",  # torchrun's
)
