"""Shared by the tests that submit real jobs to a one-node scheduler (tests/slurm, tests/sge): the scheduler itself,
started once per session by its script (start | status | stop | wait), and a small JSON-lines corpus with a
sentencepiece tokenizer trained on it (tests/corpora.py), so that data preparation runs for real and offline."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parent.parent


def skip_reason(script: Path, daemon: str) -> str | None:
    """Why this machine cannot run the scheduler (the script needs root, and apt when the daemon is missing)."""
    if os.geteuid() != 0:
        return f"needs root: {script.name} installs and starts the scheduler's daemons"
    if shutil.which(daemon) is None and not Path("/usr/sbin", daemon).exists() and shutil.which("apt-get") is None:
        return f"{daemon} is not installed and there is no apt-get to install it (Debian/Ubuntu only)"
    return None


@contextmanager
def local_scheduler(script: Path) -> Iterator[None]:
    """The scheduler up for the block: started by its script and stopped afterwards, or, when it is already up
    (another test session on this machine), used and left running."""
    already_up = (
        subprocess.run(["bash", str(script), "status"], capture_output=True, text=True, timeout=60).returncode == 0
    )
    if not already_up:
        started = subprocess.run(["bash", str(script), "start"], capture_output=True, text=True, timeout=1200)
        if started.returncode != 0:
            raise RuntimeError(f"{script.name} start failed:\n{started.stdout}\n{started.stderr}")
    try:
        yield
    finally:
        if not already_up:
            subprocess.run(["bash", str(script), "stop"], capture_output=True, text=True, timeout=300)


def wait_for_job(script: Path, job_id: str, timeout_s: int) -> tuple[int, str]:
    """The script's `wait`: (its exit status, its summary of the job's final states)."""
    out = subprocess.run(
        ["bash", str(script), "wait", job_id, str(timeout_s)], capture_output=True, text=True, timeout=timeout_s + 60
    )
    return out.returncode, out.stdout.strip()


def submit_with_main(
    overrides: list[str], env: dict[str, str], run_dir: Path
) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """`python main.py *overrides` with no GPU, as a user submits to the scheduler; its output and the jobs it
    submitted (run_dir/jobs.json)."""
    out = subprocess.run(
        [sys.executable, "main.py", *overrides],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**env, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out, json.loads((run_dir / "jobs.json").read_text())
