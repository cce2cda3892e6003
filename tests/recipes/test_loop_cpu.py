"""The training loop's decisions without a GPU: the policies it asks (recipes/trainer/cadence.py) on their own,
then Trainer.train itself with stand-ins for the step, the evaluation, the save and the collectives, recording
the order of everything it does within a step (saves after evaluation, MLLOG events at their points, the stops),
and an MLPerf run through the real observers judged by mlperf-logging's compliance checker."""

from __future__ import annotations

import contextlib
import gc
import json
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from common.checkpoints import TrainState
from launcher.config.compose import compose
from launcher.plan.build import build_plan
from launcher.report.mlperf import compliance_problems
from recipes.observability.mlperf import MLPerfLog
from recipes.observability.observers import Observers
from recipes.trainer import checkpoint, loop
from recipes.trainer.cadence import EvalPolicy, GCPolicy, SavePolicy, StepEnd, divergence, logs_step, step_end
from recipes.resilience.guard import RunGuard
from recipes.trainer.ranks import RankInfo


def never() -> bool:
    raise AssertionError("the stop signal was asked about on a step that ends the run anyway")


def saved_steps(policy: SavePolicy, last_step: int, signal_at: int | None = None) -> list[int]:
    saved = []
    for step in range(1, last_step + 1):
        end = step_end(step, last_step, False, lambda step=step: step == signal_at)
        if policy.saves_after(step, end):
            saved.append(step)
        if not end.run_goes_on:
            break
    return saved


# ----------------------------------------------------------------------------- the policies
def test_the_checkpointer_saves_every_interval_at_the_end_and_on_a_signal():
    assert saved_steps(SavePolicy(interval=50, at_end=True, initial=False), 200) == [50, 100, 150, 200]
    assert saved_steps(SavePolicy(interval=30, at_end=True, initial=False), 100) == [30, 60, 90, 100]
    assert saved_steps(SavePolicy(interval=30, at_end=False, initial=False), 100) == [30, 60, 90]
    assert saved_steps(SavePolicy(interval=0, at_end=True, initial=False), 100) == [100]
    assert saved_steps(SavePolicy(interval=0, at_end=False, initial=False), 100) == []
    # A signal at step 42: the periodic save before it, then one at 42, and the run stops there.
    assert saved_steps(SavePolicy(interval=30, at_end=False, initial=False), 100, signal_at=42) == [30, 42]
    policy = SavePolicy.from_config({"interval": 10, "save_at_end": False, "save_initial": True})
    assert policy.saves_before_training(0) and not policy.saves_before_training(10)
    assert not SavePolicy.from_config({"interval": 10, "save_at_end": True}).saves_before_training(0)


def test_a_step_ends_the_run_when_it_is_the_last_the_target_is_reached_or_every_rank_saw_a_signal():
    assert step_end(7, 10, False, lambda: False) == StepEnd(finished=False, reached=False, stopping=False)
    assert step_end(7, 10, False, lambda: True) == StepEnd(finished=False, reached=False, stopping=True)
    assert not step_end(7, 10, False, lambda: True).run_goes_on
    # The last step and a reached target finish the run without asking about a signal (a collective).
    assert step_end(10, 10, False, never) == StepEnd(finished=True, reached=False, stopping=False)
    assert step_end(4, 10, True, never) == StepEnd(finished=True, reached=True, stopping=False)


def test_evaluation_every_val_interval_and_after_the_last_step():
    assert [s for s in range(1, 101) if EvalPolicy(30, 100, None).due(s)] == [30, 60, 90, 100]
    assert [s for s in range(1, 41) if EvalPolicy(10, 40, None).due(s)] == [10, 20, 30, 40]
    assert not any(EvalPolicy(0, 100, None).due(s) for s in range(1, 101))
    policy = EvalPolicy.from_config({"val_interval": 10, "train_steps": 40, "target_val_loss": 3.3})
    assert policy.watches_target and policy.reached(3.3) and policy.reached(2.0)
    assert not policy.reached(3.31) and not policy.reached(None)  # ranks without the loss, steps without one
    assert not EvalPolicy(0, 40, 3.3).watches_target and not EvalPolicy(0, 40, 3.3).reached(1.0)
    assert not EvalPolicy(10, 40, None).watches_target


def test_what_diverged_is_named_and_finite_steps_go_on():
    assert divergence(2.5, 1.0) is None and divergence(None, 1.0) is None
    assert divergence(float("nan"), 1.0) == "loss=nan"
    assert divergence(float("inf"), float("nan")) == "loss=inf"  # the loss first, as the last rank sees both
    assert divergence(None, float("inf")) == "grad_norm=inf"
    assert divergence(2.5, float("nan")) == "grad_norm=nan"


def test_logged_steps_and_garbage_collection():
    assert [s for s in range(1, 11) if logs_step(s, 5, evaluated=False)] == [5, 10]
    assert logs_step(3, 5, evaluated=True)  # a step that evaluated is logged, on every rank alike
    assert [s for s in range(1, 301) if GCPolicy().due(s)] == [100, 200, 300]


@pytest.fixture
def collector_back_on():
    yield
    gc.enable()


def test_the_gc_policy_turns_the_collector_off(collector_back_on):
    GCPolicy().start()
    assert not gc.isenabled()


# ----------------------------------------------------------------------------- Trainer.train, step by step
class RecordingObservers:
    def __init__(self, events: list[str]):
        self.events = events

    def step_begins(self, step):
        self.events.append(f"begin {step}")

    def step_ended(self, step):
        self.events.append(f"end {step}")

    @contextlib.contextmanager
    def range(self, name):
        self.events.append(f"range {name}")
        yield

    def log(self, record):
        self.events.append(f"log {record.step}" + (f" val={record.val_loss}" if record.val_loss is not None else ""))

    def run_starts(self, consumed_samples, resume_step):
        self.events.append(f"run_start {consumed_samples} {resume_step}")

    def evaluation_starts(self, consumed_samples):
        self.events.append(f"eval_start {consumed_samples}")

    def evaluation_ended(self, consumed_samples, val_loss, run_goes_on):
        self.events.append(f"eval_stop {consumed_samples} {val_loss} goes_on={run_goes_on}")

    def run_stops(self, reached_target, consumed_samples):
        self.events.append(f"run_stop {reached_target} {consumed_samples}")


class RecordingCheckpointer(checkpoint.Checkpointer):
    """The real policy questions (due, due_before_training); the writing recorded."""

    def __init__(self, policy: SavePolicy, events: list[str]):
        self.policy, self.events, self.root = policy, events, "/nonexistent"

    def poll(self):
        pass

    def wait(self):
        self.events.append("wait")

    def close(self):
        self.events.append("close")


class FakeStop:
    made: list["FakeStop"] = []

    def __init__(self):
        self.received = None
        FakeStop.made.append(self)


def fake_trainer(monkeypatch, events, overrides, *, losses=None, val_losses=(), signal_at=None, observers=None):
    """A Trainer whose step, evaluation, save and collectives are stand-ins (one rank, the last one)."""
    cfg = compose(overrides)
    trainer = loop.Trainer.__new__(loop.Trainer)
    trainer.cfg, trainer.plan, trainer.train_cfg = cfg, build_plan(cfg), cfg["training"]
    trainer.state = TrainState(step=0, consumed_samples=0)
    trainer.info, trainer.is_last_rank = RankInfo(0, 0, 1, "127.0.0.1", 0), True
    trainer.observers = observers or RecordingObservers(events)
    # The real guard, in a run directory of its own: no monitor (not under ft_launcher), no fault, no detector.
    trainer.guard = RunGuard(tempfile.mkdtemp(), cfg, 0, 1)
    trainer.checkpointer = RecordingCheckpointer(SavePolicy.from_config(trainer.train_cfg["checkpoint"]), events)
    trainer.evaluation = EvalPolicy.from_config(trainer.train_cfg)
    trainer.gc_policy = GCPolicy()
    trainer.metrics_writer = SimpleNamespace(write=lambda record: None, close=lambda: events.append("metrics closed"))
    trainer.scheduler = SimpleNamespace(get_lr=lambda group: 1e-4)
    trainer.optimizer = SimpleNamespace(param_groups=[{}])
    trainer.say = lambda message: events.append(f"say {message}")
    trainer.save = lambda: events.append(f"save {trainer.state.step}")
    trainer._peak_memory_gib = lambda: 1.0
    losses = losses or {}
    evaluations = iter(val_losses)

    def train_step():
        step = trainer.state.step + 1
        events.append(f"train {step}")
        if step == signal_at:
            FakeStop.made[-1].received = signal.SIGTERM
        return losses.get(step, (2.0, 1.0))

    def evaluate():
        events.append(f"evaluate {trainer.state.step}")
        return next(evaluations)

    def agree(flag):
        events.append(f"agree {bool(flag)}")
        return bool(flag)

    trainer.train_step, trainer.evaluate = train_step, evaluate
    monkeypatch.setattr(loop.distributed, "any_rank", agree)
    monkeypatch.setattr(loop, "StopSignal", FakeStop)
    clock = iter(range(1, 10**7))
    monkeypatch.setattr(loop, "time", SimpleNamespace(perf_counter=lambda: float(next(clock))))
    return trainer


SHORT = [
    "training.train_steps=6",
    "training.val_interval=2",
    "training.log_interval=3",
    "training.checkpoint.interval=3",
    "training.checkpoint.save_at_end=true",
]


def test_a_run_saves_after_evaluating_and_logging_and_stops_after_its_last_step(monkeypatch, collector_back_on):
    events: list[str] = []
    trainer = fake_trainer(
        monkeypatch, events, [*SHORT, "training.checkpoint.save_initial=true"], val_losses=[5.0, 4.0, 3.0]
    )
    assert trainer.train() == 0
    gbs = trainer.plan.global_batch_size
    assert events == [
        "save 0",
        "run_start 0 0",
        "begin 1",
        "train 1",
        "end 1",
        "agree False",
        "begin 2",
        "train 2",
        "end 2",
        f"eval_start {2 * gbs}",
        "range validation",
        "evaluate 2",
        "log 2 val=5.0",
        "agree False",
        f"eval_stop {2 * gbs} 5.0 goes_on=True",
        "begin 3",
        "train 3",
        "end 3",
        "log 3",
        "agree False",
        "save 3",
        "begin 4",
        "train 4",
        "end 4",
        f"eval_start {4 * gbs}",
        "range validation",
        "evaluate 4",
        "log 4 val=4.0",
        "agree False",
        f"eval_stop {4 * gbs} 4.0 goes_on=True",
        "begin 5",
        "train 5",
        "end 5",
        "agree False",
        "begin 6",
        "train 6",
        "end 6",
        f"eval_start {6 * gbs}",
        "range validation",
        "evaluate 6",
        "log 6 val=3.0",
        f"eval_stop {6 * gbs} 3.0 goes_on=False",
        f"run_stop False {6 * gbs}",
        "save 6",
        "close",
        "metrics closed",
    ]
    assert not gc.isenabled()


def test_an_agreed_signal_ends_the_step_with_a_save_then_the_run(monkeypatch, collector_back_on):
    events: list[str] = []
    trainer = fake_trainer(monkeypatch, events, SHORT, val_losses=[5.0, 4.0], signal_at=4)
    assert trainer.train() == 0
    gbs = trainer.plan.global_batch_size
    assert events[events.index("begin 4") :] == [
        "begin 4",
        "train 4",
        "end 4",
        f"eval_start {4 * gbs}",
        "range validation",
        "evaluate 4",
        "log 4 val=4.0",
        "agree True",
        f"eval_stop {4 * gbs} 4.0 goes_on=False",
        f"run_stop False {4 * gbs}",
        "save 4",
        "wait",
        "say stopped by signal at step 4; checkpoint saved. Run the same command again to continue.",
        "close",
        "metrics closed",
    ]


def test_a_reached_target_is_agreed_on_every_step_and_ends_the_run_as_a_success(monkeypatch, collector_back_on):
    events: list[str] = []
    trainer = fake_trainer(
        monkeypatch,
        events,
        [*SHORT, "training.checkpoint.interval=0", "training.target_val_loss=3.5"],
        val_losses=[5.0, 3.4],
    )
    assert trainer.train() == 0
    gbs = trainer.plan.global_batch_size
    assert events == [
        "run_start 0 0",
        "begin 1",
        "train 1",
        "end 1",
        "agree False",
        "agree False",  # the target, then the signal
        "begin 2",
        "train 2",
        "end 2",
        f"eval_start {2 * gbs}",
        "range validation",
        "evaluate 2",
        "log 2 val=5.0",
        "agree False",
        "agree False",
        f"eval_stop {2 * gbs} 5.0 goes_on=True",
        "begin 3",
        "train 3",
        "end 3",
        "log 3",
        "agree False",
        "agree False",
        "begin 4",
        "train 4",
        "end 4",
        f"eval_start {4 * gbs}",
        "range validation",
        "evaluate 4",
        "log 4 val=3.4",
        "agree True",
        f"eval_stop {4 * gbs} 3.4 goes_on=False",
        f"run_stop True {4 * gbs}",
        "save 4",
        "say validation loss reached training.target_val_loss=3.5 at step 4",
        "close",
        "metrics closed",
    ]


def test_a_diverging_step_stops_the_run_before_evaluating_or_saving(monkeypatch, capsys, collector_back_on):
    events: list[str] = []
    trainer = fake_trainer(monkeypatch, events, SHORT, losses={3: (float("nan"), 1.0)}, val_losses=[5.0])
    assert trainer.train() == 3
    gbs = trainer.plan.global_batch_size
    assert events[events.index("begin 3") :] == ["begin 3", "train 3", "end 3", f"run_stop False {3 * gbs}"]
    assert (
        "[recipes] ERROR: loss=nan at step 3: training stopped. Last good checkpoint: none saved yet"
        in capsys.readouterr().out
    )


# ----------------------------------------------------------------------------- MLPerf logging as an observer
class Clock:
    def __init__(self, start: float = 1_700_000_000.0, step: float = 0.25):
        self.now, self.step = start, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


@pytest.fixture
def world_of_one(tmp_path):
    """The barrier an MLPerf run's start makes, in a gloo group of this process alone."""
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    yield
    torch.distributed.destroy_process_group()


def test_an_mlperf_run_through_the_observers_passes_the_compliance_checker(
    monkeypatch, tmp_path, world_of_one, collector_back_on
):
    overrides = [
        "training=mlperf/llama31_8b",
        "cluster=bcm",
        "dry_run=true",
        "telemetry.enabled=false",
        "logging.tensorboard=false",
        "training.log_interval=100",
    ]
    cfg = compose(overrides)
    target = cfg["training"]["target_val_loss"]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    observers = Observers(str(run_dir), cfg, build_plan(cfg), RankInfo(0, 0, 1, "127.0.0.1", 0))
    # What init_starts opens on the logging rank of a GPU run (cache_clear, init_start).
    observers.mllog = MLPerfLog.open(
        str(run_dir), cfg, build_plan(cfg), True, cache_cleared=False, gpu_name="NVIDIA H100 80GB HBM3", clock=Clock()
    )
    trainer = fake_trainer(
        monkeypatch,
        [],
        overrides,
        observers=observers,
        val_losses=[target + 3.0, target + 1.0, target + 0.1, target - 0.05],
    )
    assert trainer.train() == 0
    log = run_dir / cfg["mlperf"]["log_file"]
    events = [json.loads(line.split(":::MLLOG ", 1)[1]) for line in log.read_text().splitlines()]
    keys = [e["key"] for e in events]
    every = cfg["training"]["val_interval"] * trainer.plan.global_batch_size
    assert [e["metadata"]["samples_count"] for e in events if e["key"] == "eval_accuracy"] == [
        every,
        2 * every,
        3 * every,
        4 * every,
    ]
    assert keys[-2:] == ["run_stop", "train_samples"] and events[-2]["metadata"]["status"] == "success"
    # The file and line each event names are the trainer's call of its observers.
    assert {e["metadata"]["file"] for e in events if e["key"] in ("run_start", "eval_start", "run_stop")} == {
        "recipes/trainer/loop.py"
    }
    assert compliance_problems(log, "llama31_8b", "6.1.0") == []


# ----------------------------------------------------------------------------- the end of a run
REPO = Path(__file__).resolve().parents[2]
EXIT_AFTER_TRAINING = """
import gc
import sys
from recipes.trainer import data
from recipes.trainer.cadence import GCPolicy
from recipes.trainer.stop_signals import StopSignal


class Samples:
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return {name: [i] * 8 for name in data.BATCH_FIELDS}


class Trainer:  # held by a reference cycle, as the real one is
    def __init__(self):
        self.me = self


StopSignal()
policy = GCPolicy()
policy.start()
trainer = Trainer()
trainer.iters = data.make_loader(Samples(), 0, 2, 0, 1, num_workers=2)
next(trainer.iters)
if sys.argv[1] == "close":
    data.close_loader(trainer.iters)
del trainer
policy.stop()
gc.collect()
print("exiting", flush=True)
"""


def test_a_run_ends_with_its_data_workers_shut_down_so_the_process_exits():
    # Left to the garbage collector, the iterator's finalizer cannot reach its workers, which block SIGTERM
    # (helpers_immune_to_stop_signals): the interpreter's exit would then wait for them forever (`python -c
    # "$EXIT_AFTER_TRAINING" leave` does). close_loader shuts them down first.
    result = subprocess.run(
        [sys.executable, "-c", EXIT_AFTER_TRAINING, "close"], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0 and "exiting" in result.stdout, result.stderr[-3000:]
