"""Shared test setup: `gpu` tests skip (with the reason) where no CUDA GPU or training stack is present; the corpus and
tokenizer every test that prepares data starts from (tests/corpora.py)."""

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
def corpus(tmp_path: Path) -> Path:
    """A directory of two small JSON-lines files (books.jsonl, web.jsonl) for the `files` data preparation."""
    from corpora import write_corpus

    write_corpus(tmp_path / "corpus", ["books", "web"], documents=60)
    return tmp_path / "corpus"


@pytest.fixture(scope="session")
def sp_tokenizer(tmp_path_factory) -> Path:
    """A 400-token sentencepiece model trained on a small corpus, once per session."""
    from corpora import train_sentencepiece, write_corpus

    root = tmp_path_factory.mktemp("tokenizer")
    return train_sentencepiece(root / "sp", write_corpus(root / "corpus", ["a", "b"]), vocab_size=400)


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
