"""A real one-node Grid Engine for the integration tests, started once per session with sge-local.sh (Debian's
gridengine-master/-exec/-client, installed through apt when missing) and stopped at the end."""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent / "sge-local.sh"
# What Grid Engine's clients (qsub, qstat, qacct) need to find the cell sge-local.sh runs.
SGE_ENV = {"SGE_ROOT": "/var/lib/gridengine", "SGE_CELL": "default"}


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root: sge-local.sh installs and starts sge_qmaster and sge_execd"
    if shutil.which("sge_qmaster") is None and not Path("/usr/sbin/sge_qmaster").exists() \
            and shutil.which("apt-get") is None:
        return "Grid Engine is not installed and there is no apt-get to install it (Debian/Ubuntu only)"
    return None


class GridEngine:
    """Helpers over the running cluster's client commands."""

    env = {**os.environ, **SGE_ENV}

    def wait(self, job_id: str, timeout_s: int = 300) -> tuple[int, str]:
        """(exit status, summary): 0 when every task exited 0; 1 with "error_state" when what is left of the job
        sits in the error state (sge-local.sh wait)."""
        out = subprocess.run(["bash", str(SCRIPT), "wait", job_id, str(timeout_s)], capture_output=True,
                             text=True, timeout=timeout_s + 60)
        return out.returncode, out.stdout.strip()

    def accounting(self, job_id: str, tasks: int = 1, timeout_s: int = 60) -> list[dict[str, str]]:
        """`qacct -j` as one dict per finished task, once `tasks` of them are recorded (the execd reports a
        finished task to the accounting file within seconds, not at once)."""
        deadline = time.monotonic() + timeout_s
        while True:
            out = subprocess.run(["qacct", "-j", job_id], capture_output=True, text=True, env=self.env)
            records: list[dict[str, str]] = []
            for line in out.stdout.splitlines():
                if line.startswith("====="):
                    records.append({})
                elif records and line.strip():
                    key, _, value = line.partition(" ")
                    records[-1][key] = value.strip()
            if len(records) >= tasks or time.monotonic() > deadline:
                return records
            time.sleep(0.5)

    def states(self, job_id: str) -> list[str]:
        """The states qstat shows for the job's lines (e.g. ["hqw"]); [] once it left the queue."""
        out = subprocess.run(["qstat"], capture_output=True, text=True, env=self.env, check=True)
        return [f.split()[4] for f in out.stdout.splitlines()[2:] if f.split() and f.split()[0] == job_id]

    def delete(self, *job_ids: str) -> None:
        subprocess.run(["qdel", *job_ids], capture_output=True, text=True, env=self.env)


@pytest.fixture(scope="session")
def grid_engine():
    reason = _skip_reason()
    if reason:
        pytest.skip(f"sge test: {reason}")
    # A cluster that is already up (another test session on this machine) is used and left running.
    already_up = subprocess.run(["bash", str(SCRIPT), "status"], capture_output=True, text=True,
                                timeout=60).returncode == 0
    if not already_up:
        started = subprocess.run(["bash", str(SCRIPT), "start"], capture_output=True, text=True, timeout=1200)
        if started.returncode != 0:
            pytest.fail(f"sge-local.sh start failed:\n{started.stdout}\n{started.stderr}")
    try:
        yield GridEngine()
    finally:
        if not already_up:
            subprocess.run(["bash", str(SCRIPT), "stop"], capture_output=True, text=True, timeout=300)
