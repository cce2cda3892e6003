"""The report on MLPerf runs: MLLOG fixtures (a converged run, an aborted one, several seeds) written by hand here,
read from run directories and bare logs, and the numbers the report prints checked against the ones computed in
the tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from common.typed import to_plain
from launcher.config.compose import compose
from launcher.plan.build import build_plan
from launcher.report import mlperf
from launcher.report.__main__ import main as report_main

START_MS = 1_700_000_000_000
GBS = 32


def mllog(key: str, time_ms: int, value=None, kind: str = "POINT_IN_TIME", **metadata) -> str:
    event = {
        "namespace": "",
        "time_ms": time_ms,
        "event_type": kind,
        "key": key,
        "value": value,
        "metadata": {"file": "recipes/train.py", "lineno": 1, **metadata},
    }
    return ":::MLLOG " + json.dumps(event)


def run_log(
    minutes: float,
    status: str,
    accuracies: list[float],
    seed: int,
    prefix: str = "",
    benchmark: str = "llama31_8b",
    every: int = 12288,
    gbs: int = GBS,
) -> str:
    """A run's MLLOG lines: init, hyperparameters, an evaluation every 12,288 samples, run_stop `minutes` after
    run_start."""
    t = START_MS
    lines = [
        mllog("cache_clear", t, True),
        mllog("init_start", t, kind="INTERVAL_START"),
        mllog("submission_benchmark", t, benchmark),
        mllog("submission_division", t, "closed"),
        mllog("seed", t, seed),
        mllog("global_batch_size", t, gbs),
        mllog("max_sequence_length", t, 8192),
        mllog("number_of_nodes", t, 1),
        mllog("accelerators_per_node", t, 8),
        mllog("init_stop", t + 60_000, kind="INTERVAL_END"),
        mllog("run_start", t + 60_000, kind="INTERVAL_START"),
    ]
    start = t + 60_000
    for k, accuracy in enumerate(accuracies, start=1):
        at = start + k * 1000
        lines += [
            mllog("eval_start", at, kind="INTERVAL_START", samples_count=k * every),
            mllog("eval_accuracy", at, accuracy, samples_count=k * every),
            mllog("eval_stop", at, kind="INTERVAL_END", samples_count=k * every),
        ]
    stop = start + round(minutes * 60_000)
    lines += [
        mllog("run_stop", stop, kind="INTERVAL_END", status=status),
        mllog("train_samples", stop, len(accuracies) * every),
    ]
    return "\n".join(prefix + line for line in lines) + "\n"


def progress(steps: int, step_time: float) -> str:
    return "".join(
        f"step {s}/{steps} | reduced_train_loss=3.0000 | global_step={s} | consumed_samples={s * GBS} | "
        f"train_step_timing in s={step_time:.4f}\n"
        for s in range(1, steps + 1)
    )


def run_dir(
    root: Path, name: str, log_text: str, step_time: float = 2.0, benchmark: str = "llama31_8b", *overrides: str
) -> Path:
    """A run directory as training leaves it: config.yaml, plan.json, metrics.jsonl, mllog.txt."""
    cfg = compose([f"training=mlperf/{benchmark}", "cluster=bcm", "dry_run=true", f"results_dir={root}", *overrides])
    plan = build_plan(cfg).to_json_dict()
    path = root / name
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(yaml.safe_dump(to_plain(cfg)))
    (path / "plan.json").write_text(json.dumps(plan))
    (path / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "loss": 3.0, "step_time_s": step_time}) + "\n" for s in range(1, 21))
    )
    (path / "mllog.txt").write_text(log_text)
    return path


def run_report(capsys, *args) -> str:
    assert report_main([str(a) for a in args]) == 0
    return capsys.readouterr().out


def mlperf_row(out: str, name: str) -> list[str]:
    """The cells of a run's row in the MLPerf table (below the throughput table, which names runs too)."""
    section = out[out.index("MLPerf ") :]
    return next(line for line in section.splitlines() if line.startswith(name + " ")).split()


def test_a_converged_run_directory(tmp_path, capsys):
    path = run_dir(tmp_path, "seed1", run_log(123.0, "success", [7.1, 4.2, 3.29], seed=1))
    out = run_report(capsys, path)
    # time to train = run_stop - run_start = 123 min; 3 evaluations of 12,288 samples -> 36,864 samples = 1,152 steps
    assert mlperf_row(out, "seed1")[:9] == ["seed1", "1", "success", "123.00", "min", "36,864", "1,152", "3", "3.2900"]
    assert "MLPerf llama31_8b, target 3.3 (rules training_6.1.0):" in out
    assert "eval curve seed1 (samples: log perplexity): 12,288: 7.1000, 24,576: 4.2000, 36,864: 3.2900" in out
    # the usual throughput table: 32 x 8192 tokens per 2.0 s step
    assert f"{32 * 8192 / 2.0:,.0f}" in out
    assert (path / "report.png").exists() and (path / "report_mlperf.png").exists()


def test_an_aborted_run_is_reported_without_a_score(tmp_path, capsys):
    path = run_dir(tmp_path, "seed2", run_log(200.5, "aborted", [7.0, 5.0, 4.0, 3.5], seed=2))
    out = run_report(capsys, path)
    assert mlperf_row(out, "seed2")[:9] == ["seed2", "2", "aborted", "200.50", "min", "49,152", "1,536", "4", "3.5000"]
    assert (
        "score: none: 1 runs leave none once the fastest and the slowest are dropped; a result needs 10 runs, "
        "here 1" in out
    )


@pytest.mark.parametrize(
    "minutes,statuses,score,why",
    [
        # five converged runs: the fastest (100) and the slowest (200) are left out -> (110 + 120 + 130) / 3
        (
            [100.0, 110.0, 120.0, 130.0, 200.0],
            ["success"] * 5,
            "120.00 min",
            "olympic mean of 3 of 5 runs (the fastest and the slowest run left out)",
        ),
        # one run did not converge: it counts as the slowest, only the fastest (100) is left out -> (110 + 125) / 2
        (
            [100.0, 110.0, 125.0, 90.0],
            ["success", "success", "success", "aborted"],
            "117.50 min",
            "olympic mean of 2 of 4 runs (the fastest run and the one that did not converge left out)",
        ),
        # two did not converge: no score
        (
            [100.0, 110.0, 120.0, 90.0],
            ["success", "success", "aborted", "aborted"],
            "none",
            "2 of 4 runs did not reach the target; the rules drop at most 1",
        ),
    ],
)
def test_several_seeds_give_the_olympic_mean(tmp_path, capsys, minutes, statuses, score, why):
    paths = [
        run_dir(tmp_path, f"seed{k}", run_log(m, status, [5.0, 3.2 if status == "success" else 3.4], seed=k))
        for k, (m, status) in enumerate(zip(minutes, statuses), start=1)
    ]
    out = run_report(capsys, *paths, "--plot", tmp_path / "all.png")
    assert f"score: {score}: {why}" in out
    assert [mlperf_row(out, p.name)[2] for p in paths] == statuses
    assert (tmp_path / "all_mlperf.png").exists()


def test_a_bare_job_log_with_rank_prefixes(tmp_path, capsys):
    """A job log (progress lines and MLLOG lines, each prefixed as srun --label does) needs no flags: the MLLOG
    states the batch size, sequence length and GPUs."""
    log = tmp_path / "training_123.out"
    log.write_text(progress(20, 1.6) + run_log(42.25, "success", [4.0, 3.1], seed=5, prefix="7: "))
    out = run_report(capsys, log, "--plot", tmp_path / "r.png")
    assert mlperf_row(out, "training_123.out")[:9] == [
        "training_123.out",
        "5",
        "success",
        "42.25",
        "min",
        "24,576",
        "768",
        "2",
        "3.1000",
    ]
    assert f"{32 * 8192 / 1.6:,.0f}" in out  # tokens/s from the progress lines
    assert "compliance" in out


def test_an_mllog_file_alone_still_gets_its_score(tmp_path, capsys):
    log = tmp_path / "mllog.txt"
    log.write_text(run_log(61.0, "success", [3.0], seed=3))
    out = run_report(capsys, log, "--plot", tmp_path / "r.png")
    assert "note: no throughput for" in out and "61.00 min" in out


def test_a_log_written_twice_holds_two_runs():
    text = run_log(10.0, "aborted", [5.0], seed=1) + run_log(20.0, "success", [3.0], seed=1)
    runs = mlperf.split_runs(mlperf.parse_mllog(text))
    assert len(runs) == 2 and [r[-2].metadata["status"] for r in runs] == ["aborted", "success"]


def test_compliance_of_a_hand_written_log_names_what_is_missing(tmp_path):
    log = tmp_path / "mllog.txt"
    log.write_text(run_log(5.0, "success", [3.0], seed=1))
    problems = mlperf.compliance_problems(log, "llama31_8b", "6.1.0")
    assert any("opt_base_learning_rate" in p for p in problems)  # the hand-written log has no hyperparameters
    assert mlperf.latest_ruleset("llama31_405b") == "6.0.0"


def test_ten_lora_benchmark_runs_give_its_score(tmp_path, capsys):
    """llama2_70b_lora: 10 runs per result, evaluations every 384 samples; one run missed the target."""
    minutes = [20.0 + k for k in range(10)]
    statuses = ["success"] * 9 + ["aborted"]
    paths = [
        run_dir(
            tmp_path,
            f"seed{k}",
            run_log(
                m,
                status,
                [1.1, 0.95, 0.92 if status == "success" else 0.93],
                seed=k,
                benchmark="llama2_70b_lora",
                every=384,
                gbs=8,
            ),  # fmt: skip
            2.0,
            "llama2_70b_lora",
        )
        for k, (m, status) in enumerate(zip(minutes, statuses), start=1)
    ]
    out = run_report(capsys, *paths)
    assert "MLPerf llama2_70b_lora, target 0.925" in out
    # The aborted run counts as the slowest; the fastest (20 min) is left out: the mean of 21..28 min.
    assert f"score: {sum(minutes[1:9]) / 8:.2f} min: olympic mean of 8 of 10 runs" in out
    assert "a result needs" not in out
    assert mlperf_row(out, "seed1")[:8] == ["seed1", "1", "success", "20.00", "min", "1,152", "144", "3"]
