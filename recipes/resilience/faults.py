"""resilience.inject_fault: a chosen rank hangs, crashes, is killed or finds its disk full at a chosen step, once.
The fault is recorded in the run's events (common/run_events.py) before it happens, and a rank that finds it
recorded does not inject it again: the restart it causes runs through, and its test compares the losses with an
uninterrupted run's."""

from __future__ import annotations

import errno
import os
import signal
import time
from typing import Any, Callable

from common import run_events
from common.config import FaultConfig


class FaultInjector:
    def __init__(
        self,
        run_dir: str,
        fault: FaultConfig,
        rank: int,
        events: list[dict[str, Any]],
        say: Callable[[str], None] = print,
    ):
        self.run_dir, self.say = run_dir, say
        self.kind, self.step, self.during = fault.kind, fault.step, fault.during
        done = any(
            e["event"] == "fault"
            and e.get("kind") == self.kind
            and e.get("step") == self.step
            and e.get("during", "step") == self.during
            for e in events
        )
        self.armed = bool(self.kind) and rank == fault.rank and not done
        self.rank = rank

    def at(self, step: int, during: str) -> None:
        """Called as step `step` begins (during="step") and while its checkpoint is being written ("save")."""
        if not (self.armed and step == self.step and during == self.during):
            return
        self.armed = False
        run_events.record(self.run_dir, "fault", kind=self.kind, rank=self.rank, step=step, during=during)
        self.say(
            f"resilience.inject_fault: rank {self.rank} {self._doing()} at step {step}"
            + (" while its checkpoint is being written" if during == "save" else "")
        )
        if self.kind == "hang":
            while True:  # as a rank stuck in a collective: alive, silent
                time.sleep(3600)
        if self.kind == "crash":
            os._exit(1)
        if self.kind == "enospc":  # as the file system says it: the save's own handling takes it from here
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.run_dir)
        os.kill(os.getpid(), signal.SIGKILL)

    def _doing(self) -> str:
        return {
            "hang": "hangs",
            "crash": "crashes (os._exit(1))",
            "kill": "is killed (SIGKILL)",
            "enospc": "finds its disk full (ENOSPC)",
        }[str(self.kind)]
