"""Shared test setup: `gpu` tests skip (with the reason) where no CUDA GPU or training stack is present."""

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def _gpu_skip_reason() -> str | None:
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA GPU visible"
    for module in ("megatron.core", "transformer_engine"):
        if importlib.util.find_spec(module.split(".")[0]) is None:
            return f"{module} is not installed (see docs/contributing.md: Tests)"
    return None


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    reason = _gpu_skip_reason()
    if reason:
        for item in gpu_items:
            item.add_marker(pytest.mark.skip(reason=f"gpu test: {reason}"))


@pytest.fixture
def small_tmpfs(tmp_path):
    """small_tmpfs(size_bytes) -> a directory on a tmpfs of that size, for a real ENOSPC; the test skips with the
    reason where this machine does not allow mounting (not root, no CAP_SYS_ADMIN, a container without it)."""
    import subprocess

    mounted = []

    def mount(size: int) -> Path:
        where = tmp_path / f"tmpfs{len(mounted)}"
        where.mkdir()
        result = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True, text=True
        )
        if result.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here for a real ENOSPC: {(result.stderr or result.stdout).strip()}")
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", str(where)], capture_output=True)
