"""The development tooling keeps its promises: dev.sh takes its versions from conf/stack.yaml (it names none
itself), pre-commit runs the ruff that CI runs, and the console scripts pyproject.toml declares start their tools."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
tomllib = pytest.importorskip("tomllib")  # Python 3.11+
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def dev_sh_function(name: str) -> str:
    """The text of one shell function of dev.sh."""
    match = re.search(rf"^{name}\(\) {{\n.*?^}}\n", (REPO / "dev.sh").read_text(), flags=re.S | re.M)
    assert match, f"dev.sh has no function {name}"
    return match.group(0)


def fake_venv(tmp_path: Path) -> Path:
    """A directory laid out like a venv whose python runs this interpreter (it has pyyaml and the project's
    dependencies)."""
    (tmp_path / "bin").mkdir()
    python = tmp_path / "bin" / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    return tmp_path


def run_function(name: str, call: str, venv: Path) -> str:
    script = f"set -euo pipefail\nVENV={venv}\n{dev_sh_function(name)}{call}\n"
    return subprocess.run(["bash", "-c", script], cwd=REPO, check=True, capture_output=True, text=True).stdout


def test_dev_sh_names_no_version_and_reads_them_from_the_declared_stack(tmp_path):
    assert not re.findall(r"\d+\.\d+\.\d+", (REPO / "dev.sh").read_text())
    stack = yaml.safe_load((REPO / "conf" / "stack.yaml").read_text())["stack"]
    venv = fake_venv(tmp_path)
    printed = run_function("stack_version", "stack_version torch cpu_build; stack_version megatron_core tested", venv)
    assert printed.split() == [str(stack["torch"]["cpu_build"]), str(stack["megatron_core"]["tested"])]


def test_pre_commit_runs_the_ruff_ci_pins():
    pinned = [r for r in PROJECT["optional-dependencies"]["test"] if r.startswith("ruff")]
    assert len(pinned) == 1 and "==" in pinned[0]
    hooks = yaml.safe_load((REPO / ".pre-commit-config.yaml").read_text())["repos"][0]["hooks"]
    assert {h["entry"].split()[:2][1] for h in hooks} == {"check", "format"}
    assert all(h["additional_dependencies"] == pinned for h in hooks)
    ci = (REPO / ".ci" / "run").read_text()
    assert "ruff check ." in ci and "ruff format --check ." in ci


def test_the_console_scripts_dev_sh_writes_start_their_tools(tmp_path):
    venv = fake_venv(tmp_path)
    run_function("write_console_scripts", "write_console_scripts", venv)
    scripts = PROJECT["scripts"]
    assert set(scripts) <= {p.name for p in (venv / "bin").iterdir()}
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for name in scripts:
        result = subprocess.run([venv / "bin" / name, "--help"], capture_output=True, text=True, env=env, cwd=tmp_path)
        assert result.returncode == 0, f"{name} --help: {result.stderr[-2000:]}"
        assert "usage:" in result.stdout, f"{name} --help printed no usage"
