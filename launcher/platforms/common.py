"""What several platforms share: titles, time limits and the checks of paths the jobs see."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping

from common.plan import Plan
from launcher.platforms import containers


def gpus(n: int) -> str:
    return f"{n} GPU" + ("s" if n != 1 else "")


def nodes_text(plan: Plan) -> str:
    return f"{plan.num_nodes} node{'s' if plan.num_nodes > 1 else ''} x {plan.gpus_per_node}"


def training_title(plan: Plan, how: str) -> str:
    return f"Train {plan.model} ({plan.dtype}) on {gpus(plan.num_gpus)}: {nodes_text(plan)}, {how}"


def export_title(run_dir: Path) -> str:
    return f"Export the newest checkpoint of {run_dir.name} to Hugging Face format"


def preflight_title(plan: Plan) -> str:
    return f"Network preflight: all-reduce bandwidth over the {gpus(plan.num_gpus)} of the training job"


def time_seconds(value: Any) -> int | None:
    """Seconds in a time limit (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS); None for unlimited.
    Raises ValueError for anything else."""
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


def time_problem(key: str, value: Any, finite: bool = False, what: str = "a time limit") -> str | None:
    try:
        seconds = time_seconds(value)
    except ValueError:
        return f"{key}={value!r} is not {what} (HH:MM:SS, D-HH:MM:SS or minutes)"
    if finite and seconds is None:
        return f"{key}={value!r}: this platform needs a finite time limit (HH:MM:SS)"
    return None


def limits_problems(cfg: Mapping[str, Any], selected: list[str], what: str = "a time limit",
                    finite: bool = False) -> list[str]:
    """cluster.time_limit, the signal margin before it, the preflight's limit, and the data preparation tasks'
    limits and sizes."""
    cluster = cfg["cluster"]
    problem = time_problem("cluster.time_limit", cluster["time_limit"], finite=finite, what=what)
    if problem:
        return [problem]
    limit = time_seconds(cluster["time_limit"])
    margin = cluster.get("signal_before_timeout_s") or 0
    if limit is not None and margin >= limit:
        return [f"cluster.signal_before_timeout_s={margin} must be shorter than cluster.time_limit="
                f"{cluster['time_limit']} ({limit} s)"]
    if "preflight" in selected:
        problem = time_problem("preflight.time_limit", cfg["preflight"]["time_limit"], finite=finite, what=what)
        if problem:
            return [problem]
    if "data_preparation" in selected:
        job = cfg["data_preparation"].get("job") or {}
        problem = job.get("time_limit") and time_problem("data_preparation.job.time_limit", job["time_limit"],
                                                         finite=finite, what=what)
        if problem:
            return [problem]
        for key in ("cpus_per_task", "max_parallel"):
            value = job.get(key)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                return [f"data_preparation.job.{key}={value!r} must be null or a positive integer"]
    return []


def hms(seconds: int) -> str:
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def image_checks(cfg: Mapping[str, Any], selected: list[str], dry_run: bool) -> tuple[list[str], list[str]]:
    """The image the jobs run in, unless the container stage builds it first."""
    if "container" in selected:
        return [], []
    return containers.image_problems(cfg, dry_run)


def outside_mounts(paths: list[str], mounts: list[str]) -> list[str]:
    """The paths that lie under none of the mount points."""
    roots = [Path(m) for m in mounts]
    return [p for p in paths if not any(Path(p) == r or r in Path(p).parents for r in roots)]
