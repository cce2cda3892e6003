"""Whether a job of a chain trains (resilience.job_restarts): every job of the chain is queued up front, each after
the one before ends however it ended (Slurm afterany, Grid Engine -hold_jid), and asks this before it trains.

    python -m common.job_chain begin --run-dir RUN --job-id ID   # exit 0: train; 10: finished; 11: stop
    python -m common.job_chain end --run-dir RUN --job-id ID     # after training: exit 10 once it is finished

A job trains unless training is finished (the trainer recorded its end: train_steps or the validation target) or
the chain must stop: training diverged, or two jobs in a row ended without a new complete checkpoint. One job
without progress may be bad luck (a node failed before the first save): it gets one retry; a second one means
the same failure would repeat forever. The job script cancels the jobs still queued when the answer is not 0.
Plain Python, no third-party package: it runs in the job's environment before anything is built."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
import sys
from typing import Any

from common import run_events
from common.checkpoints import checkpoint_name, latest_checkpoint

TRAIN, FINISHED, STOP = 0, 10, 11


@dataclass(frozen=True)
class Decision:
    code: int  # TRAIN, FINISHED or STOP: the exit status of the command
    line: str  # what the job's log says


def _checkpoints(run_dir: str) -> str:
    return f"{run_dir}/checkpoints"


def newest_step(run_dir: str) -> int:
    """The step of the newest complete checkpoint, -1 without one."""
    latest = latest_checkpoint(_checkpoints(run_dir))
    return latest[0] if latest else -1


def _step_text(step: int) -> str:
    return checkpoint_name(step) if step >= 0 else "none"


def _this_chain(events: list[dict[str, Any]]) -> tuple[int | None, list[dict[str, Any]]]:
    """(jobs in the chain main.py submitted last, or None when it was submitted by hand; the `job` events since)."""
    starts = [i for i, e in enumerate(events) if e["event"] == "chain"]
    since = starts[-1] + 1 if starts else 0
    total = events[starts[-1]].get("jobs") if starts else None
    return total, [e for e in events[since:] if e["event"] == "job"]


def training_outcome(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The trainer's `end` event when it is the last thing the trainer recorded (a later start means it went on)."""
    for entry in reversed(events):
        if entry["event"] == "start":
            return None
        if entry["event"] == "end":
            return entry
    return None


def decide(events: list[dict[str, Any]], job_id: str, newest: int) -> Decision:
    """What job `job_id` does, from the run's events and its newest complete checkpoint."""
    total, jobs = _this_chain(events)
    position = f"{len(jobs) + 1} of {total}" if total else f"{len(jobs) + 1}"
    outcome = training_outcome(events)
    if outcome and outcome.get("finished"):
        return Decision(
            FINISHED,
            f"chain: training finished at step {outcome.get('step')}: job {job_id} "
            f"({position}) has nothing to do; the jobs queued after it are cancelled",
        )
    if outcome:
        return Decision(
            STOP,
            f"chain: stopped: training ended at step {outcome.get('step')} ("
            f"{outcome.get('reason') or 'not finished'}) and would end the same way again; "
            f"job {job_id} ({position}) does not train (see the training log)",
        )
    trained = [j for j in jobs if j.get("decision") == "train"]
    if len(trained) >= 2 and all(j.get("checkpoint_step") == newest for j in trained[-2:]):
        a, b = (j.get("job_id") for j in trained[-2:])
        return Decision(
            STOP,
            f"chain: stopped: jobs {a} and {b} both ended without a new checkpoint (the newest "
            f"is still {_step_text(newest)}), so the same failure would repeat; job {job_id} "
            f"({position}) does not train: fix what their logs show and submit the run again",
        )
    return Decision(TRAIN, f"chain: job {job_id} ({position}) trains from checkpoint {_step_text(newest)}")


def begin(run_dir: str, job_id: str) -> Decision:
    """Decide, and record the decision (a `job` event) for the jobs after this one and for the report."""
    newest = newest_step(run_dir)
    decision = decide(run_events.read(run_dir), job_id, newest)
    name = {TRAIN: "train", FINISHED: "finished", STOP: "stop"}[decision.code]
    extra = {} if decision.code == TRAIN else {"reason": decision.line}
    run_events.record(run_dir, "job", job_id=str(job_id), checkpoint_step=newest, decision=name, **extra)
    return decision


def end(run_dir: str, job_id: str) -> Decision:
    """After this job trained: FINISHED when training is, so that the jobs still queued are cancelled; otherwise
    TRAIN (the next job goes on), with a line when this was the chain's last job."""
    events = run_events.read(run_dir)
    outcome = training_outcome(events)
    if outcome and outcome.get("finished"):
        return Decision(
            FINISHED,
            f"chain: training finished at step {outcome.get('step')} in job {job_id}; the "
            "jobs queued after it are cancelled",
        )
    total, jobs = _this_chain(events)
    if total and len(jobs) >= total:
        return Decision(
            TRAIN,
            f"chain: job {job_id} was the last of the chain's {total} jobs and training is not "
            f"finished (newest checkpoint {_step_text(newest_step(run_dir))}); submit the run "
            "again to continue it (or raise resilience.job_restarts)",
        )
    return Decision(TRAIN, "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("when", choices=("begin", "end"))
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--job-id", required=True)
    args = parser.parse_args(argv)
    decision = (begin if args.when == "begin" else end)(args.run_dir, args.job_id)
    if decision.line:
        print(decision.line, flush=True)
    return decision.code


if __name__ == "__main__":
    sys.exit(main())
