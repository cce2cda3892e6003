"""A real single-node Slurm for the integration tests, started once per session with the vendored
slurm-local.sh (Debian's slurm 22.05 + munge, installed through apt when missing) and stopped at the end."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from cluster_jobs import local_scheduler, skip_reason, wait_for_job

SCRIPT = Path(__file__).resolve().parent / "slurm-local.sh"


class SlurmCluster:
    """Helpers over the running cluster's client commands."""

    def wait(self, job_id: str, timeout_s: int = 300) -> tuple[int, str]:
        """(exit status, final states): 0 when every task COMPLETED (slurm-local.sh wait)."""
        return wait_for_job(SCRIPT, job_id, timeout_s)

    def show(self, job_id: str) -> list[dict[str, str]]:
        """`scontrol show job` as one dict per (array) task."""
        out = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True, check=True)
        return [
            dict(field.split("=", 1) for field in line.split() if "=" in field)
            for line in out.stdout.splitlines()
            if line.strip()
        ]


@pytest.fixture(scope="session")
def slurm_cluster():
    reason = skip_reason(SCRIPT, "slurmctld")
    if reason:
        pytest.skip(f"slurm test: {reason}")
    with local_scheduler(SCRIPT):
        yield SlurmCluster()
