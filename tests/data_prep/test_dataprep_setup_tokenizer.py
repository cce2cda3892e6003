"""setup.sh's tokenizer download without a reachable hub: one line saying what failed and what to do. The
script runs from a copy next to a stand-in dev.sh that runs its command with this interpreter and this
repository's packages (the real one would prepare .venv)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys

import pytest

from dataprep_helpers import REPO


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_setup(tmp_path, **env: str) -> subprocess.CompletedProcess:
    work = tmp_path / "repo"
    (work / "bin").mkdir(parents=True)
    shutil.copy(REPO / "setup.sh", work / "setup.sh")
    (work / "dev.sh").write_text(f'PYTHONPATH={REPO} exec "$@"\n')
    (work / "bin" / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    (work / "bin" / "python").chmod(0o755)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env = {
        **clean,
        "PATH": f"{work / 'bin'}:{os.environ['PATH']}",
        "HF_HOME": str(tmp_path / "hf"),
        "SKIP_CONTAINER": "1",
        "HF_TOKEN": "hf_x",
        **env,
    }
    return subprocess.run(
        ["bash", str(work / "setup.sh")], cwd=work, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize("offline", [False, True])
def test_unreachable_hub_is_one_line(tmp_path, offline):
    port = closed_port()
    out = run_setup(tmp_path, HF_ENDPOINT=f"http://127.0.0.1:{port}", **({"HF_HUB_OFFLINE": "1"} if offline else {}))
    why = "HF_HUB_OFFLINE is set" if offline else f"the Hugging Face hub (http://127.0.0.1:{port}) cannot be reached"
    (line,) = out.stderr.splitlines()
    assert out.returncode == 1 and line.startswith(
        f"setup: downloading the tokenizer meta-llama/Llama-3.1-8B failed: {why}"
    ), out.stderr
    assert line.endswith(
        f"or run setup.sh where the hub is reachable and copy {tmp_path}/repo/tokenizers/"
        "Llama-3.1-8B here (SKIP_TOKENIZER=1 skips this step)"
    )
    assert "setup: tokenizer ready" not in out.stdout


def test_unreachable_hub_for_the_weights_is_one_line_too(tmp_path):
    port = closed_port()
    out = run_setup(
        tmp_path, HF_ENDPOINT=f"http://127.0.0.1:{port}", SKIP_TOKENIZER="1", HF_WEIGHTS="meta-llama/Llama-3.1-8B"
    )
    (line,) = out.stderr.splitlines()
    assert out.returncode == 1 and line.startswith(
        f"setup: downloading meta-llama/Llama-3.1-8B failed: the Hugging Face hub (http://127.0.0.1:{port}) cannot "
        "be reached"
    ), out.stderr
    assert line.endswith(
        f"or run setup.sh where the hub is reachable and copy {tmp_path}/repo/models/Llama-3.1-8B here"
    )
