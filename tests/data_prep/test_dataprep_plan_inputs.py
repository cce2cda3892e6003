"""Data inputs through main.py as users type them: prepared files that training could not use (truncated, random,
empty, made with another tokenizer) and data-preparation tokenizers of the wrong kind each stop the plan with one
line naming the key, exit status 2, before anything is written; sound data plans."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dataprep_helpers import REPO, copy_of, make_docs, write_shard


def main_py(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "main.py"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )


def training_on(prefix: str, tokenizer: str, *more: str) -> list[str]:
    return [
        "training=llama31/8b",
        "cluster=bcm",
        "dry_run=true",
        "training.data.mock=false",
        f"training.data.blend=[{prefix}]",
        "training.tokenizer.type=sentencepiece",
        f"training.tokenizer.path={tokenizer}",
        *more,
    ]


def _truncate(path: str, by: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - by)


DAMAGE = {
    "truncated .bin": (lambda p: _truncate(p + ".bin", 2), ".bin has "),
    "random .idx": (
        lambda p: Path(p + ".idx").write_bytes(os.urandom(os.path.getsize(p + ".idx"))),
        ".idx is not a megatron index",
    ),
    "empty .bin and .idx": (
        lambda p: (
            _truncate(p + ".bin", os.path.getsize(p + ".bin")),
            _truncate(p + ".idx", os.path.getsize(p + ".idx")),
        ),
        ".idx is empty (0 bytes)",
    ),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_damaged_data_stops_the_plan(prepared, tokenizers_dir, tmp_path, damage):
    prefix = copy_of(prepared, "a", tmp_path)
    do, says = DAMAGE[damage]
    do(prefix)
    out = main_py(*training_on(prefix, tokenizers_dir["sentencepiece"]), f"results_dir={tmp_path}/runs", cwd=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith(f"error: training.data.blend: {prefix}") and says in line, line
    assert not (tmp_path / "runs").exists()


def test_data_made_with_another_tokenizer_stops_the_plan(prepared, tokenizers_dir, tmp_path):
    prefix = copy_of(prepared, "a", tmp_path)  # made with the sentencepiece model
    out = main_py(
        *training_on(prefix, tokenizers_dir["sentencepiece"]),
        "training.tokenizer.type=huggingface",
        f"training.tokenizer.path={tokenizers_dir['huggingface']}",
        f"results_dir={tmp_path}/runs",
        cwd=tmp_path,
    )
    assert out.returncode == 2, out.stdout + out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert "was tokenized with another tokenizer" in line and "training.tokenizer is huggingface" in line, line
    assert not (tmp_path / "runs").exists()


def test_sound_data_plans(prepared, tokenizers_dir, tmp_path):
    prefix = copy_of(prepared, "a", tmp_path)
    out = main_py(
        *training_on(prefix, tokenizers_dir["sentencepiece"]),
        "cluster.container_runtime=none",
        f"results_dir={tmp_path}/runs",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "runs" / "llama31_8b_bf16_tp1_cp2_8gpu" / "submission.sbatch").exists()


def test_data_preparation_tokenizers_of_the_wrong_kind(tokenizers_dir, tmp_path):
    corpus = write_shard(tmp_path / "in.jsonl", make_docs(3, seed=1)).path
    (tmp_path / "empty").mkdir()
    key = "data_preparation.tokenizer"
    cases = [
        (["huggingface", tmp_path / "empty"], f"{key}.path={tmp_path / 'empty'} is a directory without tokenizer.json"),
        (["huggingface", tokenizers_dir["sentencepiece"]], "is a sentencepiece model, not a Hugging Face tokenizer"),
        (["sentencepiece", corpus], "is a JSON lines file (a corpus?), not a sentencepiece model"),
    ]
    for (kind, path), says in cases:
        out = main_py(
            "stages=[data_preparation]",
            "data_preparation=files",
            f"data_preparation.inputs=[{corpus}]",
            f"data_preparation.output_dir={tmp_path}/data",
            f"{key}.type={kind}",
            f"{key}.path={path}",
            "dry_run=true",
            f"results_dir={tmp_path}/runs",
            cwd=tmp_path,
        )
        assert out.returncode == 2, out.stdout + out.stderr
        (line,) = out.stderr.strip().splitlines()
        assert line.startswith("error: ") and says in line, line
        assert not (tmp_path / "runs").exists() and not (tmp_path / "data").exists()
