"""Jobs as data, and the two renderings every platform builds on: a bash script for this machine, an sbatch script
for Slurm (launcher/platforms/ picks one, or renders its own)."""
from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from launcher.jobs.commands import REPO


@dataclass
class Job:
    stage: str            # container | data_preparation | data_check | preflight | training | export
    script: str           # file name in the run directory
    title: str            # one line for the script's header
    lines: list[str]      # the shell body, after the environment
    env: dict[str, str] = field(default_factory=dict)
    path_first: str | None = None   # a bin directory put first on PATH (local and bare-metal jobs)
    files: dict[str, str] = field(default_factory=dict)  # other files the job reads, written beside it
    # Resources (ignored when run on this machine).
    nodes: int = 1
    ntasks_per_node: int | None = 1
    gpus_per_node: int | None = None
    array_size: int | None = None   # one task per data shard
    max_parallel: int | None = None  # at most this many array tasks at once
    cpus_per_task: int | None = None
    exclusive: bool = False
    time_limit: str | None = None   # None: cluster.time_limit
    signal: str | None = None       # e.g. "USR1@300"
    followed: bool = False          # a later job of the chain waits for this one (set by the stage plan)


def _env_lines(job: Job) -> list[str]:
    lines = [f"export PYTHONPATH={shlex.quote(str(REPO))}${{PYTHONPATH:+:$PYTHONPATH}}"]
    if job.path_first:
        lines.append(f"export PATH={shlex.quote(job.path_first)}:$PATH")
    lines += [f"export {key}={shlex.quote(value)}" for key, value in job.env.items()]
    return lines


# tee that outlives Ctrl-C and SIGTERM: the trainer saves a checkpoint after either and its last lines must
# still reach the console and the log.
KEEP_LOG = "keep_log() { trap '' INT TERM; exec tee \"$@\"; }"


def tee(cmd: str, log: Path | str, append: bool = True) -> str:
    """Output to the console (or job log) and into the run directory's log, through KEEP_LOG's `keep_log`."""
    return f"{cmd} 2>&1 | keep_log {'-a ' if append else ''}{shlex.quote(str(log))}"


def render_local(job: Job, run_dir: Path) -> str:
    return "\n".join([
        "#!/usr/bin/env bash",
        f"# {job.title}",
        f"# Written by main.py for {run_dir.name}; run it again with: bash {shlex.quote(str(run_dir / job.script))}",
        "set -euo pipefail",
        KEEP_LOG,
        f"cd {shlex.quote(str(REPO))}",
        *_env_lines(job),
        "",
        *job.lines,
        "",
    ])


def render_sbatch(job: Job, cluster: Mapping[str, Any], run_dir: Path) -> str:
    """#SBATCH header from the job's resources and the cluster's settings; logs go to RUN_DIR/logs/."""
    log = f"{run_dir}/logs/{job.stage}_" + ("%A_%a" if job.array_size else "%j")
    prefix = cluster.get("job_name_prefix")
    directives = [f"--job-name={prefix + ':' if prefix else ''}{job.stage}:{run_dir.name}",
                  f"--nodes={job.nodes}"]
    if job.ntasks_per_node:
        directives.append(f"--ntasks-per-node={job.ntasks_per_node}")
    if job.gpus_per_node:
        directives.append(f"--gpus-per-node={job.gpus_per_node}")
    if job.cpus_per_task:
        directives.append(f"--cpus-per-task={job.cpus_per_task}")
    if job.array_size:
        limit = f"%{job.max_parallel}" if job.max_parallel else ""
        directives.append(f"--array=0-{job.array_size - 1}{limit}")
    directives.append(f"--time={job.time_limit or cluster['time_limit']}")
    for key in ("partition", "account"):
        if cluster.get(key):
            directives.append(f"--{key}={cluster[key]}")
    if job.exclusive:
        directives += ["--exclusive", "--mem=0"]
    directives += [f"--output={log}.out", f"--error={log}.err"]
    if job.signal:
        # Without "B:" Slurm signals the job steps (every rank), which is where the trainer listens.
        directives.append(f"--signal={job.signal}")
    # A job whose afterok dependency failed would otherwise wait in the queue forever.
    directives.append("--kill-on-invalid-dep=yes")
    directives += [str(arg) for arg in cluster.get("sbatch_args") or []]
    return "\n".join([
        "#!/bin/bash",
        f"# {job.title}",
        f"# Written by main.py for {run_dir.name}; submit it again with: sbatch {shlex.quote(str(run_dir / job.script))}",
        *[f"#SBATCH {d}" for d in directives],
        "set -euo pipefail",
        *_env_lines(job),
        "",
        *job.lines,
        "",
    ])
