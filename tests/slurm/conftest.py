"""A real single-node Slurm for the integration tests, started once per session with the vendored
slurm-local.sh (Debian's slurm 22.05 + munge, installed through apt when missing) and stopped at the end."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent / "slurm-local.sh"


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root: slurm-local.sh installs and starts munge, slurmctld and slurmd"
    if shutil.which("slurmctld") is None and shutil.which("apt-get") is None:
        return "Slurm is not installed and there is no apt-get to install it (Debian/Ubuntu only)"
    return None


class SlurmCluster:
    """Helpers over the running cluster's client commands."""

    def wait(self, job_id: str, timeout_s: int = 300) -> tuple[int, str]:
        """(exit status, final states): 0 when every task COMPLETED (slurm-local.sh wait)."""
        out = subprocess.run(["bash", str(SCRIPT), "wait", job_id, str(timeout_s)], capture_output=True, text=True,
                             timeout=timeout_s + 30)
        return out.returncode, out.stdout.strip()

    def show(self, job_id: str) -> list[dict[str, str]]:
        """`scontrol show job` as one dict per (array) task."""
        out = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True, check=True)
        return [dict(field.split("=", 1) for field in line.split() if "=" in field)
                for line in out.stdout.splitlines() if line.strip()]


@pytest.fixture(scope="session")
def slurm_cluster():
    reason = _skip_reason()
    if reason:
        pytest.skip(f"slurm test: {reason}")
    # A cluster that is already up (another test session on this machine) is used and left running.
    already_up = subprocess.run(["bash", str(SCRIPT), "status"], capture_output=True, text=True,
                                timeout=60).returncode == 0
    if not already_up:
        started = subprocess.run(["bash", str(SCRIPT), "start"], capture_output=True, text=True, timeout=1200)
        if started.returncode != 0:
            pytest.fail(f"slurm-local.sh start failed:\n{started.stdout}\n{started.stderr}")
    try:
        yield SlurmCluster()
    finally:
        if not already_up:
            subprocess.run(["bash", str(SCRIPT), "stop"], capture_output=True, text=True, timeout=300)
