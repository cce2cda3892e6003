"""MLPerf mode on one GPU: `training=mlperf/llama31_8b` (the benchmark's rules, optimizer, schedule, evaluation
on an in-order validation set, MLLOG) with a tiny model on a small local corpus prepared the way MLPerf prepares
C4 (no EOD between documents). A reachable target ends `success` with an mllog.txt that mlperf-logging's
compliance checker accepts except for what a tiny run cannot have; an unreachable one ends `aborted` at the
step limit."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from corpora import train_sentencepiece, write_stdlib_corpus

from launcher.report.mlperf import compliance_problems

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.gpu, pytest.mark.timeout(1800)]
pytest.importorskip(
    "mlperf_logging", reason="MLPerf mode needs mlperf-logging: pip install --no-deps 'mlperf-logging>=4.1.68'"
)

# The 8B rules with a model small enough for seconds per run: 8192-token sequences (the rules' length), GBS 8 on
# one GPU, an evaluation every 10 steps over 16 sequences, 5 warmup steps.
TINY = [
    "training.model.num_layers=6",
    "training.model.hidden_size=512",
    "training.model.ffn_hidden_size=1792",
    "training.model.num_attention_heads=8",
    "training.model.num_query_groups=4",
    "training.model.kv_channels=64",
    "training.model.vocab_size=4096",
    "training.global_batch_size=8",
    "training.val_interval=10",
    "training.val_samples=16",
    "training.scheduler.warmup_steps=5",
    "parallelism=tp1",
    "parallelism.num_gpus=1",
    "cluster=local",
    "mlperf.drop_caches=false",
]
# What a tiny run cannot satisfy: the benchmark's 1,024 evaluation sequences and its target of 3.3.
TINY_RUN_EXCEPTIONS = {"eval_samples", "eval_accuracy"}


def main_py(*overrides: str) -> str:
    cmd = [sys.executable, str(REPO / "main.py"), *overrides]
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1200)
    output = result.stdout + result.stderr
    if result.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({result.returncode}):\n{output[-8000:]}")
    return output


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> list[str]:
    """About 4 MB of Python's standard library sources, a sentencepiece model trained on them, and one .bin/.idx
    pair without EOD separators (data_preparation.append_eod=false, as MLPerf's C4 files)."""
    root = tmp_path_factory.mktemp("mlperf_corpus")
    docs = write_stdlib_corpus(root / "stdlib.jsonl", max_chars=4_000_000)
    train_sentencepiece(root / "sp", [docs], vocab_size=4000, max_documents=500)
    tokenizer = ["training.tokenizer.type=sentencepiece", f"training.tokenizer.path={root / 'sp.model'}"]
    main_py(
        "stages=[data_preparation]",
        "data_preparation=files",
        f"data_preparation.inputs=[{docs}]",
        "data_preparation.append_eod=false",
        f"data_preparation.output_dir={root / 'data'}",
        f"results_dir={root / 'runs'}",
        *tokenizer,
    )
    prefix = root / "data" / "stdlib_text_document"
    # The same documents for training and evaluation: a smoke test of the mechanics, not of generalisation.
    return [*tokenizer, f"training.data.blend=[{prefix}]", f"training.data.valid_blend=[{prefix}]"]


def mllog(run_dir: Path) -> list[dict]:
    return [json.loads(line.split(":::MLLOG ", 1)[1]) for line in (run_dir / "mllog.txt").read_text().splitlines()]


def failed_keys(problems: list[str]) -> set[str]:
    """The MLLOG keys the compliance checker's messages name."""
    keys = set()
    for problem in problems:
        match = re.search(r"CHECK for '(\w+)'|occurrence of '(\w+)'|Failed checks for (\w+)", problem)
        keys.add(next(g for g in match.groups() if g) if match else problem)
    return keys


def report(run_dir: Path) -> str:
    return subprocess.run(
        [sys.executable, "-m", "launcher.report", str(run_dir)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout


def test_tiny_run_reaches_its_target_with_a_compliant_log(corpus, tmp_path):
    # ln(4096) = 8.3 at the start: a learning model passes 8.0 within a few evaluations (100 steps at most; the
    # 8B rules leave the LR free, 1e-3 is the tiny model's).
    main_py(
        "training=mlperf/llama31_8b",
        *TINY,
        *corpus,
        "training.target_val_loss=8.0",
        "training.train_steps=100",
        "training.optimizer.lr=1e-3",
        f"results_dir={tmp_path}",
        "run_name=reached",
    )
    run_dir = tmp_path / "reached"
    events = mllog(run_dir)
    stop = next(e for e in events if e["key"] == "run_stop")
    evals = [(e["metadata"]["samples_count"], e["value"]) for e in events if e["key"] == "eval_accuracy"]
    trained = next(e["value"] for e in events if e["key"] == "train_samples")
    minutes = (stop["time_ms"] - next(e["time_ms"] for e in events if e["key"] == "run_start")) / 60000
    print(
        f"\nstatus {stop['metadata']['status']}, time to train {minutes:.3f} min, {trained} samples, "
        f"evaluations {evals}"
    )
    assert stop["metadata"]["status"] == "success"
    assert evals[-1][1] <= 8.0 and all(acc > 8.0 for _, acc in evals[:-1]) and trained == evals[-1][0]
    assert all(samples % 80 == 0 for samples, _ in evals)  # every 10 steps of GBS 8

    problems = compliance_problems(run_dir / "mllog.txt", "llama31_8b", "6.1.0")
    print("compliance checker (training_6.1.0):", problems or "passed")
    assert failed_keys(problems) <= TINY_RUN_EXCEPTIONS, problems

    text = report(run_dir)
    print(text[text.index("MLPerf") :])
    row = next(line for line in text[text.index("MLPerf") :].splitlines() if line.startswith("reached "))
    assert "success" in row and f"{minutes:.2f} min" in row


def test_unreachable_target_ends_aborted_at_the_step_limit(corpus, tmp_path):
    main_py(
        "training=mlperf/llama31_8b",
        *TINY,
        *corpus,
        "training.target_val_loss=0.5",
        "training.train_steps=20",
        f"results_dir={tmp_path}",
        "run_name=unreached",
    )
    events = mllog(tmp_path / "unreached")
    stop = next(e for e in events if e["key"] == "run_stop")
    evals = [e["metadata"]["samples_count"] for e in events if e["key"] == "eval_accuracy"]
    print(f"\nstatus {stop['metadata']['status']}, evaluations at {evals} samples")
    assert stop["metadata"]["status"] == "aborted"
    assert evals == [80, 160] and next(e["value"] for e in events if e["key"] == "train_samples") == 160
    metrics = [json.loads(line) for line in (tmp_path / "unreached" / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["step"] == 20
