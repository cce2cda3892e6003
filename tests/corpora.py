"""Text and tokenizers the tests build for themselves, offline: small JSON-lines corpora of a few words, a larger one
of Python's standard library sources, and sentencepiece models trained on them through `python -m data_prep
train-tokenizer`. The fixtures in tests/conftest.py (and the GPU tests' module fixtures) are made from these."""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WORDS = "the llama reads tokens from every shard of the corpus before its training starts on many nodes".split()


def write_corpus(directory: Path, names: list[str], documents: int = 120) -> list[Path]:
    """One .jsonl file of `documents` short documents per name."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for k, name in enumerate(names):
        lines = [
            json.dumps({"text": " ".join(WORDS[(i + j + k) % len(WORDS)] for j in range(6 + i % 9))})
            for i in range(documents)
        ]
        path = directory / f"{name}.jsonl"
        path.write_text("\n".join(lines) + "\n")
        paths.append(path)
    return paths


def write_stdlib_corpus(path: Path, max_chars: int, document_chars: int | None = None) -> Path:
    """Python's standard library sources (tests left out) as one document per file, up to about max_chars.
    document_chars cuts each file at line ends into documents of about that many characters, for tests that need
    more documents than the library has files."""
    total = 0
    with open(path, "w") as f:
        for source in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
            text = source.read_text(errors="ignore")
            if "test" in source.parts or len(text) < 200:
                continue
            for document in _pieces(text, document_chars) if document_chars else [text]:
                if len(document) >= 200:
                    f.write(json.dumps({"text": document}) + "\n")
            total += len(text)
            if total > max_chars:
                break
    return path


def _pieces(text: str, size: int) -> list[str]:
    """text cut after the first line end past every `size` characters."""
    pieces, current = [], ""
    for line in text.splitlines(keepends=True):
        current += line
        if len(current) >= size:
            pieces.append(current)
            current = ""
    return [*pieces, current] if current else pieces


def train_sentencepiece(output: Path, inputs: list[Path], vocab_size: int, max_documents: int | None = None) -> Path:
    """A sentencepiece model trained on `inputs`; its path (output.model)."""
    command = [sys.executable, "-m", "data_prep", "train-tokenizer", "--type", "sentencepiece", "--input"]
    command += [*map(str, inputs), "--output", str(output), "--vocab-size", str(vocab_size)]
    if max_documents:
        command += ["--max-documents", str(max_documents)]
    out = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout + out.stderr
    return output.with_suffix(".model")
