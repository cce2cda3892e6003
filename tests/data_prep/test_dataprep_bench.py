"""bench/bench_tokenize.py runs end to end on a tiny corpus: the pipeline rows are built the way `python -m
data_prep run` builds them and must count what the plain loop counts (the script stops otherwise)."""

from __future__ import annotations

import json
import subprocess
import sys

from dataprep_helpers import REPO

MODES = ["plain loop", "2 loops in parallel", "pipeline 1 worker", "pipeline 2 workers"]


def test_bench_tokenize_on_a_tiny_corpus(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "bench_tokenize.py"),
            "--docs",
            "120",
            "--repeat",
            "1",
            "--vocab-size",
            "600",
            "--workers",
            "1,2",
            "--workdir",
            str(tmp_path),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [
        line.split()
        for line in out.stdout.splitlines()
        if line.startswith(("huggingface ", "sentencepiece ")) and "x " in line
    ]
    assert [(r[0], " ".join(r[1:-7])) for r in rows] == [
        (k, m) for k in ("huggingface", "sentencepiece") for m in MODES
    ]
    for kind in ("huggingface", "sentencepiece"):
        for workers in (1, 2):
            marker = json.loads((tmp_path / f"bench_{kind}_{workers}_text_document.done.json").read_text())
            assert marker["documents"] == 120 and marker["tokenizer"]["type"] == kind
