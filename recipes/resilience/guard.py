"""What the training loop asks and tells for a long run (docs/long-runs.md), in one component: the rank monitor
that detects hangs under ft_launcher (monitor.py), the fault injected on purpose (faults.py), the straggler
reports (straggler.py), and the run's events (common/run_events.py) from which the report tells each restart's
time, cause, steps lost and time lost. Every call is cheap and does nothing where its feature is off."""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Any, Mapping

from common import run_events
from common.config import ResilienceConfig
from common.checkpoints import TrainState
from recipes.resilience import straggler as straggler_reports
from recipes.resilience.faults import FaultInjector
from recipes.resilience.monitor import HangMonitor
from recipes.runtime.callbacks import DIVERGED, ERROR, SIGNAL, Callback, Stop

# The scheduler's job id, for the events: Slurm, Grid Engine, Base Command.
JOB_ID_VARIABLES = ("SLURM_JOB_ID", "JOB_ID", "NGC_JOB_ID")


def job_id(env: Mapping[str, str] = os.environ) -> str:
    return next((env[k] for k in JOB_ID_VARIABLES if env.get(k)), "local")


def last_logged_step(metrics_path: str) -> tuple[int | None, float | None]:
    """The newest step metrics.jsonl holds and when it was written (the file's time): where the process before
    this one got to. Read before this process's metrics writer drops the steps past its checkpoint."""
    if not os.path.exists(metrics_path):
        return None, None
    last = None
    with open(metrics_path) as f:
        for line in f:
            with contextlib.suppress(ValueError, KeyError, TypeError):
                last = max(last or 0, int(json.loads(line)["step"]))
    return last, os.path.getmtime(metrics_path)


def _say_from_any_rank(message: str) -> None:
    print(f"[recipes] {message}", flush=True)


class RunGuard(Callback):
    """The guard's part in the run, as a callback of the training loop: the monitor's step and checkpointing
    sections, the injected fault at its step or save, the straggler timing and reports, and the run's events (the
    last rank records them: it has the metrics)."""

    def __init__(self, run_dir: str, resilience: ResilienceConfig, rank: int, world_size: int, local_rank: int = 0):
        self.process_start = time.time()
        self.run_dir, self.rank, self.local_rank = run_dir, rank, local_rank
        self.cfg = resilience
        self.records = rank == world_size - 1  # the logging rank: it has the metrics
        events = run_events.read(run_dir)
        # First thing: a rank that hangs while it builds the model is a hang too.
        self.monitor = HangMonitor.connect()
        self.faults = FaultInjector(run_dir, resilience.inject_fault, rank, events, _say_from_any_rank)
        self.straggler: straggler_reports.StragglerReports | None = None
        self._catch_up: tuple[int, float] | None = None
        self._step_section = contextlib.ExitStack()
        self._save_section = contextlib.ExitStack()

    # ------------------------------------------------------------------ the run's events
    def training_starts(self, state: TrainState) -> None:
        """The state is loaded (state.step: its step); heard before the metrics file drops later steps."""
        if self.cfg.straggler_detection.enabled:
            self.straggler = straggler_reports.StragglerReports(
                self.cfg.straggler_detection, self.rank, self.local_rank
            )
        if not self.records:
            return
        last, when = last_logged_step(os.path.join(self.run_dir, "metrics.jsonl"))
        run_events.record(
            self.run_dir,
            "start",
            job_id=job_id(),
            cycle=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)),
            process_start=round(self.process_start, 3),
            resumed_step=state.step,
            last_step=last,
            last_step_time=when,
        )
        if last is not None and when is not None:
            # Time lost: from the last step before to that step again (steps were lost), or to the first step after
            # it (none were: the restart itself, plus one step).
            self._catch_up = (max(last, state.step + 1), when)

    def stops(self, stop: Stop) -> None:
        """The run's last events (a stop signal's stop; the end of a run that finished or diverged; an exception is
        recorded by record_failure, from the rank that raised it), then the monitor and the detector let go."""
        self._step_section.close()
        self._save_section.close()
        if self.records and stop.reason == SIGNAL:
            # Ranks agree on a stop any of them saw; one that saw none records it as another rank's.
            run_events.record(self.run_dir, "stop", step=stop.step, signal=stop.signal_name)
        elif self.records and stop.reason != ERROR:
            reason = {"reason": f"diverged: {stop.detail}"} if stop.reason == DIVERGED else {}
            run_events.record(self.run_dir, "end", step=stop.step, finished=stop.completed, **reason)
        self.close()

    # ------------------------------------------------------------------ steps and saves
    def step_starts(self, step: int) -> None:
        """The monitor's step section, the injected fault, the straggler timing of the step."""
        if self.monitor:
            self.monitor.step_begins()
        self.faults.at(step, "step")
        if self.straggler:
            self._step_section.enter_context(self.straggler.step())

    def step_ends(self, step: int) -> dict[str, Any] | None:
        """After every step, on every rank: the step a restarted process catches up with, and every
        interval_steps the straggler report (a collective), which goes into the step's record."""
        self._step_section.close()
        if self.monitor:
            self.monitor.step_ended()
        if self._catch_up and step == self._catch_up[0]:
            run_events.record(
                self.run_dir, "recovered", step=step, time_lost_s=round(time.time() - self._catch_up[1], 1)
            )
            self._catch_up = None
        if not (self.straggler and self.straggler.due(step)):
            return None
        scores = self.straggler.report()
        if self.records:
            print(f"[recipes] {straggler_reports.summary(step, scores, self.straggler.threshold)}", flush=True)
            slow = self.straggler.slow(scores)
            if slow:
                run_events.record(self.run_dir, "straggler", step=step, ranks=slow)
        return {"gpu_relative_perf": scores}

    def save_starts(self, step: int) -> None:
        """A save or the wait for one: the monitor's checkpointing section (a longer timeout)."""
        if self.monitor:
            self._save_section.enter_context(self.monitor.checkpointing())

    def save_in_flight(self, step: int) -> None:
        """The checkpoint of `step` is being written and not yet complete (inject_fault.during=save)."""
        self.faults.at(step, "save")

    def save_ends(self, step: int) -> None:
        self._save_section.close()

    def close(self) -> None:
        if self.monitor:
            self.monitor.close()
        if self.straggler:
            self.straggler.close()


def record_failure(run_dir: str, rank: int, error: BaseException) -> None:
    """A rank raised: one `error` event, so the report can tell a crash with a message from a silent one."""
    with contextlib.suppress(OSError):
        run_events.record(run_dir, "error", rank=rank, message=f"{type(error).__name__}: {error}"[:500])
