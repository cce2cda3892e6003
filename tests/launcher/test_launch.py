"""Submission and local runs, in process: the afterok chain against a stand-in sbatch (the real Slurm test is
tests/slurm/), cancelling a half-submitted chain, and a real local data preparation on a machine without GPU."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time

import pytest

from launcher.cli import launch
from launcher.config.compose import compose
from launcher.jobs.render import Job
from launcher.jobs.submit import run_here
from launcher.platforms.local import PLATFORM as LOCAL

from launcher_helpers import NO_GPU

FAKE_SBATCH = """#!/usr/bin/env bash
n=$(( $(cat "$FAKE_STATE/count" 2>/dev/null || echo 100) + 1 ))
echo "$n" > "$FAKE_STATE/count"
echo "$*" >> "$FAKE_STATE/sbatch_calls"
if [ "$n" = "${FAKE_FAIL_AT:-none}" ]; then
    echo "sbatch: error: Batch job submission failed: Invalid account" >&2
    exit 1
fi
echo "$n;local"
"""
FAKE_SCANCEL = """#!/usr/bin/env bash
echo "$*" >> "$FAKE_STATE/scancel_calls"
"""


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    bin_dir.mkdir()
    state.mkdir()
    for name, text in (("sbatch", FAKE_SBATCH), ("scancel", FAKE_SCANCEL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755 | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_STATE", str(state))
    return state


BARE_METAL = [
    "cluster=bcm",
    "cluster.container_runtime=none",
    "cluster.gpus_per_node=null",
    "cluster.ntasks_per_node=1",
]


def test_stages_are_chained_with_afterok(cfg_for, fake_slurm, corpus, tmp_path, capsys):
    cfg = cfg_for(
        *BARE_METAL,
        "stages=[data_preparation,training]",
        "data_preparation=files",
        f"data_preparation.inputs=[{corpus}/*.jsonl]",
        f"data_preparation.output_dir={tmp_path}/data",
    )
    assert launch(cfg) == 0
    calls = (fake_slurm / "sbatch_calls").read_text().splitlines()
    run_dir = tmp_path / "results" / "llama31_tiny_bf16_tp1_1gpu"
    assert calls == [
        f"--parsable {run_dir}/data_preparation.sbatch",
        f"--parsable --dependency=afterok:101 {run_dir}/data_check.sbatch",
        f"--parsable --dependency=afterok:102 {run_dir}/submission.sbatch",
    ]
    jobs = json.loads((run_dir / "jobs.json").read_text())
    assert [(j["stage"], j["job_id"], j["dependency"]) for j in jobs] == [
        ("data_preparation", "101", None),
        ("data_check", "102", "afterok:101"),
        ("training", "103", "afterok:102"),
    ]
    out = capsys.readouterr().out
    assert "submitted training: job 103 (--dependency=afterok:102)" in out
    assert f"log {run_dir}/logs/data_preparation_101_*.out" in out


def test_a_failed_sbatch_cancels_the_jobs_already_queued(cfg_for, fake_slurm, monkeypatch, corpus, tmp_path, capsys):
    monkeypatch.setenv("FAKE_FAIL_AT", "103")
    cfg = cfg_for(
        *BARE_METAL,
        "stages=[data_preparation,training]",
        "data_preparation=files",
        f"data_preparation.inputs=[{corpus}/*.jsonl]",
        f"data_preparation.output_dir={tmp_path}/data",
    )
    assert launch(cfg) == 1
    assert (fake_slurm / "scancel_calls").read_text().split() == ["101", "102"]
    err = capsys.readouterr().err
    assert "sbatch submission.sbatch failed: sbatch: error: Batch job submission failed: Invalid account" in err
    assert "cancelled the jobs already queued for this run: 101, 102" in err


def test_resubmitting_a_run_keeps_its_job_history(cfg_for, fake_slurm, tmp_path):
    cfg = cfg_for(*BARE_METAL)
    assert launch(cfg) == 0 and launch(cfg) == 0
    jobs = json.loads((tmp_path / "results" / "llama31_tiny_bf16_tp1_1gpu" / "jobs.json").read_text())
    assert [j["job_id"] for j in jobs] == ["101", "102"]


def test_local_data_preparation_runs_here_then_says_why_it_did_not_train(
    cfg_for, corpus, sp_tokenizer, tmp_path, capsys
):
    """Without GPU the data preparation stage still runs (CPU): real .bin/.idx files, checked, then the reason
    training did not start."""
    cfg = cfg_for(
        "stages=[data_preparation,training]",
        "data_preparation=files",
        f"data_preparation.inputs=[{corpus}/*.jsonl]",
        f"data_preparation.output_dir={tmp_path}/data",
        "training.tokenizer.type=sentencepiece",
        f"training.tokenizer.path={sp_tokenizer}",
    )
    assert launch(cfg, NO_GPU) == 0
    for name in ("books", "web"):
        for ext in (".bin", ".idx"):
            assert (tmp_path / "data" / f"{name}_text_document{ext}").stat().st_size > 0
    log = (tmp_path / "results" / "llama31_tiny_bf16_tp1_1gpu" / "logs" / "data_preparation.log").read_text()
    assert "books: OK" in log and "web: OK" in log
    assert "did not train: no NVIDIA GPU" in capsys.readouterr().out


def test_local_stages_run_in_order_and_stop_at_the_first_failure(tmp_path):
    trail = tmp_path / "trail"
    jobs = [Job("first", "first.sh", "", []), Job("second", "second.sh", "", []), Job("third", "third.sh", "", [])]
    (tmp_path / "first.sh").write_text(f"echo first >> {trail}\n")
    (tmp_path / "second.sh").write_text(f"echo second >> {trail}\nexit 3\n")
    (tmp_path / "third.sh").write_text(f"echo third >> {trail}\n")
    said = []
    assert run_here(jobs, tmp_path, said.append) == 3
    assert trail.read_text().split() == ["first", "second"]
    assert said[-1].startswith("error: stage second failed with exit status 3")


TRAINER = """
import signal, sys, time
def stop(signum, frame):
    time.sleep(0.5)  # a checkpoint being written
    print("stopped by signal: checkpoint saved", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
print("ready", flush=True)
time.sleep(60)
"""


def test_the_log_outlives_sigterm_so_the_last_words_of_the_trainer_arrive(tmp_path):
    """SIGTERM to the whole process group (a scheduler, `kill -- -PGID`): the trainer saves, and its message
    still reaches the console and the run's log although tee got the signal too."""
    log = tmp_path / "logs" / "training.log"
    log.parent.mkdir()
    (tmp_path / "trainer.py").write_text(TRAINER)
    job = Job(
        "training",
        "launch.sh",
        "a stand-in trainer",
        [f"{sys.executable} -u {tmp_path}/trainer.py 2>&1 | keep_log -a {log}"],
    )
    (tmp_path / "launch.sh").write_text(LOCAL.render_script(job, compose([]), tmp_path))
    proc = subprocess.Popen(
        ["bash", str(tmp_path / "launch.sh")], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    deadline = time.time() + 30
    while time.time() < deadline and "ready" not in (log.read_text() if log.exists() else ""):
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert "stopped by signal: checkpoint saved" in out
    assert "stopped by signal: checkpoint saved" in log.read_text()
