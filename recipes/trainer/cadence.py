"""When the training loop acts: the decisions it asks for after every step (save a checkpoint, evaluate, log,
collect garbage, stop), as plain values and functions. No torch: where ranks must agree (a collective), the loop
does the agreeing and these say what about."""

from __future__ import annotations

from dataclasses import dataclass
import gc
import math
from typing import Callable

from common.checkpoints import TrainState
from common.config import CheckpointConfig, TrainingConfig
from recipes.runtime.callbacks import Callback, Stop


@dataclass(frozen=True)
class StepEnd:
    """How the step that just ran ends the run: finished (the last step, or the validation target reached) or
    stopping (a stop signal every rank agreed on, when it was not finishing anyway); else the run goes on."""

    finished: bool
    reached: bool
    stopping: bool

    @property
    def run_goes_on(self) -> bool:
        return not (self.finished or self.stopping)


def step_end(step: int, last_step: int, reached: bool, signal_agreed: Callable[[], bool]) -> StepEnd:
    """`signal_agreed` is the ranks' agreement on a stop signal, a collective: asked only when the run would go
    on, which every rank knows alike."""
    finished = step == last_step or reached
    return StepEnd(finished=finished, reached=reached, stopping=not finished and signal_agreed())


def divergence(loss: float | None, grad_norm: float) -> str | None:
    """What is not finite after a step ('loss=nan', 'grad_norm=inf'); None when training can go on. The loss is
    known on the last pipeline stage only (None elsewhere), the gradient norm on every rank."""
    if loss is not None and not math.isfinite(loss):
        return f"loss={loss}"
    if not math.isfinite(grad_norm):
        return f"grad_norm={grad_norm}"
    return None


def logs_step(step: int, log_interval: int, evaluated: bool) -> bool:
    """Every training.log_interval steps, and every step that evaluated. Every rank decides alike, from what every
    rank knows: a logged step joins a collective (the peak-memory reduction), and only last-stage ranks hold the
    validation loss, so deciding by it would leave the other pipeline stages out and hang the step."""
    return step % log_interval == 0 or evaluated


@dataclass(frozen=True)
class SavePolicy:
    """When the checkpointer saves (training.checkpoint): every `interval` steps (0: never), after the last step
    (save_at_end), on an agreed stop signal, and the initial weights before the first step (save_initial)."""

    interval: int
    at_end: bool
    initial: bool

    @classmethod
    def from_config(cls, checkpoint: CheckpointConfig) -> "SavePolicy":
        return cls(interval=checkpoint.interval, at_end=checkpoint.save_at_end, initial=checkpoint.save_initial)

    def saves_before_training(self, step: int) -> bool:
        return self.initial and step == 0

    def saves_after(self, step: int, end: StepEnd) -> bool:
        return bool(self.interval and step % self.interval == 0) or end.stopping or (end.finished and self.at_end)


@dataclass(frozen=True)
class EvalPolicy:
    """When the validator evaluates: every training.val_interval steps (0: never) except the first
    training.val_skip of them, and after the last step; and whether training.target_val_loss (None: train every
    step) is watched."""

    interval: int
    last_step: int
    target: float | None
    skip: int = 0

    @classmethod
    def from_config(cls, train: TrainingConfig) -> "EvalPolicy":
        return cls(
            interval=train.val_interval, last_step=train.train_steps, target=train.target_val_loss, skip=train.val_skip
        )

    def due(self, step: int) -> bool:
        if not self.interval:
            return False
        return (step % self.interval == 0 and step // self.interval > self.skip) or step == self.last_step

    @property
    def watches_target(self) -> bool:
        """Every rank asks the others each step whether the target was reached (they must stop together)."""
        return self.target is not None and bool(self.interval)

    def reached(self, val_loss: float | None) -> bool:
        """This rank's answer; only the last rank has the validation loss."""
        return self.watches_target and val_loss is not None and self.target is not None and val_loss <= self.target


@dataclass(frozen=True)
class GCPolicy(Callback):
    """Python's garbage collector off during training and run every `every` steps, at the same point on every
    rank: a collection at a random moment on one rank would stall all the others at the next collective. A
    callback of the loop: off when training starts, a collection at the end of every `every`-th step, back on
    when the run stops."""

    every: int = 100

    def training_starts(self, state: TrainState) -> None:
        gc.disable()
        gc.collect()

    def due(self, step: int) -> bool:
        return step % self.every == 0

    def step_ends(self, step: int) -> None:
        if self.due(step):
            gc.collect()

    def stops(self, stop: Stop) -> None:
        gc.enable()
