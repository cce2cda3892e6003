"""A run directory as typed objects, read once: config.yaml (the resolved config the launcher wrote) into
common.config's dataclasses and plan.json into common.plan.Plan. The ranks, the preflight, the stack check and the
export read a run through here; each error is one line naming the file and the fix."""

from __future__ import annotations

from dataclasses import dataclass
import os

import yaml

from common.config import Config, load_config
from common.plan import Plan, PlanFileError, load_plan
from common.typed import TypedConfigError

CONFIG_FILE = "config.yaml"


def trace_path(run_dir: str, rank: int, first: int, last: int) -> str:
    """Where profile.tool=torch writes rank `rank`'s trace of steps first..last; *.pt.trace.json.gz is the name
    TensorBoard's profiler plugin looks for."""
    return os.path.join(run_dir, "profile", f"rank{rank}_steps{first}-{last}.pt.trace.json.gz")


class RunDirError(ValueError):
    """A run directory this version cannot read; str() is one line."""


@dataclass
class Run:
    config: Config
    plan: Plan


def load_run_config(path: str | os.PathLike) -> Config:
    """A resolved config.yaml (a run directory's, or its path) as the typed Config."""
    if os.path.isdir(path):
        path = os.path.join(path, CONFIG_FILE)
    try:
        with open(path) as f:
            plain = yaml.safe_load(f)
    except FileNotFoundError:
        raise RunDirError(f"{path} does not exist: is it a run directory written by python main.py?") from None
    except yaml.YAMLError as err:
        raise RunDirError(
            f"{path} is not YAML ({' '.join(str(err).split())}); write it again with python main.py"
        ) from None
    try:
        return load_config(plain or {})
    except TypedConfigError as err:
        raise RunDirError(f"{path}: {err} (written by another version? write it again with python main.py)") from None


def load_run(run_dir: str | os.PathLike) -> Run:
    """RUN_DIR's config.yaml and plan.json."""
    try:
        return Run(load_run_config(run_dir), load_plan(run_dir))
    except PlanFileError as err:
        raise RunDirError(str(err)) from None


def load_run_or_exit(run_dir: str | os.PathLike) -> Run:
    """load_run for a rank's entry point: an unreadable run directory ends the process with its one line."""
    try:
        return load_run(run_dir)
    except RunDirError as err:
        raise SystemExit(f"error: {err}") from None
