"""The training loop: steps until the run ends, asking its policies when to act (recipes/trainer/cadence.py: the
checkpointer when to save, the evaluation policy when to validate, the step's end whether the run goes on) and
telling its callbacks what happened (recipes/runtime/callbacks.py: the guard, the observers, the metrics file, CUDA
graphs, the data, the checkpointer). Everything it works with is handed to it; recipes/trainer/build.py assembles a
run's from its run directory."""

from __future__ import annotations

import time
from typing import Any, Callable

from common.checkpoints import TrainState, latest_checkpoint
from common.config import TrainingConfig
from common.plan import Plan
from recipes.runtime.callbacks import DIVERGED, ERROR, FINISHED, SIGNAL, TARGET, Callbacks, Stop
from recipes.runtime.distributed import any_rank
from recipes.runtime.stop_signals import StopSignal
from recipes.trainer import cadence, metrics
from recipes.trainer.phases import PhaseClock


def _print(message: str) -> None:
    print(f"[recipes] {message}", flush=True)


class Trainer:
    """`steps` runs the model (train_step, evaluate, synced_params, lr, peak_memory_gib: recipes/trainer/steps.py),
    `checkpointer` saves (due_before_training, due, save, wait: recipes/trainer/checkpoint.py); both, and every
    other component, hear the run's events through `callbacks`. `agree` is the ranks' agreement on a flag (a
    collective), `stop_signal` makes the object that records SIGTERM/SIGUSR1, `clock` times the steps, `say`
    prints (rank 0's job)."""

    def __init__(
        self,
        steps: Any,
        checkpointer: Any,
        callbacks: Callbacks,
        *,
        plan: Plan,
        train: TrainingConfig,
        state: TrainState,
        is_last_rank: bool = True,
        agree: Callable[[bool], bool] = any_rank,
        stop_signal: Callable[[], Any] = StopSignal,
        clock: Callable[[], float] = time.perf_counter,
        say: Callable[[str], None] = _print,
    ):
        self.steps, self.checkpointer, self.callbacks = steps, checkpointer, callbacks
        self.plan, self.train_cfg, self.state = plan, train, state
        self.is_last_rank, self.agree, self.stop_signal, self.clock, self.say = (
            is_last_rank,
            agree,
            stop_signal,
            clock,
            say,
        )
        self.evaluation = cadence.EvalPolicy.from_config(train)
        self._ended: Stop | None = None
        # From the moment the run's end is known: where the time after the last step goes (the caller marks the
        # process groups' release and prints it).
        self.end_of_run: PhaseClock | None = None

    # ------------------------------------------------------------------ the run
    def train(self) -> int:
        """Train to the end; the exit status (0, or 3 after a divergence). However the run ends, every callback
        hears run_ends and then stops, once."""
        try:
            stop = self._train()
        except BaseException as err:
            stop = Stop(ERROR, self.state.step, self.state.consumed_samples, detail=f"{type(err).__name__}: {err}")
            if self._ended is None:
                self._ended = stop
                self.callbacks.run_ends(stop)
            raise
        finally:
            self.callbacks.stops(stop)
            self._mark_end_phase("observers and writers stopped")
        return stop.exit_code

    def _train(self) -> Stop:
        state, train_steps = self.state, self.train_cfg.train_steps
        stop_signal = self.stop_signal()
        if self.checkpointer.due_before_training(state.step):
            self.save()
        self.callbacks.training_starts(state)
        last_time = self.clock()
        while state.step < train_steps:
            step = state.step + 1
            self.callbacks.step_starts(step)
            loss, grad_norm = self.steps.train_step()
            state.step, state.consumed_samples = step, state.consumed_samples + self.plan.global_batch_size
            now = self.clock()
            step_time, last_time = now - last_time, now
            fields = self.callbacks.step_ends(step)

            diverged = cadence.divergence(loss, grad_norm)
            if diverged:
                return self._diverged(diverged)
            evaluated = self.evaluation.due(step)
            val_loss = self._validate() if evaluated else None
            self._log_step(loss, grad_norm, step_time, val_loss, evaluated, fields)
            reached = self._target_reached(val_loss)
            end = cadence.step_end(
                step, train_steps, reached, signal_agreed=lambda: self.agree(stop_signal.received is not None)
            )
            if evaluated:
                self.callbacks.evaluation_ends(state, val_loss, end.run_goes_on)
            stop = None if end.run_goes_on else self._end(self._stop_of(end, stop_signal.received))
            if self.checkpointer.due(step, end):
                self.save()
            if stop is not None:
                self._finish_saves()
                self._say_why(stop)
                return stop
            last_time = self.clock()  # checkpoint and eval time stays out of the next step's timing
        # Resumed from the last step's checkpoint: nothing left to train.
        stop = self._end(Stop(FINISHED, state.step, state.consumed_samples))
        self._finish_saves()
        return stop

    def _stop_of(self, end: cadence.StepEnd, signum: int | None) -> Stop:
        reason = TARGET if end.reached else FINISHED if end.finished else SIGNAL
        return Stop(reason, self.state.step, self.state.consumed_samples, signum=signum)

    def _end(self, stop: Stop) -> Stop:
        """The run's end is known (MLPerf's run_stop comes here, before the last save)."""
        self.end_of_run = PhaseClock(self.clock(), what="end of the run", now=self.clock)
        self._ended = stop
        self.callbacks.run_ends(stop)
        return stop

    def _diverged(self, what: str) -> Stop:
        """Every rank knows the (global) gradient norm: they stop together. The save in flight holds a state from
        before the divergence, so it is finished; the last good checkpoint is named."""
        stop = self._end(Stop(DIVERGED, self.state.step, self.state.consumed_samples, detail=what))
        self._finish_saves()
        if self.is_last_rank:  # it knows both the loss and the gradient norm
            latest = latest_checkpoint(self.checkpointer.root)
            print(
                f"[recipes] ERROR: {what} at step {stop.step}: training stopped. Last good checkpoint: "
                f"{latest[1] if latest else 'none saved yet'} (lower training.optimizer.lr, check the data, and "
                "resume from it)",
                flush=True,
            )
        return stop

    def _say_why(self, stop: Stop) -> None:
        if stop.reason == SIGNAL:
            self.say(
                f"stopped by signal at step {stop.step}; checkpoint saved. Run the same command again to continue."
            )
        elif stop.reason == TARGET:
            self.say(f"validation loss reached training.target_val_loss={self.evaluation.target} at step {stop.step}")

    # ------------------------------------------------------------------ saving
    def save(self) -> None:
        step = self.state.step
        self.callbacks.save_starts(step)
        try:
            with self.steps.synced_params():
                self.checkpointer.save(self.state, self.say, in_flight=self.callbacks.save_in_flight)
        finally:
            self.callbacks.save_ends(step)
        self._mark_end_phase("last checkpoint")

    def _finish_saves(self) -> None:
        """Wait for an asynchronous save still being written, as part of saving (every rank: a collective)."""
        step = self.state.step
        self.callbacks.save_starts(step)
        try:
            self.checkpointer.wait()
        finally:
            self.callbacks.save_ends(step)
        self._mark_end_phase("asynchronous writes")

    def _mark_end_phase(self, phase: str) -> None:
        """A phase of the end-of-run line, once the run's end is known (saves during the run are not in it)."""
        if self.end_of_run is not None:
            self.end_of_run.mark(phase)

    # ------------------------------------------------------------------ evaluation and logging
    def _validate(self) -> float | None:
        self.callbacks.evaluation_starts(self.state)
        return self.steps.evaluate()

    def _target_reached(self, val_loss: float | None) -> bool:
        """The last rank knows the validation loss; every rank must agree to stop."""
        return self.evaluation.watches_target and self.agree(self.evaluation.reached(val_loss))

    def _log_step(
        self,
        loss: float | None,
        grad_norm: float,
        step_time: float,
        val_loss: float | None,
        evaluated: bool,
        fields: dict[str, Any],
    ) -> None:
        """The progress line and the step's record for the callbacks (last rank); every rank joins the
        peak-memory reduction of a logged step."""
        state = self.state
        if not cadence.logs_step(state.step, self.train_cfg.log_interval, evaluated):
            return
        peak_memory = self.steps.peak_memory_gib()
        if not self.is_last_rank:
            return
        assert loss is not None, "the last rank is on the last pipeline stage, which has the loss"
        record = metrics.step_metrics(
            self.plan,
            step=state.step,
            loss=loss,
            lr=self.steps.lr(),
            grad_norm=grad_norm,
            step_time_s=step_time,
            consumed_samples=state.consumed_samples,
            val_loss=val_loss,
            peak_memory_gib=peak_memory,
            **fields,
        )
        print(metrics.progress_line(record, self.train_cfg.train_steps), flush=True)
        self.callbacks.logged(record)
