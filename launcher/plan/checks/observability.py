"""Host side of conf/observability.yaml: the checks made before anything is written (profiling window, tracking,
telemetry, preflight settings). The `nsys profile` wrapper the launcher puts around the profiled ranks is
launcher/jobs/nsys.py."""
from __future__ import annotations

import shutil
from typing import Any, Mapping

from common.plan import Plan
from launcher.plan.errors import PlanError

WANDB_MODES = ("auto", "online", "offline")


def _positive_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def _profile_problems(cfg: Mapping[str, Any], plan: Plan) -> tuple[list[str], list[str]]:
    prof = cfg.get("profile") or {}
    if not prof.get("enabled"):
        return [], []
    problems: list[str] = []
    warnings: list[str] = []
    tool = prof.get("tool")
    if tool not in ("torch", "nsys"):
        problems.append(f"profile.tool={tool!r}: use torch or nsys")
    start, end, steps = prof.get("start_step"), prof.get("end_step"), cfg["training"]["train_steps"]
    if not (isinstance(start, int) and isinstance(end, int) and 1 <= start < end <= steps + 1):
        problems.append(f"profile.start_step={start} and profile.end_step={end} must satisfy 1 <= start_step < "
                        f"end_step <= training.train_steps + 1 = {steps + 1} (steps start_step .. end_step - 1 are "
                        "profiled)")
    ranks = prof.get("ranks")
    if not (isinstance(ranks, list) and ranks and all(isinstance(r, int) and 0 <= r < plan.num_gpus for r in ranks)):
        problems.append(f"profile.ranks={ranks} must be a non-empty list of ranks in 0..{plan.num_gpus - 1}, e.g. "
                        "profile.ranks=[0]")
    if tool == "nsys" and cfg["cluster"]["name"] == "local" and shutil.which("nsys") is None:
        message = ("profile.tool=nsys needs Nsight Systems, but nsys is not on this machine's PATH: install Nsight "
                   "Systems (it also comes with the CUDA toolkit) and put nsys on PATH, or use profile.tool=torch")
        (warnings if cfg.get("dry_run") else problems).append(message)
    return problems, warnings


def _preflight_problems(cfg: Mapping[str, Any], plan: Plan) -> tuple[list[str], list[str]]:
    if "preflight" not in cfg["stages"]:
        return [], []
    pre = cfg["preflight"]
    problems: list[str] = []
    warnings: list[str] = []
    limit = pre.get("min_busbw_gbps")
    if limit is not None and not _positive_number(limit):
        problems.append(f"preflight.min_busbw_gbps={limit!r} must be null (the GPU type's default) or GB/s > 0")
    sizes = pre.get("sizes_mib")
    if sizes is not None and not (isinstance(sizes, list) and sizes and all(_positive_number(s) for s in sizes)):
        problems.append(f"preflight.sizes_mib={sizes!r} must be null (training's sizes) or a list of MiB > 0")
    for key in ("iterations", "max_size_mib"):
        if not _positive_number(pre.get(key)):
            problems.append(f"preflight.{key}={pre.get(key)!r} must be positive")
    if not (isinstance(pre.get("warmup_iterations"), int) and pre["warmup_iterations"] >= 0):
        problems.append(f"preflight.warmup_iterations={pre.get('warmup_iterations')!r} must be 0 or more")
    by_type = pre.get("min_busbw_gbps_by_gpu_type") or {}
    if limit is None and by_type.get(plan.gpu_type) is None:
        warnings.append(f"preflight: no bandwidth threshold for GPU type {plan.gpu_type or 'unknown'} (set "
                        "preflight.min_busbw_gbps, or cluster.gpu_type); the preflight will only print the table")
    if plan.num_gpus == 1:
        warnings.append("preflight: one GPU has no communication to measure; the stage passes at once")
    return problems, warnings


def check(cfg: Mapping[str, Any], plan: Plan) -> list[str]:
    """Raises PlanError (one line per problem, naming the key and the fix); returns warnings."""
    problems, warnings = _profile_problems(cfg, plan)
    more, more_warnings = _preflight_problems(cfg, plan)
    problems += more
    warnings += more_warnings
    mode = ((cfg.get("logging") or {}).get("wandb") or {}).get("mode")
    if mode not in WANDB_MODES:
        problems.append(f"logging.wandb.mode={mode!r}: use {', '.join(WANDB_MODES)}")
    telemetry = cfg.get("telemetry") or {}
    if telemetry.get("enabled") and not _positive_number(telemetry.get("interval_s")):
        problems.append(f"telemetry.interval_s={telemetry.get('interval_s')!r} must be seconds > 0")
    if problems:
        raise PlanError(problems)
    return warnings
