"""Where a rank's time outside the steps goes, one line each, printed by rank 0: the start-up (the seconds of each
phase between the training entry's first line and the loop, before the first step) and the end of the run (from
the moment the run's end is known, after its last step, to the process groups' release)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

# Phases shorter than this are left out of the line.
SHOWN_FROM_S = 0.1


@dataclass
class PhaseClock:
    """Marks the end of each phase; `sync` (torch.cuda.synchronize on a GPU) runs first, so kernels a phase queued
    count in that phase and not in the next. `what` names the line."""

    started: float
    what: str = "start-up"
    now: Callable[[], float] = time.monotonic
    sync: Callable[[], None] | None = None
    phases: list[tuple[str, float]] = field(default_factory=list)

    def mark(self, phase: str) -> None:
        if self.sync is not None:
            self.sync()
        self.phases.append((phase, self.now() - self.started - self.total_s()))

    def total_s(self) -> float:
        return sum(seconds for _, seconds in self.phases)

    def line(self, rank: int) -> str:
        shown = ", ".join(f"{phase} {seconds:.1f}" for phase, seconds in self.phases if seconds >= SHOWN_FROM_S)
        return f"{self.what} on rank {rank}: {self.total_s():.1f} s ({shown or 'every phase under 0.1 s'})"
