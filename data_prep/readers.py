"""Read a shard's sources in order and cut them into chunks of whole lines for the tokenizer workers.

Decompression (zstd, gzip, multi-frame/multi-member) streams: nothing is extracted to disk. A truncated or
corrupt compressed file raises SourceError instead of silently ending early, so a shard is never finished from
half its input. The main process only decompresses and splits at newlines; decoding, JSON parsing and
tokenization happen in the workers.
"""

from __future__ import annotations

import functools
import json
import os
import zlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Sequence

from data_prep.shards import Source

_READ = 1 << 20


class SourceError(RuntimeError):
    """An input file that cannot be read (missing, corrupt, truncated)."""


class _Truncated(Exception):
    """Compressed data that stops inside a frame (raised with the compressed bytes read)."""


@dataclass
class Chunk:
    """Whole input lines (or one whole file) for a worker; `seq` is its position in the input (the pipeline
    keeps results in submission order itself)."""

    seq: int
    source: str  # file name, for messages
    first_line: int  # 1-based line number of the chunk's first line within `source`
    data: bytes
    kind: str  # jsonl | text (one document per line) | text_file (the whole file is one document)
    lines: int  # input lines in `data`
    raw_pos: int  # compressed bytes of the shard's sources consumed once this chunk is done (progress)


def iter_chunks(
    sources: Sequence[Source], chunk_bytes: int, text_document: str, max_documents: Optional[int] = None
) -> Iterator[Chunk]:
    """Chunks of at least `chunk_bytes` (except at the end of a file) ending at a line boundary."""
    # Every cut must move forward: with chunk_bytes < 1 the cut below would stay where it is and the loop would
    # yield empty chunks forever.
    if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int) or chunk_bytes < 1:
        raise ValueError(f"data_preparation.chunk_bytes={chunk_bytes!r}: expected a positive number of bytes")
    if text_document not in ("line", "file"):
        raise ValueError(f"data_preparation.text_document={text_document!r} is not one of line, file")
    seq, raw_done, left = 0, 0, max_documents
    for src in sources:
        path = src.local_path
        try:
            size = os.path.getsize(path)
        except OSError as e:
            raise SourceError(f"cannot read {path}: {e.strerror}") from None
        if src.kind == "parquet":
            for chunk in _parquet_chunks(src, chunk_bytes, seq, raw_done, size):
                yield chunk
                seq += 1
            raw_done += size
            continue
        if src.kind == "text" and text_document == "file":
            data = b"".join(block for block, _ in _blocks(src))
            yield Chunk(seq, src.file_name, 1, data, "text_file", 1, raw_done + size)
            seq, raw_done = seq + 1, raw_done + size
            if left is not None:
                left -= 1
                if left <= 0:
                    return
            continue
        line, pending, pending_len = 1, [], 0
        for block, raw_pos in _blocks(src):
            pending.append(block)
            pending_len += len(block)
            # Join only when a chunk can end here: a line longer than many blocks is not copied again and again.
            if pending_len < chunk_bytes or b"\n" not in block:
                continue
            buf, start = b"".join(pending), 0
            # A decompressed block can be several chunks long: cut it at the first newline past each chunk_bytes.
            while len(buf) - start >= chunk_bytes:
                cut = buf.find(b"\n", start + chunk_bytes - 1) + 1
                if cut == 0:
                    break
                data, n = _head(buf[start:cut], left)
                start = cut
                yield Chunk(seq, src.file_name, line, data, src.kind, n, raw_done + raw_pos)
                seq, line = seq + 1, line + n
                if left is not None:
                    left -= n
                    if left <= 0:
                        return
            rest = buf[start:]
            pending, pending_len = ([rest], len(rest)) if rest else ([], 0)
        data = b"".join(pending)
        if data:
            data, n = _head(data, left)
            yield Chunk(seq, src.file_name, line, data, src.kind, n, raw_done + size)
            seq = seq + 1
            if left is not None:
                left -= n
                if left <= 0:
                    return
        raw_done += size


def _parquet_chunks(src: Source, chunk_bytes: int, seq: int, raw_done: int, size: int) -> Iterator[Chunk]:
    """A parquet table's rows as JSON lines, about `chunk_bytes` at a time: the workers then parse them as they
    parse JSON lines, and row k is line k + 1 in messages. pyarrow is imported only here (only the hub's datasets
    need it)."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise SourceError(
            f"cannot read {src.local_path}: .parquet files need pyarrow (pip install pyarrow), or give the rows "
            "as JSON lines"
        ) from None
    try:
        table = pq.ParquetFile(src.local_path)
        total = max(table.metadata.num_rows, 1)
        line = 1
        for batch in table.iter_batches(batch_size=64):
            rows = batch.to_pylist()
            data = b"".join(json.dumps(row).encode() + b"\n" for row in rows)
            for piece, n in _split_lines(data, chunk_bytes):
                yield Chunk(seq, src.file_name, line, piece, "jsonl", n, raw_done + size * (line + n - 1) // total)
                seq, line = seq + 1, line + n
    except (OSError, ValueError) as e:  # pyarrow's errors (ArrowInvalid ...) derive from these
        raise SourceError(f"cannot read {src.local_path} as parquet: {_first_line(e)}; {_fix(src)}") from None


def _split_lines(data: bytes, chunk_bytes: int) -> Iterator[tuple[bytes, int]]:
    """`data` (whole lines) in pieces of at least chunk_bytes ending at a newline, with their line counts."""
    start = 0
    while start < len(data):
        cut = data.find(b"\n", start + chunk_bytes - 1) + 1 or len(data)
        yield data[start:cut], count_lines(data[start:cut])
        start = cut


def _first_line(e: BaseException) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def count_lines(data: bytes) -> int:
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


def _head(data: bytes, left: Optional[int]) -> tuple[bytes, int]:
    """The first `left` lines of `data` (all when None) and their count."""
    n = count_lines(data)
    if left is None or n <= left:
        return data, n
    return b"\n".join(data.split(b"\n", left)[:left]) + b"\n", left


def _blocks(src: Source) -> Iterator[tuple[bytes, int]]:
    """(decompressed bytes, compressed bytes consumed so far) over one file."""
    path = src.local_path
    try:
        f = open(path, "rb")
    except OSError as e:
        raise SourceError(f"cannot read {path}: {e.strerror}") from None
    with f:
        if src.compression == "none":
            for block in iter(lambda: f.read(_READ), b""):
                yield block, f.tell()
            return
        try:
            yield from _decompress(f, src.compression)
        except _Truncated as e:
            raise SourceError(
                f"cannot read {path}: {src.compression} data ends in the middle of a frame after "
                f"{e.args[0]} bytes (the file is truncated); {_fix(src)}"
            ) from None
        except Exception as e:  # zstd/zlib errors: corrupt data
            raise SourceError(
                f"cannot read {path}: corrupt {src.compression} data near byte {f.tell()} "
                f"({type(e).__name__}: {e}); {_fix(src)}"
            ) from None


def _fix(src: Source) -> str:
    """Only a file data_prep downloaded can be fetched again by deleting it; a local input is the user's own."""
    if src.remote:
        return "delete it to download it again"
    return "replace it with a complete copy"


def _decompress(f, compression: str) -> Iterator[tuple[bytes, int]]:
    """Streams every frame (zstd) or member (gzip); concatenated files, as `cat a.gz b.gz` makes, are one
    stream. Ends with _Truncated when the last frame is cut short."""
    if compression == "zstd":
        import zstandard

        # Files compressed with --long need windows beyond the default limit.
        dctx = zstandard.ZstdDecompressor(max_window_size=2**31)
        new: Callable[[], Any] = dctx.decompressobj
    elif compression == "gzip":
        new = functools.partial(zlib.decompressobj, wbits=31)
    else:
        raise ValueError(f"unknown compression {compression!r}")
    dobj, in_frame = new(), False
    for data in iter(lambda: f.read(_READ), b""):
        while data:
            out = dobj.decompress(data)
            in_frame = True
            if out:
                yield out, f.tell()
            if dobj.eof:
                data, dobj, in_frame = dobj.unused_data, new(), False
                if compression == "gzip" and not data.strip(b"\x00"):
                    data = b""  # zero padding after the last member (as gzip tolerates)
            else:
                data = b""
    if in_frame:
        raise _Truncated(f.tell())
