""".bin/.idx written with numpy alone (data_prep/indexed.py): the same bytes as megatron-core's own builder, and
a data preparation run that never imports torch or megatron-core."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import numpy as np
import pytest

from data_prep.indexed import IndexWriter, optimal_dtype
from dataprep_helpers import REPO, write_config


def megatron_indexed():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets import indexed_dataset
    return indexed_dataset


def chunks(dtype, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """Chunks of documents as the encoder hands them over: tokens concatenated, one length per document."""
    rng = np.random.default_rng(seed)
    out = []
    for documents in (3, 1, 7, 2):
        lengths = rng.integers(1, 300, size=documents)
        out.append((rng.integers(0, np.iinfo(dtype).max, size=int(lengths.sum())).astype(dtype), lengths))
    return out


def written(tmp_path, name: str, write) -> dict[str, bytes]:
    write(str(tmp_path / name))
    return {suffix: (tmp_path / f"{name}{suffix}").read_bytes() for suffix in (".bin", ".idx")}


@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
@pytest.mark.parametrize("empty", [False, True])
def test_the_files_are_megatrons_byte_for_byte(tmp_path, dtype, empty):
    indexed = megatron_indexed()
    data = [] if empty else chunks(dtype)

    def ours(prefix):
        writer = IndexWriter(prefix + ".bin", dtype)
        for tokens, lengths in data:
            writer.add_documents(tokens, lengths)
        writer.finalize(prefix + ".idx")

    def megatrons(prefix):
        builder = indexed.IndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
        for tokens, lengths in data:
            pos = 0
            for n in lengths.tolist():
                builder.add_document(tokens[pos : pos + n], [n])
                pos += n
        builder.finalize(prefix + ".idx")

    assert written(tmp_path, "ours", ours) == written(tmp_path, "megatron", megatrons)


@pytest.mark.parametrize("vocab_size", [400, 65499, 65500, 128256])
def test_the_token_dtype_is_megatrons_choice(vocab_size):
    assert optimal_dtype(vocab_size) is megatron_indexed().DType.optimal_dtype(vocab_size)


def test_a_run_imports_neither_torch_nor_megatron(tmp_path, tokenizers_dir):
    """Importing them took seconds before the first token of every data preparation task."""
    corpus = tmp_path / "in.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"document {i}"}) + "\n" for i in range(50)))
    config = write_config(
        tmp_path / "config.yaml",
        "files",
        ("sentencepiece", tokenizers_dir["sentencepiece"]),
        tmp_path / "out",
        inputs=[str(corpus)],
        workers=1,
    )
    code = (
        "import sys\n"
        "from data_prep.cli import main\n"
        "assert main(['run', '--config', sys.argv[1], '--no-progress']) == 0\n"
        "print(sorted(m for m in ('torch', 'megatron') if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(config)], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines()[-1] == "[]", result.stdout
    assert (tmp_path / "out" / "in_text_document.idx").exists()
