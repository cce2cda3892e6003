"""conf/observability.yaml: the profiling window, telemetry and the preflight stage's settings. The `nsys profile`
wrapper the launcher puts around the profiled ranks is launcher/jobs/nsys.py."""

from __future__ import annotations

import shutil

from common.config import Config, ProfileTool, Stage
from launcher.plan.findings import Findings
from launcher.plan.sizes import Sizes


def check(cfg: Config, sizes: Sizes, found: Findings) -> None:
    _profile(cfg, sizes, found)
    _preflight(cfg, sizes, found)


def _profile(cfg: Config, sizes: Sizes, found: Findings) -> None:
    prof = cfg.profile
    if not prof.enabled:
        return
    start, end, steps = prof.start_step, prof.end_step, cfg.training.train_steps
    if not 1 <= start < end <= steps + 1:
        found.problem(
            f"profile.start_step={start} and profile.end_step={end} must satisfy 1 <= start_step < "
            f"end_step <= training.train_steps + 1 = {steps + 1} (steps start_step .. end_step - 1 are "
            "profiled)"
        )
    ranks = prof.ranks
    if sizes.num_gpus and not (ranks and all(0 <= r < sizes.num_gpus for r in ranks)):
        found.problem(
            f"profile.ranks={ranks} must be a non-empty list of ranks in 0..{sizes.num_gpus - 1}, e.g. "
            "profile.ranks=[0]"
        )
    if prof.tool == ProfileTool.nsys and cfg.cluster.runs_here and shutil.which("nsys") is None:
        found.problem_unless_dry_run(
            "profile.tool=nsys needs Nsight Systems, but nsys is not on this machine's "
            "PATH: install Nsight Systems (it also comes with the CUDA toolkit) and put "
            "nsys on PATH, or use profile.tool=torch"
        )


def _preflight(cfg: Config, sizes: Sizes, found: Findings) -> None:
    if Stage.preflight not in cfg.stages:
        return
    pre = cfg.preflight
    if pre.sizes_mib == []:
        found.problem("preflight.sizes_mib=[] measures nothing: list message sizes in MiB, or null (training's sizes)")
    by_gpu_type = pre.min_busbw_gbps_by_gpu_type
    if pre.min_busbw_gbps is None and (sizes.gpu_type is None or by_gpu_type.get(sizes.gpu_type) is None):
        found.warning(
            f"preflight: no bandwidth threshold for GPU type {sizes.gpu_type or 'unknown'} (set "
            "preflight.min_busbw_gbps, or cluster.gpu_type); the preflight will only print the table"
        )
    if sizes.num_gpus == 1:
        found.warning("preflight: one GPU has no communication to measure; the stage passes at once")
