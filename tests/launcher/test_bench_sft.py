"""bench/bench_sft.py on the CPU: its synthetic samples (the stated length distribution, masks as data preparation
writes them), every run it makes passing the plan (--dry-run), and a row's rates from a run directory."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

from launcher_helpers import REPO, bench_script


def test_samples_follow_the_stated_distribution(tmp_path):
    bench = bench_script("bench_sft")
    from recipes.trainer.sft import SftSamples

    lengths, prompts = bench.sample_lengths(3000, 128, 4096, seed=0)
    assert lengths.min() >= 128 and lengths.max() <= 4096
    # Log-uniform: a quarter of the log-range below the median's expected 724, and the mean (b - a) / ln(b / a).
    assert abs(np.median(lengths) - 724) < 60 and abs(lengths.mean() - 3968 / np.log(32)) < 60
    assert np.all(prompts >= 0.3 * lengths - 1) and np.all(prompts <= lengths - 1)
    prefix = str(tmp_path / "b_sft_document")
    bench.write_samples(prefix, lengths[:50], prompts[:50], vocab=400, seed=0)
    samples = SftSamples([prefix])
    assert samples.lengths.tolist() == lengths[:50].tolist()
    tokens, mask = samples.sample(7)
    assert tokens.max() < 400 and mask.tolist() == [0] * prompts[7] + [1] * (lengths[7] - prompts[7])


def test_every_run_passes_the_plan_and_a_row_reads_its_run(tmp_path):
    out = subprocess.run(
        [sys.executable, "bench/bench_sft.py", "--dry-run", "--results", str(tmp_path), "--samples", "400"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "planned 4 runs" in out.stdout
    bench = bench_script("bench_sft")
    run = tmp_path / "tiny_packed"
    prefix = str(tmp_path / "tiny_sft_document")
    counts, tokens = bench.step_samples(prefix, 2048, 8, 20, packing=True)
    records = [{"step": s, "loss": 3.0, "step_time_s": 0.5, "trained_tokens": 1000 + s} for s in range(1, 21)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    row = bench.row("tiny", True, run, prefix, window=10)
    assert row["tokens_per_s"] == 8 * 2048 / 0.5
    assert row["trained_tokens_per_s"] == sum(1000 + s for s in range(11, 21)) / 5.0
    assert row["non_padding_tokens_per_s"] == tokens[10:].sum() / 5.0 and row["samples_per_s"] == counts[10:].sum() / 5
    assert counts.min() > 8  # several samples per packed sequence
