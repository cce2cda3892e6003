"""Shared by the tests that submit real jobs to a one-node scheduler (tests/slurm, tests/sge): a small JSON-lines
corpus and a sentencepiece tokenizer trained on it, so that data preparation runs for real and offline."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WORDS = "the llama reads tokens from every shard of the corpus before its training starts on many nodes".split()


def write_corpus(directory: Path, names: list[str]) -> list[Path]:
    """One 120-document .jsonl file per name."""
    directory.mkdir(parents=True)
    paths = []
    for k, name in enumerate(names):
        lines = [json.dumps({"text": " ".join(WORDS[(i + j + k) % len(WORDS)] for j in range(6 + i % 9))})
                 for i in range(120)]
        path = directory / f"{name}.jsonl"
        path.write_text("\n".join(lines) + "\n")
        paths.append(path)
    return paths


def train_tokenizer(root: Path) -> Path:
    """A 400-token sentencepiece model (root/sp.model)."""
    corpus = write_corpus(root / "corpus", ["a", "b"])
    out = subprocess.run([sys.executable, "-m", "data_prep", "train-tokenizer", "--input", *map(str, corpus),
                          "--output", str(root / "sp"), "--vocab-size", "400"], cwd=REPO, capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr
    return root / "sp.model"
