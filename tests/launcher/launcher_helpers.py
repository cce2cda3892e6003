"""Shared by the launcher tests: GPU sets to plan against, `python main.py` in a subprocess, and golden files for
the rendered jobs (tests/golden/, machine paths replaced by placeholders; UPDATE_GOLDEN=1 rewrites them)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from launcher.cli import prepare
from launcher.jobs.commands import python_bin_dir
from launcher.plan.validate import validate
from launcher.plan.hardware import LocalGpus
from launcher.platforms.registry import platform_of

REPO = Path(__file__).resolve().parents[2]
EIGHT_H100 = LocalGpus(8, "h100", ("NVIDIA H100 80GB HBM3",) * 8)
ONE_H100 = LocalGpus(1, "h100", ("NVIDIA H100 80GB HBM3",))
NO_GPU = LocalGpus(0, None, ())


def planned(cfg, local_gpus=None):
    """The plan main.py makes of this config: every check (launcher/plan/validate.py), then the derivation."""
    return validate(cfg, local_gpus, platform=platform_of(cfg.cluster)).plan


def run_main(*args: str, cwd: Path = REPO, env: dict | None = None) -> subprocess.CompletedProcess:
    """`python main.py ARGS` as a user runs it, with no GPU visible (so cluster=local never trains here)."""
    full_env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", **(env or {})}
    return subprocess.run(
        [sys.executable, str(REPO / "main.py"), *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=300,
    )


GOLDEN = REPO / "tests" / "golden"


def normalise(text: str, tmp: Path) -> str:
    # The interpreter's bin dir may lie inside the repository (.venv): replace it first.
    return text.replace(python_bin_dir(), "<PYTHON_BIN>").replace(str(tmp), "<TMP>").replace(str(REPO), "<REPO>")


def check_golden(name: str, text: str, tmp: Path, shell: bool = True) -> None:
    """The text equals tests/golden/NAME after normalise(); a shell script must also pass `bash -n`."""
    script = tmp / name
    script.write_text(text)
    if shell:
        syntax = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert syntax.returncode == 0, syntax.stderr
    actual = normalise(text, tmp)
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(actual)
    assert path.exists(), f"no golden file {path}; create it with UPDATE_GOLDEN=1"
    assert actual == path.read_text(), (
        f"{name} differs from its golden file (UPDATE_GOLDEN=1 after a deliberate change)"
    )


def rendered(cfg, local_gpus=None) -> dict[str, str]:
    prepared = prepare(cfg, local_gpus)
    return {
        job.script: prepared.platform.render_script(job, prepared.cfg, prepared.run_dir) for job in prepared.stages.jobs
    }


def bench_script(name: str):
    """bench/<name>.py as a module (bench/ is scripts, not a package). Registered in sys.modules before it runs:
    its dataclasses look their module up there."""
    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
