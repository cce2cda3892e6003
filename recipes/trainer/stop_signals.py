"""SIGTERM and SIGUSR1: how Slurm (before the time limit, on scancel) and torchrun ask a job to stop.

Slurm delivers them to every process of the job step, helpers included: data-loader workers and the processes
an asynchronous checkpoint save starts. A helper killed by the signal takes the trainer down before it can
checkpoint, so helpers are started with the signals blocked (the mask is inherited across fork and exec) and
exit with the trainer; the trainer itself only records the signal and stops at the next step boundary."""
from __future__ import annotations

import contextlib
from multiprocessing import resource_tracker
import signal
from typing import Iterator

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class StopSignal:
    """Remembers a stop signal; the trainer checks `received` at step boundaries, agrees across ranks, saves,
    exits."""

    def __init__(self):
        self.received: int | None = None
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._handle)

    def _handle(self, signum, _frame):
        self.received = signum


@contextlib.contextmanager
def helpers_immune_to_stop_signals() -> Iterator[None]:
    """Processes started inside this block never receive SIGTERM/SIGUSR1. A signal that reaches the trainer
    meanwhile stays pending and is handled as soon as the block ends."""
    # multiprocessing's resource tracker, started on first use, SIG_UNBLOCKs SIGTERM in the calling thread
    # after spawning itself, which would undo this block for every helper started after it. Start it first.
    resource_tracker.ensure_running()
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
