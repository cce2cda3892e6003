"""conf/resilience/: restarts after a time limit or a failure, hang detection, straggler detection and fault
injection. Ranges and combinations here; what a platform cannot do is its one-line refusal
(launcher/platforms/base.py: resilience_refusals)."""

from __future__ import annotations

import importlib.util

from common.config import Config, FaultKind, FaultPoint, ResilienceConfig, TrainingConfig
from launcher.plan.findings import Findings
from launcher.plan.sizes import Sizes


def check(cfg: Config, sizes: Sizes, found: Findings) -> None:
    res = cfg.resilience
    for line in found.platform.resilience_refusals(cfg) if found.platform else []:
        found.problem(line)
    if res.job_restarts > 0 or res.in_job_restarts > 0:
        _restarts(cfg, found)
    if (res.in_job_restarts > 0 or res.straggler_detection.enabled) and cfg.cluster.runs_here:
        _nvrx_here(res, found)
    _straggler(res, cfg.training, found)
    if res.inject_fault.kind:
        _fault(res, cfg.training, sizes, found)


def _restarts(cfg: Config, found: Findings) -> None:
    """A restart continues from the newest complete checkpoint: there must be one to continue from."""
    res, ckpt = cfg.resilience, cfg.training.checkpoint
    restarts = {"job_restarts": res.job_restarts, "in_job_restarts": res.in_job_restarts}
    which = ", ".join(f"resilience.{key}={count}" for key, count in restarts.items() if count)
    if not ckpt.load:
        found.problem(
            f"{which} continues from the newest checkpoint, but training.checkpoint.load=false starts "
            "every job or restart from scratch: set training.checkpoint.load=true"
        )
    elif not ckpt.interval:
        found.warning(
            f"{which} with training.checkpoint.interval=0: a restart after a failure goes back to the "
            "start or to the last stop signal's checkpoint; set an interval to lose less"
        )
    if cfg.mlperf is not None:
        found.warning(f"{which}: an MLPerf run that resumes from a checkpoint is not a valid result")


def _nvrx_here(res: ResilienceConfig, found: Findings) -> None:
    """cluster=local runs ft_launcher and the detector with this Python; elsewhere they run in the image."""
    if importlib.util.find_spec("nvidia_resiliency_ext") is None:
        key = "resilience.in_job_restarts" if res.in_job_restarts > 0 else "resilience.straggler_detection.enabled"
        found.problem_unless_dry_run(
            f"{key} needs nvidia-resiliency-ext, which this Python cannot import: "
            "pip install nvidia-resiliency-ext (or turn it off)"
        )


def _straggler(res: ResilienceConfig, training: TrainingConfig, found: Findings) -> None:
    det, log = res.straggler_detection, training.log_interval
    if det.enabled and det.interval_steps % log:
        found.problem(
            f"resilience.straggler_detection.interval_steps={det.interval_steps} must be a multiple of "
            f"training.log_interval={log} (each report goes into that step's metrics.jsonl record)"
        )


def _fault(res: ResilienceConfig, training: TrainingConfig, sizes: Sizes, found: Findings) -> None:
    fault, steps, ckpt = res.inject_fault, training.train_steps, training.checkpoint
    if sizes.num_gpus and not 0 <= fault.rank < sizes.num_gpus:
        found.problem(
            f"resilience.inject_fault.rank={fault.rank} is not a rank of this job: use 0..{sizes.num_gpus - 1}"
        )
    if not 1 <= fault.step <= steps:
        found.problem(
            f"resilience.inject_fault.step={fault.step} must be a step of the run: 1..{steps} (training.train_steps)"
        )
    elif fault.during == FaultPoint.save:
        saves = (ckpt.interval and fault.step % ckpt.interval == 0) or (fault.step == steps and ckpt.save_at_end)
        if not saves:
            found.problem(
                f"resilience.inject_fault.during=save at step {fault.step}, which saves no checkpoint "
                f"(training.checkpoint.interval={ckpt.interval}): pick a multiple of the interval"
            )
    if fault.kind == FaultKind.enospc and fault.during != FaultPoint.save:
        found.problem(
            "resilience.inject_fault.kind=enospc fills the disk under a checkpoint being written: set "
            "resilience.inject_fault.during=save"
        )
    if fault.kind == FaultKind.hang and not res.in_job_restarts:
        found.warning(
            "resilience.inject_fault.kind=hang without resilience.in_job_restarts: nothing detects the "
            "hang, and the job waits until its time limit (or NCCL's timeout)"
        )
