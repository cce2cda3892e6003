"""Reading sources: decompression, chunking at line boundaries, head -n, corrupt input."""

from __future__ import annotations

import gzip
import os
import random

import pytest
import zstandard

from data_prep.readers import SourceError, iter_chunks
from data_prep.shards import Source, detect_format


def source(path) -> Source:
    compression, kind = detect_format(str(path))
    return Source(str(path), str(path), compression, kind)


def lines_blob(n: int, seed: int = 0) -> bytes:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        size = rng.choice([1, 10, 100, 5000]) if i != n // 2 else 300_000  # one line longer than many chunks
        out.append(b'{"text": "%d %s"}' % (i, b"y" * size))
    return b"\n".join(out)  # no newline after the last line


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.zst", ".json.gz"])
def test_chunks_are_whole_lines_and_cover_everything(tmp_path, suffix):
    data = lines_blob(3000)
    path = tmp_path / f"x{suffix}"
    half = data.index(b"\n", len(data) // 2) + 1
    if suffix.endswith(".zst"):  # two frames / two members: as `cat a.zst b.zst` makes
        zstd = zstandard.ZstdCompressor()
        path.write_bytes(zstd.compress(data[:half]) + zstd.compress(data[half:]))
    elif suffix.endswith(".gz"):
        path.write_bytes(gzip.compress(data[:half]) + gzip.compress(data[half:]))
    else:
        path.write_bytes(data)
    chunks = list(iter_chunks([source(path)], 50_000, "line"))
    assert b"".join(c.data for c in chunks) == data
    assert [c.seq for c in chunks] == list(range(len(chunks))) and len(chunks) > 10
    line = 1
    for c in chunks[:-1]:
        assert c.data.endswith(b"\n") and (len(c.data) >= 50_000 or c is chunks[-1])
        assert c.first_line == line and c.lines == c.data.count(b"\n")
        assert len(c.data) < 50_000 + 300_100  # no chunk runs far past the mark, except through the long line
        line += c.lines
    assert chunks[-1].first_line == line and line + chunks[-1].lines - 1 == 3000
    assert chunks[-1].raw_pos == os.path.getsize(path)


def test_head_across_files(tmp_path):
    paths = []
    for i in range(3):
        p = tmp_path / f"v{i}.json.gz"
        p.write_bytes(gzip.compress(b"".join(b'{"text": "f%d l%d"}\n' % (i, j) for j in range(10))))
        paths.append(source(p))
    chunks = list(iter_chunks(paths, 16, "line", max_documents=23))
    lines = b"".join(c.data for c in chunks).splitlines()
    assert len(lines) == 23 and lines[-1] == b'{"text": "f2 l2"}' and sum(c.lines for c in chunks) == 23


def test_plain_text_file_documents(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_bytes(b"line one\nline two\n")
    b.write_bytes(b"other")
    chunks = list(iter_chunks([source(a), source(b)], 4, "file"))
    assert [(c.kind, c.data) for c in chunks] == [("text_file", b"line one\nline two\n"), ("text_file", b"other")]


def test_corrupt_and_truncated_inputs_raise(tmp_path):
    data = b"".join(b'{"text": "%d"}\n' % i for i in range(20000))
    bad = tmp_path / "trunc.json.gz"
    bad.write_bytes(gzip.compress(data)[:-100])
    with pytest.raises(SourceError, match="trunc.json.gz: gzip data ends in the middle of a frame") as err:
        list(iter_chunks([source(bad)], 1000, "line"))
    # the user's own file: deleting it would lose it, nothing downloads it again
    assert "replace it with a complete copy" in str(err.value) and "download" not in str(err.value)
    junk = tmp_path / "junk.jsonl.zst"
    junk.write_bytes(os.urandom(1000))
    with pytest.raises(SourceError, match="corrupt zstd data"):
        list(iter_chunks([source(junk)], 1000, "line"))
    with pytest.raises(SourceError, match="No such file"):
        list(iter_chunks([source(tmp_path / "gone.jsonl")], 1000, "line"))


def test_only_downloaded_files_are_to_be_deleted_and_fetched_again(tmp_path):
    data = gzip.compress(b"".join(b'{"text": "%d"}\n' % i for i in range(20000)))[:-100]
    (tmp_path / "cut.json.gz").write_bytes(data)
    downloaded = Source("https://example.org/cut.json.gz", str(tmp_path / "cut.json.gz"), "gzip", "jsonl")
    with pytest.raises(SourceError, match="the file is truncated\\); delete it to download it again"):
        list(iter_chunks([downloaded], 1000, "line"))
    (tmp_path / "junk.jsonl.zst").write_bytes(os.urandom(1000))
    with pytest.raises(SourceError, match="corrupt zstd data.*replace it with a complete copy"):
        list(iter_chunks([source(tmp_path / "junk.jsonl.zst")], 1000, "line"))


@pytest.mark.parametrize("chunk_bytes", [0, -5, True, 1.5, "4096"])
def test_chunk_size_must_be_positive_or_nothing_is_read(tmp_path, chunk_bytes):
    """chunk_bytes=0 once cut empty chunks forever; every chunk must move past at least one byte."""
    path = tmp_path / "x.jsonl"
    path.write_bytes(b'{"text": "a"}\n' * 10)
    with pytest.raises(ValueError, match="data_preparation.chunk_bytes=.*positive number of bytes"):
        next(iter_chunks([source(path)], chunk_bytes, "line"))


def test_one_byte_chunks_are_single_lines(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_bytes(b"a\nbb\n\nccc")
    chunks = list(iter_chunks([source(path)], 1, "line"))
    assert [c.data for c in chunks] == [b"a\n", b"bb\n", b"\n", b"ccc"]
    assert [c.first_line for c in chunks] == [1, 2, 3, 4]
