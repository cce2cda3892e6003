"""Shared by the launcher tests: GPU sets to plan against, and `python main.py` in a subprocess."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from launcher.hardware import LocalGpus

REPO = Path(__file__).resolve().parents[2]
EIGHT_H100 = LocalGpus(8, "h100", ("NVIDIA H100 80GB HBM3",) * 8)
ONE_H100 = LocalGpus(1, "h100", ("NVIDIA H100 80GB HBM3",))
NO_GPU = LocalGpus(0, None, ())


def run_main(*args: str, cwd: Path = REPO, env: dict | None = None) -> subprocess.CompletedProcess:
    """`python main.py ARGS` as a user runs it, with no GPU visible (so cluster=local never trains here)."""
    full_env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", **(env or {})}
    return subprocess.run([sys.executable, str(REPO / "main.py"), *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=300)
