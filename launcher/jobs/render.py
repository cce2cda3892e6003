"""Jobs as data (each platform in launcher/platforms/ lays them out and renders their files), and the log tee
the scripts that run here or on Base Command share."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Job:
    stage: str  # container | data_preparation | data_check | preflight | training | export | eval_loss | evaluation
    script: str  # file name in the run directory
    title: str  # one line for the script's header
    lines: list[str]  # the shell body, after the environment
    env: dict[str, str] = field(default_factory=dict)
    path_first: str | None = None  # a bin directory put first on PATH (local and bare-metal jobs)
    files: dict[str, str] = field(default_factory=dict)  # other files the job reads, written beside it
    # Resources (ignored when run on this machine).
    nodes: int = 1
    ntasks_per_node: int | None = 1
    gpus_per_node: int | None = None
    array_size: int | None = None  # one task per data shard
    max_parallel: int | None = None  # at most this many array tasks at once
    cpus_per_task: int | None = None
    exclusive: bool = False
    time_limit: str | None = None  # None: cluster.time_limit
    signal: str | None = None  # e.g. "USR1@300"
    followed: bool = False  # a later job of the chain waits for this one (set by the stage plan)
    # Submitted this many more times (resilience.job_restarts), each copy queued to start once the one before it
    # ended, however it ended; each copy asks common/job_chain.py first whether it still has work.
    restarts: int = 0


# tee that outlives Ctrl-C and SIGTERM: the trainer saves a checkpoint after either and its last lines must
# still reach the console and the log.
KEEP_LOG = "keep_log() { trap '' INT TERM; exec tee \"$@\"; }"


def tee(cmd: str, log: Path | str, append: bool = True) -> str:
    """Output to the console (or job log) and into the run directory's log, through KEEP_LOG's `keep_log`."""
    return f"{cmd} 2>&1 | keep_log {'-a ' if append else ''}{shlex.quote(str(log))}"
