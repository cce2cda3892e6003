"""SIGTERM and SIGUSR1: how Slurm (before the time limit, on scancel) and torchrun ask a job to stop.

Slurm delivers them to every process of the job step, helpers included: data-loader workers and the processes
an asynchronous checkpoint save starts. A helper killed by the signal takes the trainer down before it can
checkpoint, so helpers are started with the signals blocked (the mask is inherited across fork and exec) and
exit with the trainer; the trainer itself only records the signal and stops at the next step boundary."""

from __future__ import annotations

import contextlib
from multiprocessing import resource_tracker
import os
import signal
import sys
import threading
from typing import Iterator

from common.processes import die_with_parent

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


_forked_from_main_thread = False


def _note_forking_thread() -> None:
    global _forked_from_main_thread
    _forked_from_main_thread = threading.current_thread() is threading.main_thread()


def _die_with_parent() -> None:
    if _forked_from_main_thread:
        die_with_parent()


def helpers_die_with_the_trainer() -> None:
    """Processes the trainer forks from now on (an asynchronous save's writer, data-loader workers) are killed
    when it dies. A trainer killed hard (a hang's SIGKILL from ft_launcher, the OOM killer, kill -9) would
    otherwise leave its writer running on, writing a save nobody will complete into the run directory while the
    restarted trainer saves. Only children of the main thread: the kernel's signal follows the forking thread,
    and a child forked by a short-lived helper thread would die with that thread. Linux only; once per process."""
    global _registered
    if not sys.platform.startswith("linux") or _registered:
        return
    os.register_at_fork(before=_note_forking_thread, after_in_child=_die_with_parent)
    _registered = True


_registered = False
