"""Ctrl-C and SIGTERM during data preparation, as a terminal or a scheduler sends them: to the whole process group of
`python main.py stages=[data_preparation]` on this machine (main.py, the stage's bash script, python -m data_prep,
its tokenizer workers and the log's tee). However many arrive, however close together, every process is gone within
seconds, and running the command again gives the same bytes as a run never interrupted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dataprep_helpers import make_docs

REPO = Path(__file__).resolve().parents[2]
GONE_WITHIN_S = 10


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, tokenizers_dir) -> dict:
    """A corpus that takes two workers a few seconds (so signals land mid-shard), and the uninterrupted output."""
    root = tmp_path_factory.mktemp("signals")
    path = root / "corpus.jsonl"
    docs = make_docs(3000, seed=5, words_max=400)
    path.write_text("".join(json.dumps({"text": doc}) + "\n" for doc in docs), encoding="utf-8")
    setup = {"root": root, "corpus": path, "tokenizer": tokenizers_dir["sentencepiece"]}
    reference = root / "reference"
    assert prepare(setup, reference).wait(timeout=300) == 0
    setup["reference"] = outputs(reference)
    return setup


def prepare(setup: dict, out: Path) -> subprocess.Popen:
    """main.py's data preparation stage on this machine, in a process group of its own (as a terminal's job)."""
    return subprocess.Popen(
        [
            sys.executable,
            str(REPO / "main.py"),
            "stages=[data_preparation]",
            "data_preparation=files",
            f"data_preparation.inputs=[{setup['corpus']}]",
            f"data_preparation.output_dir={out / 'data'}",
            "data_preparation.workers=2",
            "data_preparation.chunk_bytes=65536",
            "data_preparation.tokenizer.type=sentencepiece",
            f"data_preparation.tokenizer.path={setup['tokenizer']}",
            f"results_dir={out / 'results'}",
            "stack_check=false",
        ],
        cwd=out.parent,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def outputs(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((out / "data").glob("*_text_document.*")) if p.suffix != ".json"}


def group_members(pgid: int) -> list[str]:
    """Live processes of a process group: `pid command` for each."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            command = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        state, _, group = stat.rsplit(")", 1)[1].split()[:3]
        if int(group) == pgid and state != "Z":
            found.append(f"{entry} {command.strip()}")
    return found


def wait_until_tokenizing(out: Path, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 120
    while not any(p.stat().st_size > 0 for p in (out / "data").glob("*.bin.tmp")):
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, "data preparation never started tokenizing"
        time.sleep(0.02)


@pytest.mark.parametrize(
    "sig,count", [(signal.SIGINT, 1), (signal.SIGINT, 2), (signal.SIGINT, 3), (signal.SIGTERM, 3)], ids=str
)
def test_every_process_stops_and_the_rerun_is_byte_identical(tmp_path, corpus, sig, count):
    out = tmp_path / "run"
    out.mkdir()
    proc = prepare(corpus, out)
    wait_until_tokenizing(out, proc)
    for _ in range(count):
        os.killpg(proc.pid, sig)
        time.sleep(0.1)
    deadline = time.monotonic() + GONE_WITHIN_S
    while group_members(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = group_members(proc.pid)
    for member in left:  # do not leave them to the rest of the suite
        os.kill(int(member.split()[0]), signal.SIGKILL)
    assert not left, f"still running {GONE_WITHIN_S} s after {count} x {sig.name}: {left}"
    assert proc.wait(timeout=5) != 0
    stderr = proc.stderr.read()
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
    assert not list((out / "data").glob("*_text_document.done.json")), "an interrupted shard looks finished"

    rerun = prepare(corpus, out)
    assert rerun.wait(timeout=300) == 0, rerun.stderr.read()
    assert outputs(out) == corpus["reference"]
