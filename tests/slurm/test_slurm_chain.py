"""resilience.job_restarts against a real one-node Slurm: main.py queues the chain of training jobs (afterany),
each job runs the rendered submission.sbatch (its chain check, training, the check after it, the report), and a
stand-in trainer (tests/standin/: it resumes, steps, checkpoints and stops on SIGUSR1 as the trainer does, on the
CPU) takes the GPU trainer's place. The cluster has no GPUs, so the jobs run bare metal."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from common import run_events

from cluster_jobs import submit_with_main

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "tests" / "standin"
BARE_METAL = [
    "cluster=bcm",
    "cluster.container_runtime=none",
    "cluster.gpus_per_node=null",
    "cluster.ntasks_per_node=1",
    "cluster.exclusive=false",
]


def submit_chain(tmp_path: Path, behaviour: dict, *overrides: str) -> tuple[Path, list[dict]]:
    """main.py with the chain; the jobs run in a copy of the stand-in's directory (--chdir), where
    `python -m recipes.train` finds the stand-in."""
    workdir = tmp_path / "standin"
    shutil.copytree(STANDIN, workdir)
    (workdir / "standin.json").write_text(json.dumps(behaviour))
    run_dir = tmp_path / "results" / "chain"
    _, jobs = submit_with_main(
        [
            *BARE_METAL,
            f"results_dir={tmp_path}/results",
            "run_name=chain",
            "resilience.job_restarts=3",
            "training.train_steps=30",
            "training.checkpoint.interval=5",
            f'cluster.sbatch_args=["--chdir={workdir}"]',
            *overrides,
        ],
        os.environ,
        run_dir,
    )
    assert [j["stage"] for j in jobs] == ["training"] * 4
    assert [j["dependency"] for j in jobs[1:]] == [f"afterany:{j['job_id']}" for j in jobs[:-1]]
    return run_dir, jobs


def log_of(run_dir: Path, job_id: str, suffix: str = ".out") -> str:
    path = run_dir / "logs" / f"training_{job_id}{suffix}"
    return path.read_text() if path.exists() else ""


def states(slurm_cluster, jobs: list[dict]) -> list[str]:
    return [slurm_cluster.wait(j["job_id"], timeout_s=600)[1] for j in jobs]


@pytest.mark.slow
def test_a_chain_continues_job_after_job_until_training_finishes(slurm_cluster, tmp_path):
    # A 1-minute limit with the warning 45 s before it: each job trains for some seconds, saves on SIGUSR1 and
    # leaves the rest to the next one (Slurm sends the warning within about a minute of the time asked).
    run_dir, jobs = submit_chain(
        tmp_path, {"step_s": 1.0}, "cluster.time_limit=00:01:00", "cluster.signal_before_timeout_s=45"
    )
    final = states(slurm_cluster, jobs)
    logs = {j["job_id"]: log_of(run_dir, j["job_id"]) + log_of(run_dir, j["job_id"], ".err") for j in jobs}
    events = run_events.read(str(run_dir))
    print("\njob states:", final)
    for entry in events:
        print("event:", json.dumps(entry))
    ends = [e for e in events if e["event"] == "end"]
    assert ends and ends[-1]["finished"] and ends[-1]["step"] == 30, events
    assert (run_dir / "checkpoints" / "iter_0000030" / "train_state.json").exists()
    trained = [e for e in events if e["event"] == "job" and e["decision"] == "train"]
    stops = [e for e in events if e["event"] == "stop"]
    assert len(trained) >= 2 and stops, "training should have taken more than one job"
    # Every job that trained started from a newer checkpoint than the one before.
    steps = [e["checkpoint_step"] for e in trained]
    assert steps == sorted(set(steps)), steps
    # The jobs after the one that finished: cancelled while queued, or (if already started) nothing to do.
    last = trained[-1]["job_id"]
    after = [j for j in jobs if int(j["job_id"]) > int(last)]
    for job, state in zip(jobs, final):
        if job in after:
            assert state.startswith("CANCELLED") or "has nothing to do" in logs[job["job_id"]], (job, state)
    assert "chain: training finished at step 30" in log_of(run_dir, last)


def test_a_job_that_fails_without_progress_is_retried_once_then_the_chain_stops(slurm_cluster, tmp_path):
    run_dir, jobs = submit_chain(tmp_path, {"fail": True}, "cluster.time_limit=00:10:00")
    final = states(slurm_cluster, jobs)
    print("\njob states:", final)
    first, retry, third, fourth = jobs
    assert final[0].startswith("FAILED") and final[1].startswith("FAILED"), final
    stop_line = [line for line in log_of(run_dir, third["job_id"]).splitlines() if line.startswith("chain: stopped")]
    print(stop_line[0] if stop_line else log_of(run_dir, third["job_id"]))
    assert (
        stop_line
        and f"jobs {first['job_id']} and {retry['job_id']} both ended without a new checkpoint" in stop_line[0]
    )
    assert final[2].startswith("FAILED"), final  # the stopping job says so in its state too
    assert final[3].startswith("CANCELLED") and not log_of(run_dir, fourth["job_id"]), final
    decisions = [e["decision"] for e in run_events.read(str(run_dir)) if e["event"] == "job"]
    assert decisions == ["train", "train", "stop"]
