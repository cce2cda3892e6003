"""What the trainer calls so a run can be watched: experiment tracking (recipes/observability/tracking.py), the
profiling window (recipes/observability/profiling.py), GPU telemetry (recipes/observability/telemetry.py) and MLPerf
logging (recipes/observability/mlperf.py), each only where its config enables it and on the ranks that do it. Every
call is cheap and safe when the feature is off."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from common.checkpoints import TrainState
from common.config import Config
from common.plan import Plan
from recipes.observability import mlperf, profiling, telemetry, tracking
from recipes.runtime.callbacks import Callback, Stop


# Ranges during which the GPUs do something other than training steps.
SAMPLER_ACTIVITIES = ("validation", "checkpoint")


def _print(message: str) -> None:
    print(f"[recipes] {message}", flush=True)


def missing_packages(cfg: Config) -> list[str]:
    """Packages the enabled features need, one line each naming the fix. Checked on every rank (they share the
    environment), so all of them stop together, before anything is built."""
    nvml = telemetry.missing_package(cfg.telemetry)
    return tracking.missing_packages(cfg.logging) + ([nvml] if nvml else [])


class Observers(Callback):
    """Holds the telemetry sampler, the profiling window, the tracker and the MLPerf log of this rank, and hears the
    training loop's events as one of its callbacks. Made from the rank's environment
    (recipes.runtime.ranks.RankInfo) before the process group and the model exist."""

    def __init__(self, run_dir: str, cfg: Config, plan: Plan, info: Any):
        self.run_dir, self.cfg, self.plan = run_dir, cfg, plan
        rank, local_rank = info.rank, info.local_rank
        self.rank, self.local_rank = rank, local_rank
        self.is_last_rank = rank == info.world_size - 1
        problems = missing_packages(cfg)
        if problems:
            raise SystemExit("\n".join(f"error: {p}" for p in problems))
        self.tracker: tracking.Tracker | None = None
        self.sampler: telemetry.Sampler | None = None
        self.mllog = mlperf.MLPerfLog()  # logs nothing until init_starts opens an MLPerf run's log
        self._ranges: dict[str, contextlib.ExitStack] = {}
        profile_cfg = cfg.profile
        self.window = (
            profiling.ProfileWindow(run_dir, profile_cfg, rank, say=_print)
            if profiling.profiled_here(profile_cfg, rank)
            else None
        )
        if cfg.telemetry.enabled and local_rank == 0:
            gpus = telemetry.job_gpu_ids(int(plan.gpus_per_node))
            self.sampler = telemetry.start(run_dir, cfg.telemetry.interval_s, gpus)

    def init_starts(self) -> None:
        """The process group is up and the model is about to be built (MLPerf's init_start): an MLPerf run drops
        the page cache and opens its log on the last rank (cache_clear, init_start); a collective."""
        self.mllog = mlperf.start(self.run_dir, self.cfg, self.plan, self.local_rank, logs_here=self.is_last_rank)

    def model_ready(self, model_config: Any, resume_step: int) -> None:
        """The model is built and its state loaded: opens the tracker (last rank: it has the metrics) and installs
        the forward/backward ranges."""
        if self.is_last_rank:
            self.tracker = tracking.Tracker(self.run_dir, self.cfg, self.plan, resume_step, say=_print)
        if self.window is not None:
            model_config.timers = self.window.timers()
        if self.sampler is not None:
            self.sampler.step = resume_step

    @contextlib.contextmanager
    def range(self, name: str) -> Iterator[None]:
        """A named range (optimizer, validation, checkpoint) in the profile of a profiled rank; validation and
        checkpoint samples are marked in the telemetry, so the report's "during steps" leaves them out."""
        sampler = self.sampler if name in SAMPLER_ACTIVITIES else None
        if sampler is not None:
            previous, sampler.activity = sampler.activity, name
        try:
            if self.window is None:
                yield
            else:
                with self.window.range(name):
                    yield
        finally:
            if sampler is not None:
                sampler.activity = previous

    def _open_range(self, name: str) -> None:
        self._ranges.setdefault(name, contextlib.ExitStack()).enter_context(self.range(name))

    def _close_range(self, name: str) -> None:
        if name in self._ranges:
            self._ranges.pop(name).close()

    # ------------------------------------------------------------------ the loop's events
    def training_starts(self, state: TrainState) -> None:
        """Right before the first step: MLPerf's timed run starts, on every rank together."""
        if self.cfg.mlperf:
            torch.distributed.barrier()
        self.mllog.run_start(state.consumed_samples, init_checkpoint_step=state.step)

    def step_starts(self, step: int) -> None:
        if self.window is not None:
            self.window.step_begins(step)

    def step_ends(self, step: int) -> None:
        if self.window is not None:
            self.window.step_ended(step)
        if self.sampler is not None:
            self.sampler.step = step
            if self.sampler.activity == "startup":
                self.sampler.activity = ""

    def evaluation_starts(self, state: TrainState) -> None:
        self.mllog.eval_start(state.consumed_samples)
        self._open_range("validation")

    def evaluation_ends(self, state: TrainState, val_loss: float | None, run_goes_on: bool) -> None:
        self._close_range("validation")
        self.mllog.eval_stop(state.consumed_samples, val_loss, run_goes_on=run_goes_on)

    def save_starts(self, step: int) -> None:
        self._open_range("checkpoint")

    def save_ends(self, step: int) -> None:
        self._close_range("checkpoint")

    def logged(self, record: Any) -> None:
        if self.tracker is not None:
            self.tracker.log(record)

    def run_ends(self, stop: Stop) -> None:
        """The end of MLPerf's timed run (run_stop: success when the target was reached), before the last save."""
        self.mllog.run_stop(stop.reached_target, stop.consumed_samples)

    def stops(self, stop: Stop) -> None:
        self.close()

    def close(self) -> None:
        """Idempotent: the profile, the tracker's last events, the telemetry thread."""
        for name in list(self._ranges):
            self._close_range(name)
        if self.window is not None:
            self.window.close()
        if self.tracker is not None:
            self.tracker.close()
            self.tracker = None
        if self.sampler is not None:
            self.sampler.stop()
            self.sampler = None
