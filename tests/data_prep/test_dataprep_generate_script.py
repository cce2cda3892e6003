"""generate_dataset.sh turns its environment into main.py overrides and passes the user's own through."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dataprep_helpers import REPO


def args_of(tmp_path, env: dict, *extra: str) -> list[str]:
    """The arguments generate_dataset.sh gives the interpreter (a stub that prints them)."""
    stub = tmp_path / "python"
    stub.write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done\n')
    stub.chmod(0o755)
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATASET", "STAGE_PATH", "TOKENIZER_PATH", "TOKENIZER_TYPE", "FILE_NUMBERS", "WORKERS")
    }
    out = subprocess.run(
        ["bash", str(REPO / "generate_dataset.sh"), *extra],
        env={**clean, **env, "PYTHON": str(stub)},
        cwd=tmp_path,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return out.splitlines()


def test_defaults_add_only_the_stage(tmp_path):
    assert args_of(tmp_path, {}) == [str(REPO / "main.py"), "stages=[data_preparation]"]


def test_environment_and_passthrough(tmp_path):
    env = {
        "DATASET": "pile",
        "STAGE_PATH": "/lustre/my stage/",
        "TOKENIZER_PATH": "/models/llama 3",
        "TOKENIZER_TYPE": "huggingface",
        "FILE_NUMBERS": "0-29",
        "WORKERS": "32",
    }
    assert args_of(tmp_path, env, "cluster=bcm", "dry_run=true")[1:] == [
        "stages=[data_preparation]",
        "data_preparation=pile",
        "data_preparation.output_dir='/lustre/my stage/data/pile'",
        "data_preparation.tokenizer.path='/models/llama 3'",
        "data_preparation.tokenizer.type=huggingface",
        "data_preparation.file_numbers='0-29'",
        "data_preparation.workers=32",
        "cluster=bcm",
        "dry_run=true",
    ]


def test_stage_path_follows_the_dataset(tmp_path):
    args = args_of(tmp_path, {"DATASET": "c4", "STAGE_PATH": "/s"})
    assert "data_preparation=c4" in args and "data_preparation.output_dir='/s/data/c4'" in args


VARIABLES = (
    "DATASET",
    "STAGE_PATH",
    "TOKENIZER_PATH",
    "TOKENIZER_TYPE",
    "FILE_NUMBERS",
    "WORKERS",
    "HF_TOKEN",
    "PYTHON",
)


def run_script(tmp_path, python: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(REPO / "generate_dataset.sh"), *args],
        env={**os.environ, "PYTHON": python},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_is_the_wrappers_own_usage(tmp_path, flag):
    called = tmp_path / "called"
    stub = tmp_path / "python"
    stub.write_text(f"#!/bin/sh\ntouch {called}\n")
    stub.chmod(0o755)
    out = run_script(tmp_path, str(stub), "cluster=bcm", flag)
    assert out.returncode == 0 and out.stdout.startswith("usage: bash generate_dataset.sh [HYDRA_OVERRIDE ...]\n")
    assert all(f"\n  {name} " in out.stdout for name in VARIABLES), out.stdout
    assert not any(line.startswith("#") for line in out.stdout.splitlines())
    assert not out.stderr and not called.exists()  # the interpreter, and so main.py (Hydra), never ran


def test_an_interpreter_without_the_projects_packages_is_one_line(tmp_path):
    bare = tmp_path / "python"  # the same Python without site-packages: no hydra
    bare.write_text(f'#!/bin/sh\nexec {sys.executable} -I -S "$@"\n')
    bare.chmod(0o755)
    out = run_script(tmp_path, str(bare))
    assert out.returncode == 2 and out.stderr.splitlines() == [
        f"generate_dataset.sh: {bare} ({bare}) cannot import hydra, which main.py needs; run it in the project's "
        "environment (bash dev.sh bash generate_dataset.sh ...) or set PYTHON=/path/to/.venv/bin/python"
    ]
    out = run_script(tmp_path, "no-such-python3")
    assert out.returncode == 2 and out.stderr.splitlines() == [
        "generate_dataset.sh: PYTHON=no-such-python3 not found; run it in the project's environment (bash dev.sh "
        "bash generate_dataset.sh ...) or set PYTHON=/path/to/.venv/bin/python"
    ]
