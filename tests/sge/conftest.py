"""A real one-node Grid Engine for the integration tests, started once per session with sge-local.sh (Debian's
gridengine-master/-exec/-client, installed through apt when missing) and stopped at the end."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from cluster_jobs import local_scheduler, skip_reason, wait_for_job

SCRIPT = Path(__file__).resolve().parent / "sge-local.sh"
# What Grid Engine's clients (qsub, qstat, qacct) need to find the cell sge-local.sh runs.
SGE_ENV = {"SGE_ROOT": "/var/lib/gridengine", "SGE_CELL": "default"}


class GridEngine:
    """Helpers over the running cluster's client commands."""

    env = {**os.environ, **SGE_ENV}

    def wait(self, job_id: str, timeout_s: int = 300) -> tuple[int, str]:
        """(exit status, summary): 0 when every task exited 0; 1 with "error_state" when what is left of the job
        sits in the error state (sge-local.sh wait)."""
        return wait_for_job(SCRIPT, job_id, timeout_s)

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
    reason = skip_reason(SCRIPT, "sge_qmaster")
    if reason:
        pytest.skip(f"sge test: {reason}")
    with local_scheduler(SCRIPT):
        yield GridEngine()
