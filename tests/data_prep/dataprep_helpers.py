"""Helpers for the data-preparation tests: a local HTTP server (Range support and injectable faults), a small
deterministic corpus with known bad lines, and config files built from the real conf/data_preparation/*.yaml."""

from __future__ import annotations

import functools
import gzip
import http.server
import json
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import yaml
import zstandard

from common.config import Config
from common.typed import changed, to_plain

REPO = Path(__file__).resolve().parents[2]


# -- HTTP server -------------------------------------------------------------------------------------------


@dataclass
class Server:
    root: Path
    port: int = 0
    # path -> behaviour: {"ignore_range": True, "fail": N (503 N times), "drop_after": BYTES (first GET only),
    # "status": CODE, "redirect_to": PATH, "linked_etag": HEX}
    behavior: dict = field(default_factory=dict)
    requests: list = field(default_factory=list)  # (path, Range header or None)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path.lstrip('/')}"


def make_handler(server: Server):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # keep test output clean
            pass

        def do_GET(self):
            path = self.path.lstrip("/")
            rng = self.headers.get("Range")
            server.requests.append((path, rng))
            how = server.behavior.setdefault(path, {})
            if how.get("fail", 0) > 0:
                how["fail"] -= 1
                return self._empty(503)
            if "status" in how:
                return self._empty(how["status"])
            if "redirect_to" in how:
                self.send_response(302)
                self.send_header("Location", server.url(how["redirect_to"]))
                if "linked_etag" in how:
                    self.send_header("X-Linked-Etag", f'"{how["linked_etag"]}"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            file = server.root / path
            if not file.is_file():
                return self._empty(404)
            data = file.read_bytes()
            start = 0
            if rng and not how.get("ignore_range"):
                start = int(rng.split("=")[1].split("-")[0])
                if start >= len(data):
                    return self._empty(416)
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            else:
                self.send_response(200)
            body = data[start:]
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            drop = how.pop("drop_after", None)
            if drop is not None:  # announce everything, send part, hang up
                self.wfile.write(body[:drop])
                self.wfile.flush()
                self.close_connection = True
                return
            self.wfile.write(body)

        def _empty(self, code):
            self.send_response(code)
            self.send_header("Content-Length", "0")
            self.end_headers()

    return Handler


# -- corpus ------------------------------------------------------------------------------------------------

WORDS = [
    "the",
    "data",
    "token",
    "model",
    "naïve",
    "café",
    "東京",
    "Ελληνικά",
    "emoji🙂",
    "tab\there",
    "x" * 30,
    "12345",
    "3.14",
    "C++",
    "<tag>",
    'quote"s',
    "back\\slash",
    "ünïcödé",
    "end.",
]


def make_docs(n: int, seed: int, words_max: int = 60) -> list[str]:
    """Deterministic documents with the awkward parts of real text: unicode, tabs, runs of spaces, leading and
    trailing whitespace, newlines and blank lines inside a document."""
    rng = random.Random(seed)
    docs = []
    for _ in range(n):
        paragraphs = [
            " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, words_max))) for _ in range(rng.randint(1, 3))
        ]
        text = "\n\n".join(paragraphs)
        if rng.random() < 0.2:
            text = "  " + text + " \n"
        if rng.random() < 0.2:
            text = text.replace(" ", "   ", 2)
        docs.append(text)
    return docs


# The bad lines every "broken" fixture shard carries, by the reason they must be counted under.
BAD_LINES = [
    (b'{"text": "unterminated', "malformed_json"),
    (b'["a", "list"]', "malformed_json"),
    (b'{"content": "wrong key"}', "missing_text_key"),
    (b'{"text": 42}', "text_not_string"),
    (b'{"text": "caf\xe9 latin-1 byte"}', "invalid_utf8"),
    (b'{"text": "lone \\ud800 surrogate"}', "invalid_utf8"),
    (b'{"text": "   \\n  "}', "empty_document"),
    (b'{"text": ""}', "empty_document"),
    (b"", "blank_line"),
]


@dataclass
class ShardFile:
    path: Path
    docs: list  # the documents the pipeline must produce, in order
    skipped: dict  # reason -> count


def write_shard(path: Path, docs: list[str], broken: bool = False, seed: int = 0, frames: int = 2) -> ShardFile:
    """JSON lines (zstd in `frames` frames, gzip in members, or plain) with the BAD_LINES mixed in."""
    lines = [json.dumps({"text": d, "meta": {"i": i}}).encode() for i, d in enumerate(docs)]
    skipped: dict = {}
    if broken:
        rng = random.Random(seed)
        for bad, reason in BAD_LINES:
            lines.insert(rng.randint(0, len(lines)), bad)
            skipped[reason] = skipped.get(reason, 0) + 1
    data = b"\n".join(lines) + b"\n"
    cut = data.index(b"\n", len(data) // 2) + 1  # split into frames/members at a line boundary
    parts = [data[:cut], data[cut:]] if frames == 2 else [data]
    name = path.name
    if name.endswith(".zst"):
        blob = b"".join(zstandard.ZstdCompressor(level=3).compress(p) for p in parts)
    elif name.endswith(".gz"):
        blob = b"".join(gzip.compress(p, mtime=0) for p in parts)
    else:
        blob = data
    path.write_bytes(blob)
    return ShardFile(path, docs, skipped)


# -- configs -----------------------------------------------------------------------------------------------


def write_config(path: Path, name: str, tokenizer: tuple[str, str], output_dir: Path, **overrides) -> Path:
    """A run directory's config.yaml: the config main.py composes with data_preparation=<name> (the real
    conf/data_preparation/<name>.yaml), this tokenizer for training and data preparation, quick download retries,
    and test overrides of data_preparation keys (written as given, so a wrong type reaches the file)."""
    changes = {
        "training.tokenizer.type": tokenizer[0],
        "training.tokenizer.path": tokenizer[1],
        "data_preparation.tokenizer.type": tokenizer[0],
        "data_preparation.tokenizer.path": tokenizer[1],
        "data_preparation.output_dir": str(output_dir),
        "data_preparation.download_dir": str(output_dir / "raw"),
        "data_preparation.download.backoff_s": 0.01,
        "data_preparation.download.max_backoff_s": 0.05,
        "data_preparation.download.retries": 2,
        "data_preparation.download.timeout_s": 10.0,
        **{f"data_preparation.{key}": value for key, value in overrides.items()},
    }
    path.write_text(yaml.safe_dump(to_plain(changed(composed_with(name), changes)), sort_keys=False))
    return path


@functools.lru_cache(maxsize=None)
def composed_with(name: str) -> Config:
    """The config `python main.py data_preparation=<name>` composes (shared: callers change copies)."""
    from launcher.config.compose import compose

    return compose([f"data_preparation={name}"])


def copy_of(prepared: Path, name: str, dest: Path) -> str:
    """A private copy of a finished shard (.bin, .idx, .done.json) to damage; returns its prefix."""
    for ext in (".bin", ".idx", ".done.json"):
        shutil.copy(prepared / f"{name}_text_document{ext}", dest / f"{name}_text_document{ext}")
    return str(dest / f"{name}_text_document")
