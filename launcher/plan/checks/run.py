"""The run as a whole: its name and results_dir (they become paths and appear in job scripts), the seed, the stages,
and keys no config group declares."""

from __future__ import annotations

import os
import re
from pathlib import Path

from common.config import Config, Stage
from launcher.plan.findings import Findings
from launcher.plan.sizes import Sizes

# Letters, digits and . _ = + - : safe in paths, unquoted in shells, and in Slurm / Grid Engine job names.
RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._=+-]*")
# Paths scheduler directives name (log files): what #SBATCH and #$ lines take unquoted.
BATCH_PATH = re.compile(r"[A-Za-z0-9/._=+,@%:-]+")
MAX_RUN_NAME = 200  # file names stop at 255 bytes; the name also goes into job and log names


def check(cfg: Config, sizes: Sizes, found: Findings) -> None:
    name = cfg.run_name
    assert name is not None  # normalized() names the run before the checks run
    problem = run_name_problem(name)
    if problem:
        found.problem(problem)
    results = Path(cfg.results_dir).expanduser()
    problem = directory_problem(results)
    if problem:
        found.problem(f"results_dir={cfg.results_dir} {problem}")
    if not cfg.cluster.runs_here and not BATCH_PATH.fullmatch(str(results)):
        found.problem(
            f"results_dir={cfg.results_dir!r} has a space, quote or other character that #SBATCH and "
            "#$ lines cannot carry in log paths; choose a path of letters, digits and / . _ - + = only"
        )
    _stages(cfg.stages, found)


def run_name_problem(name: str) -> str | None:
    if not RUN_NAME.fullmatch(name) or ".." in name:
        return (
            f"run_name={name!r}: use letters, digits and . _ = + - only (no /, .., spaces or quotes): it "
            "becomes a directory and appears in job scripts"
        )
    if len(name) > MAX_RUN_NAME:
        return f"run_name is {len(name)} characters long; keep it to {MAX_RUN_NAME}"
    return None


def directory_problem(path: Path) -> str | None:
    """Why a run directory cannot be made under `path`, or None."""
    if path.exists():
        if not path.is_dir():
            return "is a file, not a directory: choose a directory"
        return None if os.access(path, os.W_OK | os.X_OK) else "is not writable here"
    parent = next((p for p in path.parents if p.exists()), None)
    if parent is None or not parent.is_dir():
        return f"cannot be created: {parent} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK) or _read_only(parent):
        return f"cannot be created: {parent} is not writable"
    return None


def _read_only(path: Path) -> bool:
    """A mount the kernel keeps read-only or virtual (/proc, /sys), where even root cannot create directories."""
    try:
        flags = os.statvfs(path).f_flag
    except OSError:
        return True
    return bool(flags & os.ST_RDONLY) or str(path).startswith(("/proc", "/sys"))


def _stages(stages: list[Stage], found: Findings) -> None:
    if not stages:
        found.problem(f"stages is empty; pick from {', '.join(s.name for s in Stage)} (default: [training])")
    twice = sorted({s for s in stages if stages.count(s) > 1})
    if twice:
        found.problem(
            f"stages names {', '.join(twice)} more than once; each stage runs once, in the order "
            f"{', '.join(s.name for s in Stage)}"
        )
