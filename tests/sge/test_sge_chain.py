"""resilience.job_restarts against a real one-node Grid Engine: main.py queues the chain of training jobs
(-hold_jid), each job runs the rendered submission.qsub (its chain check, training, the check after it, the
report), and a stand-in trainer (tests/standin/: it resumes, steps, checkpoints and stops on SIGUSR1 as the
trainer does, on the CPU) takes the GPU trainer's place, started by a stand-in mpirun (one rank; the cell has no
Open MPI). The jobs run bare metal without a node resource."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from common import run_events

from cluster_jobs import submit_with_main

pytestmark = pytest.mark.sge

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "tests" / "standin"


def submit_chain(grid_engine, tmp_path: Path, behaviour: dict, *overrides: str) -> tuple[Path, list[dict]]:
    """main.py with the chain; the jobs run in a copy of the stand-in's directory (-wd), where `python -m
    recipes.train` finds the stand-in, with the stand-in mpirun first on PATH (cluster.setup)."""
    workdir = tmp_path / "standin"
    shutil.copytree(STANDIN, workdir)
    (workdir / "standin.json").write_text(json.dumps(behaviour))
    run_dir = tmp_path / "results" / "chain"
    _, jobs = submit_with_main(
        [
            "cluster=sge",
            "cluster.container_runtime=none",
            "cluster.node_resource=null",
            f"results_dir={tmp_path}/results",
            "run_name=chain",
            "resilience.job_restarts=3",
            "training.train_steps=30",
            "training.checkpoint.interval=5",
            f'cluster.qsub_args=["-wd {workdir}"]',
            f'cluster.setup=["export PATH={workdir}/bin:$PATH"]',
            *overrides,
        ],
        grid_engine.env,
        run_dir,
    )
    assert [j["stage"] for j in jobs] == ["training"] * 4
    assert [j["dependency"] for j in jobs[1:]] == [f"hold_jid:{j['job_id']}" for j in jobs[:-1]]
    return run_dir, jobs


def log_of(run_dir: Path, job_id: str) -> str:
    path = run_dir / "logs" / f"training_{job_id}.out"
    return path.read_text() if path.exists() else ""


def wait_until_gone(grid_engine, jobs: list[dict], timeout_s: int = 600) -> None:
    """Until no job of the chain is queued or running."""
    deadline = time.monotonic() + timeout_s
    while any(grid_engine.states(j["job_id"]) for j in jobs):
        assert time.monotonic() < deadline, [grid_engine.states(j["job_id"]) for j in jobs]
        time.sleep(2)


@pytest.mark.slow
def test_a_chain_continues_job_after_job_until_training_finishes(grid_engine, tmp_path):
    # h_rt of 1 minute, SIGUSR1 at s_rt 45 s before it: each job trains a while, saves, and leaves the rest.
    run_dir, jobs = submit_chain(
        grid_engine, tmp_path, {"step_s": 1.0}, "cluster.time_limit=00:01:00", "cluster.signal_before_timeout_s=45"
    )
    try:
        wait_until_gone(grid_engine, jobs)
    finally:
        grid_engine.delete(*[j["job_id"] for j in jobs])
    events = run_events.read(str(run_dir))
    for entry in events:
        print("event:", json.dumps(entry))
    ends = [e for e in events if e["event"] == "end"]
    assert ends and ends[-1]["finished"] and ends[-1]["step"] == 30, events
    trained = [e for e in events if e["event"] == "job" and e["decision"] == "train"]
    assert len(trained) >= 2 and [e for e in events if e["event"] == "stop"]
    steps = [e["checkpoint_step"] for e in trained]
    assert steps == sorted(set(steps)), steps
    last = trained[-1]["job_id"]
    assert "chain: training finished at step 30" in log_of(run_dir, last)
    # The jobs after it were deleted while queued, or (had one started) found nothing to do.
    for job in jobs:
        if int(job["job_id"]) > int(last):
            assert not log_of(run_dir, job["job_id"]) or "has nothing to do" in log_of(run_dir, job["job_id"])


def test_a_job_that_fails_without_progress_is_retried_once_then_the_chain_stops(grid_engine, tmp_path):
    run_dir, jobs = submit_chain(grid_engine, tmp_path, {"fail": True}, "cluster.time_limit=00:10:00")
    try:
        wait_until_gone(grid_engine, jobs)
    finally:
        grid_engine.delete(*[j["job_id"] for j in jobs])
    first, retry, third, fourth = jobs
    lines = [line for line in log_of(run_dir, third["job_id"]).splitlines() if line.startswith("chain: stopped")]
    print("\n" + (lines[0] if lines else log_of(run_dir, third["job_id"])))
    assert lines and f"jobs {first['job_id']} and {retry['job_id']} both ended without a new checkpoint" in lines[0]
    assert not log_of(run_dir, fourth["job_id"])  # deleted while it waited
    decisions = [e["decision"] for e in run_events.read(str(run_dir)) if e["event"] == "job"]
    assert decisions == ["train", "train", "stop"]
