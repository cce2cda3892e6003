"""setup.sh: a clear stop without HF_TOKEN, and the container build through the container stage."""

from __future__ import annotations

import os
import subprocess

from launcher_helpers import REPO


def run_setup(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(REPO / "setup.sh"), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "", **env},
        timeout=600,
    )


def test_missing_token_stops_with_what_to_do():
    out = run_setup(HF_TOKEN="")
    assert out.returncode == 1
    assert "HF_TOKEN is not set" in out.stderr and "huggingface.co/settings/tokens" in out.stderr


def test_container_goes_through_the_container_stage(tmp_path):
    sqsh = tmp_path / "images" / "nemo.sqsh"
    out = run_setup(
        "cluster=bcm",
        "dry_run=true",
        f"results_dir={tmp_path}/results",
        f"cluster.container={sqsh}",
        SKIP_TOKENIZER="1",
    )
    assert out.returncode == 0, out.stderr
    (script,) = (tmp_path / "results").glob("*/container.sbatch")
    text = script.read_text()
    assert f"enroot import --output {sqsh}.base.partial 'docker://nvcr.io#nvidia/nemo:25.09'" in text
    assert "python -m recipes.stack install" in text
    assert f"mv -f {sqsh}.partial {sqsh}" in text
    assert str(script) in out.stdout
