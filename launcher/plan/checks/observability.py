"""conf/observability.yaml: the profiling window, telemetry and the preflight stage's settings. The `nsys profile`
wrapper the launcher puts around the profiled ranks is launcher/jobs/nsys.py."""

from __future__ import annotations

import shutil
from typing import Any, Mapping

from launcher.plan.findings import Findings
from launcher.plan.sizes import Sizes


def check(cfg: Mapping[str, Any], sizes: Sizes, found: Findings) -> None:
    _profile(cfg, sizes, found)
    _preflight(cfg, sizes, found)
    telemetry = cfg["telemetry"]
    if telemetry["enabled"] and telemetry["interval_s"] <= 0:
        found.problem(f"telemetry.interval_s={telemetry['interval_s']:g} must be seconds > 0")
    for key in ("flag_utilization_below", "flag_sm_clock_below"):
        if not 0 <= telemetry[key] <= 1:
            found.problem(f"telemetry.{key}={telemetry[key]} must be a share from 0 to 1")


def _profile(cfg: Mapping[str, Any], sizes: Sizes, found: Findings) -> None:
    prof = cfg["profile"]
    if not prof["enabled"]:
        return
    start, end, steps = prof["start_step"], prof["end_step"], cfg["training"]["train_steps"]
    if not 1 <= start < end <= steps + 1:
        found.problem(
            f"profile.start_step={start} and profile.end_step={end} must satisfy 1 <= start_step < "
            f"end_step <= training.train_steps + 1 = {steps + 1} (steps start_step .. end_step - 1 are "
            "profiled)"
        )
    ranks = prof["ranks"]
    if sizes.num_gpus and not (ranks and all(0 <= r < sizes.num_gpus for r in ranks)):
        found.problem(
            f"profile.ranks={ranks} must be a non-empty list of ranks in 0..{sizes.num_gpus - 1}, e.g. "
            "profile.ranks=[0]"
        )
    if prof["tool"] == "nsys" and cfg["cluster"]["platform"] == "local" and shutil.which("nsys") is None:
        found.problem_unless_dry_run(
            "profile.tool=nsys needs Nsight Systems, but nsys is not on this machine's "
            "PATH: install Nsight Systems (it also comes with the CUDA toolkit) and put "
            "nsys on PATH, or use profile.tool=torch"
        )


def _preflight(cfg: Mapping[str, Any], sizes: Sizes, found: Findings) -> None:
    if "preflight" not in cfg["stages"]:
        return
    pre = cfg["preflight"]
    limit = pre["min_busbw_gbps"]
    if limit is not None and limit <= 0:
        found.problem(f"preflight.min_busbw_gbps={limit:g} must be null (the GPU type's default) or GB/s > 0")
    if pre["sizes_mib"] is not None and not (pre["sizes_mib"] and all(s > 0 for s in pre["sizes_mib"])):
        sizes_text = "[" + ", ".join(f"{s:g}" for s in pre["sizes_mib"]) + "]"
        found.problem(f"preflight.sizes_mib={sizes_text} must be null (training's sizes) or a list of MiB > 0")
    for key in ("iterations", "max_size_mib"):
        found.at_least(f"preflight.{key}", pre[key], 1)
    found.at_least("preflight.warmup_iterations", pre["warmup_iterations"], 0)
    if not 0 < pre["slow_node_fraction"] <= 1:
        found.problem(f"preflight.slow_node_fraction={pre['slow_node_fraction']} must be a share from 0 to 1")
    if limit is None and pre["min_busbw_gbps_by_gpu_type"].get(sizes.gpu_type) is None:
        found.warning(
            f"preflight: no bandwidth threshold for GPU type {sizes.gpu_type or 'unknown'} (set "
            "preflight.min_busbw_gbps, or cluster.gpu_type); the preflight will only print the table"
        )
    if sizes.num_gpus == 1:
        found.warning("preflight: one GPU has no communication to measure; the stage passes at once")
