"""A stand-in for `python -m recipes.train` in the CPU tests of job chains (tests/slurm, tests/sge): no GPU and no
model, but it resumes, steps, checkpoints, stops and records its events the way the trainer does: the same
checkpoint files (common/checkpoints.py: partial name, then rename), the same stop signals (SIGUSR1 before the
time limit: save, exit 0), the same guard recording the run's events (recipes/resilience/guard.py). The job runs
it when its working directory is this one (the directory comes first on sys.path for `python -m`). What it does
is read from standin.json there: {"step_s": seconds per step, "fail": exit 1 before the first step}."""

from __future__ import annotations

import json
import os
import sys
import time

from common import run_events
from common.checkpoints import (
    TrainState,
    finalize_checkpoint,
    latest_checkpoint,
    partial_path,
    prune_checkpoints,
    remove_partials,
)
from common.run import load_run_config
from recipes.resilience.guard import RunGuard
from recipes.runtime.callbacks import FINISHED, SIGNAL, Stop
from recipes.runtime.stop_signals import StopSignal


def save(root: str, step: int, keep_last: int) -> None:
    started = time.perf_counter()
    partial = partial_path(root, step, f"standin{os.getpid()}")
    os.makedirs(partial)
    with open(os.path.join(partial, "shard.bin"), "wb") as f:
        f.write(os.urandom(1024))
    finalize_checkpoint(root, TrainState(step=step, consumed_samples=step * 8), partial)
    prune_checkpoints(root, keep_last)
    run_events.record(
        os.path.dirname(root),
        "checkpoint",
        step=step,
        blocking_s=round(time.perf_counter() - started, 3),
        complete_s=round(time.perf_counter() - started, 3),
        **{"async": False},
    )
    print(f"[stand-in] saved checkpoint iter_{step:07d}", flush=True)


def main() -> int:
    run_dir = sys.argv[sys.argv.index("--run-dir") + 1]
    cfg = load_run_config(run_dir)
    behaviour = json.load(open("standin.json")) if os.path.exists("standin.json") else {}
    train = cfg.training
    steps, interval, keep = train.train_steps, train.checkpoint.interval, train.checkpoint.keep_last
    stop = StopSignal()
    guard = RunGuard(run_dir, cfg.resilience, 0, 1)
    root = os.path.join(run_dir, "checkpoints")
    os.makedirs(root, exist_ok=True)
    remove_partials(root)
    latest = latest_checkpoint(root)
    step = latest[0] if latest else 0
    print(f"[stand-in] starting at step {step} of {steps}", flush=True)
    guard.training_starts(TrainState(step=step, consumed_samples=step * 8))
    if behaviour.get("fail"):
        print("[stand-in] failing before its first step", flush=True)
        return 1
    metrics = open(os.path.join(run_dir, "metrics.jsonl"), "a")
    while step < steps:
        time.sleep(float(behaviour.get("step_s", 0.5)))
        step += 1
        metrics.write(json.dumps({"step": step, "loss": 10.0 / step, "step_time_s": 0.5}) + "\n")
        metrics.flush()
        guard.step_ends(step)
        if (interval and step % interval == 0) or step == steps:
            save(root, step, keep)
        elif stop.received:
            save(root, step, keep)
        if stop.received and step < steps:
            guard.stops(Stop(SIGNAL, step, step * 8, signum=stop.received))
            print(f"[stand-in] stopped by signal at step {step}; checkpoint saved", flush=True)
            return 0
    guard.stops(Stop(FINISHED, step, step * 8))
    print(f"[stand-in] finished at step {step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
