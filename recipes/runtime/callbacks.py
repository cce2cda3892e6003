"""What the training loop tells its components, in one protocol: the resilience guard, the observers (tracking,
profiling, telemetry, MLPerf logging), the metrics file, CUDA graphs, the data and the checkpointer each implement
the events they care about, and the loop calls a `Callbacks` list of them.

The events of a run, in order:
    training_starts(state)            the state is loaded; right before the first step
    step_starts(step) ... step_ends(step)          around every training step
    evaluation_starts(state) ... evaluation_ends(state, val_loss, run_goes_on)
    save_starts(step), save_in_flight(step), save_ends(step)    around a checkpoint save (or the wait for one)
    logged(record)                    a step's metrics record (the logging rank)
    run_ends(stop)                    the run is over: as soon as the loop knows why (before its last save)
    stops(stop)                       after the last save, however the run ended: release what is held
`run_ends` and `stops` come exactly once on every exit: the last step, a reached target, an agreed stop signal, a
divergence, an exception. Events that close a bracket (step_ends, evaluation_ends, save_ends, stops) reach the
callbacks in the reverse order of the opening ones, as nested blocks would."""

from __future__ import annotations

from dataclasses import dataclass
import signal
from typing import Any

from common.checkpoints import TrainState

FINISHED, TARGET, SIGNAL, DIVERGED, ERROR = "finished", "target", "signal", "diverged", "error"


@dataclass(frozen=True)
class Stop:
    """Why and where a run ended. `detail`: what diverged, the error; `signum`: the stop signal, when this rank saw
    one (an agreed stop can come from another rank's)."""

    reason: str
    step: int
    consumed_samples: int
    detail: str = ""
    signum: int | None = None

    @property
    def reached_target(self) -> bool:
        return self.reason == TARGET

    @property
    def completed(self) -> bool:
        """The run has nothing left to do: its last step, or its target (a job chain ends here)."""
        return self.reason in (FINISHED, TARGET)

    @property
    def every_rank_agrees(self) -> bool:
        """Every rank stops at this step (the collectives of a last save can run); an exception may be one rank's."""
        return self.reason != ERROR

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else "another rank's"

    @property
    def exit_code(self) -> int:
        return 3 if self.reason == DIVERGED else 0


class Callback:
    """One component's part in the run; every event does nothing unless a component overrides it."""

    def training_starts(self, state: TrainState) -> None:
        pass

    def step_starts(self, step: int) -> None:
        pass

    def step_ends(self, step: int) -> dict[str, Any] | None:
        """Fields this component adds to the step's metrics record (None: none)."""
        return None

    def evaluation_starts(self, state: TrainState) -> None:
        pass

    def evaluation_ends(self, state: TrainState, val_loss: float | None, run_goes_on: bool) -> None:
        pass

    def save_starts(self, step: int) -> None:
        pass

    def save_in_flight(self, step: int) -> None:
        """The checkpoint of `step` is being written and is not complete yet."""

    def save_ends(self, step: int) -> None:
        pass

    def logged(self, record: Any) -> None:
        pass

    def run_ends(self, stop: Stop) -> None:
        pass

    def stops(self, stop: Stop) -> None:
        pass


class Callbacks(list):
    """The components, in the order they hear opening events."""

    def training_starts(self, state: TrainState) -> None:
        for callback in self:
            callback.training_starts(state)

    def step_starts(self, step: int) -> None:
        for callback in self:
            callback.step_starts(step)

    def step_ends(self, step: int) -> dict[str, Any]:
        fields: dict[str, Any] = {}
        for callback in reversed(self):
            fields.update(callback.step_ends(step) or {})
        return fields

    def evaluation_starts(self, state: TrainState) -> None:
        for callback in self:
            callback.evaluation_starts(state)

    def evaluation_ends(self, state: TrainState, val_loss: float | None, run_goes_on: bool) -> None:
        for callback in reversed(self):
            callback.evaluation_ends(state, val_loss, run_goes_on)

    def save_starts(self, step: int) -> None:
        for callback in self:
            callback.save_starts(step)

    def save_in_flight(self, step: int) -> None:
        for callback in self:
            callback.save_in_flight(step)

    def save_ends(self, step: int) -> None:
        for callback in reversed(self):
            callback.save_ends(step)

    def logged(self, record: Any) -> None:
        for callback in self:
            callback.logged(record)

    def run_ends(self, stop: Stop) -> None:
        for callback in self:
            callback.run_ends(stop)

    def stops(self, stop: Stop) -> None:
        """Every component releases what it holds, even when one of them fails; the first failure is raised once
        all have run."""
        failure: BaseException | None = None
        for callback in reversed(self):
            try:
                callback.stops(stop)
            except BaseException as err:  # noqa: BLE001 - the others must still release theirs
                failure = failure or err
        if failure is not None:
            raise failure
