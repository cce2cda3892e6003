"""Worker side: turn a chunk of input lines into token ids, one document per line, EOD after each (unless
append_eod is off: MLPerf's C4 files have no separator between documents).

Bad input never stops a shard: each line that cannot become a document is counted under a reason and skipped.
Reasons: blank_line (an empty or whitespace-only input line), invalid_utf8, malformed_json (not JSON, or not a
JSON object), missing_text_key, text_not_string, empty_document (the text is empty or whitespace only),
tokenizer_error. The first few line numbers of each reason travel with the counts, so the shard summary can point
at them.
"""

from __future__ import annotations

import json
import os
import signal
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Optional, Union

import numpy as np

from common.processes import die_with_parent
from data_prep.readers import Chunk

EXAMPLES_PER_REASON = 3


@dataclass
class Encoded:
    tokens: np.ndarray  # every document's ids (each followed by eod when appended), concatenated, output dtype
    lengths: np.ndarray  # tokens per document (eod included when appended), int64
    lines: int
    skipped: Counter = field(default_factory=Counter)
    examples: dict = field(default_factory=dict)  # reason -> ["file:line", ...]
    loss_mask: Optional[np.ndarray] = None  # fine-tuning samples (data_prep.sft): one uint8 per token


class ChunkEncoder:
    """Parses and tokenizes chunks. One per worker process (or one in-process when workers=1)."""

    def __init__(self, tokenizer, dtype: Union[str, type], text_key: str, append_eod: bool = True):
        self.tokenizer = tokenizer
        self.eod = int(tokenizer.eod)
        self.dtype = np.dtype(dtype)
        self.text_key = text_key
        self.append_eod = append_eod

    def __call__(self, chunk: Chunk) -> Encoded:
        skipped: Counter = Counter()
        examples: dict[str, list[str]] = {}

        def skip(reason: str, line: int) -> None:
            skipped[reason] += 1
            if len(examples.setdefault(reason, [])) < EXAMPLES_PER_REASON:
                examples[reason].append(f"{chunk.source}:{line}")

        texts: list[str] = []
        lines_of: list[int] = []
        if chunk.kind == "text_file":
            items = [chunk.data]
        else:
            items = chunk.data.split(b"\n")
            if items and not items[-1]:
                items.pop()  # the newline ending the chunk's last line
        for i, raw in enumerate(items):
            line = chunk.first_line + i
            text = self._text(raw, chunk.kind, line, skip)
            if text is not None:
                texts.append(text)
                lines_of.append(line)
        ids = self._encode(texts, lines_of, skip)
        extra = 1 if self.append_eod else 0
        lengths = np.fromiter((len(x) + extra for x in ids), dtype=np.int64, count=len(ids))
        tokens = np.empty(int(lengths.sum()), dtype=self.dtype)
        pos = 0
        for doc in ids:
            end = pos + len(doc)
            tokens[pos:end] = doc
            if extra:
                tokens[end] = self.eod
            pos = end + extra
        return Encoded(tokens, lengths, chunk.lines, skipped, examples)

    def _text(self, raw: bytes, kind: str, line: int, skip) -> Optional[str]:
        if kind == "text" and raw.endswith(b"\r"):
            raw = raw[:-1]
        if kind != "text_file" and (not raw or raw.isspace()):
            skip("blank_line", line)
            return None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            skip("invalid_utf8", line)
            return None
        if kind == "jsonl":
            try:
                obj = json.loads(text)
            except ValueError:
                skip("malformed_json", line)
                return None
            if not isinstance(obj, dict):
                skip("malformed_json", line)
                return None
            if self.text_key not in obj:
                skip("missing_text_key", line)
                return None
            text = obj[self.text_key]
            if not isinstance(text, str):
                skip("text_not_string", line)
                return None
        if not text or text.isspace():
            skip("empty_document", line)
            return None
        return text

    def _encode(self, texts: list[str], lines_of: list[int], skip) -> list:
        try:
            return self.tokenizer.encode_batch(texts)
        except Exception:
            pass
        # Some text in the batch cannot be tokenized (e.g. a lone surrogate from a JSON "\ud800" escape, which
        # is not valid UTF-8): encode one by one and skip only the offenders.
        out = []
        for text, line in zip(texts, lines_of):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                skip("invalid_utf8", line)
                continue
            try:
                out.append(self.tokenizer.encode(text))
            except Exception:
                skip("tokenizer_error", line)
        return out


# -- process-pool plumbing ---------------------------------------------------------------------------------

_ENCODER: Optional[Callable[[Chunk], Encoded]] = None


def single_thread_tokenizers() -> None:
    """Each worker tokenizes on one thread; parallelism comes from the number of workers. Must run before the
    tokenizer's first use (the Rust thread pool reads these once)."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ["RAYON_NUM_THREADS"] = "1"


def _worker_setup(parent: int) -> None:
    # Ctrl-C and a scheduler's SIGTERM reach the whole process group: the parent alone handles them and stops the
    # workers (data_prep/cli.py), instead of every worker printing its own traceback. A parent killed hard takes
    # them with it: none is left holding the log's pipe open.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    die_with_parent(parent)
    single_thread_tokenizers()


def set_encoder(parent: int, encoder: Callable[[Chunk], Encoded]) -> None:
    """Worker initializer under fork: the parent's encoder (and loaded tokenizer) is inherited."""
    global _ENCODER
    _worker_setup(parent)
    _ENCODER = encoder


def init_worker(parent: int, tokenizer_type: str, tokenizer_path: str, eod: int, make_encoder: Callable) -> None:
    """Worker initializer under spawn: load the tokenizer from its resolved local file; `make_encoder` (a picklable
    partial of the encoder class) builds the encoder around it."""
    global _ENCODER
    _worker_setup(parent)
    from data_prep.tokenizer import load_tokenizer

    _ENCODER = make_encoder(load_tokenizer(tokenizer_type, tokenizer_path, eod=eod))


def encode_in_worker(chunk: Chunk) -> Encoded:
    assert _ENCODER is not None, "init_worker did not run"
    return _ENCODER(chunk)
