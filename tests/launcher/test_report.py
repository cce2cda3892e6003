"""The report: parsing progress lines (ours and NeMo's), the throughput / MFU table, the plot."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.plan.hardware import gpu_spec
from launcher.report import throughput

from launcher_helpers import REPO, bench_script

FIXTURES = Path(__file__).parent / "fixtures"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run_report(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "launcher.report", *args], cwd=REPO, capture_output=True, text=True, timeout=120
    )


def test_parses_nemo_progress_lines():
    line = (
        "Epoch 0: : 100%|##########| 50/50 [09:20<00:00, reduced_train_loss=11.00, global_step=49.00, "
        "consumed_samples=6400.0, train_step_timing in s=11.20]"
    )
    assert throughput.parse_log(line) == [
        throughput.StepRecord(step=49, loss=11.0, consumed_samples=6400.0, step_time_s=11.2)
    ]


def test_parses_the_recipes_progress_lines():
    line = (
        "step 10/50 | reduced_train_loss=7.1234 | global_step=10 | consumed_samples=80 | "
        "train_step_timing in s=0.1234 | lr=1.000e-03 | grad_norm=1.234 | tokens_per_s=132000.5 | "
        "tflops_per_gpu=101.2 | mfu=0.412"
    )
    (record,) = throughput.parse_log("some banner\n" + line + "\nbye\n")
    assert record == throughput.StepRecord(
        step=10,
        loss=7.1234,
        consumed_samples=80.0,
        step_time_s=0.1234,
        lr=1e-3,
        grad_norm=1.234,
        tokens_per_s=132000.5,
        tflops_per_gpu=101.2,
        mfu=0.412,
    )


def test_progress_bar_redraws_keep_the_last_value_per_step():
    text = (
        "\r".join(f"Epoch 0: : 5/50 [00:01<00:00, global_step=4.00, train_step_timing in s={t}]" for t in (9.0, 8.0))
        + "\n"
    )
    assert [r.step_time_s for r in throughput.parse_log(text)] == [8.0]


def test_late_window_is_35_to_44_of_50():
    assert throughput.late_window(50) == (35, 45)
    assert throughput.late_window(4) == (1, 4)


def test_nemo_log_gives_the_seed_table(tmp_path):
    png = tmp_path / "plot.png"
    out = run_report(
        str(FIXTURES / "nemo_70b_fp8.log"),
        "--gbs",
        "128",
        "--seq",
        "8192",
        "--gpus",
        "64",
        "--model",
        "llama31/70b",
        "--peak",
        "fp8",
        "--plot",
        str(png),
    )
    assert out.returncode == 0, out.stderr
    header, _, row = out.stdout.splitlines()[:3]
    assert "tokens/s/GPU" in header and "MFU" in header and "days/1T tok" in header
    assert "11.310" in row and "92,712" in row and "1,449" in row and "35.2%" in row and "124.8" in row, row
    assert "h100 fp8 1979T" in row
    assert "35-44 of 50" in row
    assert "h100 fp8 = 1979 TFLOP/s" in out.stdout
    assert "warning" not in out.stdout and "%!" not in out.stdout  # a plausible MFU is not flagged
    assert png.read_bytes()[:8] == PNG_MAGIC


def test_an_mfu_above_100_percent_is_flagged_with_the_peak_and_what_to_check(tmp_path):
    # The same log as above over 8 GPUs instead of 64: 8 times the FLOPs per GPU, 281.9% of the fp8 peak.
    out = run_report(
        str(FIXTURES / "nemo_70b_fp8.log"),
        "--gbs",
        "128",
        "--seq",
        "8192",
        "--gpus",
        "8",
        "--model",
        "llama31/70b",
        "--peak",
        "fp8",
        "--plot",
        str(tmp_path / "plot.png"),
    )
    assert out.returncode == 0, out.stderr
    row = out.stdout.splitlines()[2]
    assert "281.9%!" in row, row
    (warning,) = [line for line in out.stdout.splitlines() if line.startswith("warning:")]
    assert warning.startswith("warning: nemo_70b_fp8.log: MFU 281.9% cannot be right (above 100%)"), warning
    assert "h100 fp8 peak, 1979 TFLOP/s per GPU, for 8 GPUs, GBS 128, seq 8192" in warning
    assert warning.endswith("check --gpu, --peak, --gpus, --gbs, --seq and --model")


def test_an_impossible_mfu_of_a_run_directory_names_the_plans_gpu_type(tmp_path):
    run = _run_dir(tmp_path, "wrong_plan", 0.25)
    plan = json.loads((run / "plan.json").read_text())
    (run / "plan.json").write_text(json.dumps({**plan, "model_flops_per_sample": 1.2e14}))  # 100x the tiny model
    out = run_report(str(run))
    (warning,) = [line for line in out.stdout.splitlines() if line.startswith("warning:")]
    assert "MFU 194.1% cannot be right" in warning and "h100 bf16 peak, 989 TFLOP/s" in warning, warning
    assert warning.endswith("check the plan's gpu_type (h100) and sizes")


def test_a_bare_logs_plot_goes_beside_it_never_into_the_current_directory(tmp_path):
    logs, cwd = tmp_path / "logs", tmp_path / "cwd"
    logs.mkdir()
    cwd.mkdir()
    log = logs / "nemo.log"
    log.write_text((FIXTURES / "nemo_70b_fp8.log").read_text())
    out = subprocess.run(
        [sys.executable, "-m", "launcher.report", str(log), "--gbs", "128", "--seq", "8192", "--gpus", "64"],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert f"plot: {logs / 'nemo_report.png'}" in out.stdout
    assert (logs / "nemo_report.png").read_bytes()[:8] == PNG_MAGIC
    assert list(cwd.iterdir()) == []


def test_numbers_follow_the_reference_formulas():
    steps = throughput.parse_log((FIXTURES / "nemo_70b_fp8.log").read_text())
    assert len(steps) == 50
    info = throughput.RunInfo("70b", 128, 8192, 64, 3.94e15, gpu_spec("h100").fp8_peak_flops, "h100 fp8")
    r = throughput.summarize(info, steps)
    assert r.step_time_s == pytest.approx(11.31)
    assert r.tokens_per_s == pytest.approx(128 * 8192 / 11.31)
    assert r.mfu == pytest.approx(128 * 3.94e15 / 11.31 / 64 / 1979e12)
    assert r.days_to_train_1t_tokens == pytest.approx(1e12 / (128 * 8192 / 11.31) / 86400)


def _run_dir(root: Path, name: str, step_time: float, with_metrics: bool = True) -> Path:
    run = root / name
    (run / "logs").mkdir(parents=True)
    plan = {
        "model": "llama31_tiny",
        "num_gpus": 2,
        "tp": 1,
        "pp": 1,
        "cp": 1,
        "vp": None,
        "global_batch_size": 8,
        "seq_length": 2048,
        "model_flops_per_sample": 1.2e12,
        "gpu_type": "h100",
        "peak_flops_kind": "bf16",
        "peak_flops_per_gpu": 989e12,
    }
    (run / "plan.json").write_text(json.dumps(plan))
    records = [
        {"step": i + 1, "loss": 10 - i * 0.1, "step_time_s": step_time * (3 if i == 0 else 1)} for i in range(20)
    ]
    records.append({"step": 20, "val_loss": 8.5})
    if with_metrics:
        (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records) + '\n{"step": 2')
    else:
        (run / "logs" / "training.log").write_text(
            "\n".join(
                f"step {r['step']}/20 | reduced_train_loss={r['loss']:.4f} | global_step={r['step']} | "
                f"train_step_timing in s={r['step_time_s']}"
                for r in records
                if "step_time_s" in r
            )
            + "\n"
        )
    return run


def test_compares_run_directories_from_metrics_and_from_logs(tmp_path):
    a = _run_dir(tmp_path, "run_a", 0.25)
    b = _run_dir(tmp_path, "run_b", 0.5, with_metrics=False)
    png = tmp_path / "cmp.png"
    out = run_report(str(a), str(b), "--plot", str(png))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    row_a = next(line for line in lines if line.startswith("run_a"))
    row_b = next(line for line in lines if line.startswith("run_b"))
    assert "65,536" in row_a and "0.250" in row_a  # 8 x 2048 / 0.25
    assert "32,768" in row_b and "0.500" in row_b
    assert "h100 bf16 989T" in row_a
    assert png.read_bytes()[:8] == PNG_MAGIC


def test_one_run_directory_gets_its_plot_inside(tmp_path):
    run = _run_dir(tmp_path, "solo", 0.25)
    out = run_report(str(run), "--window", "5:15")
    assert out.returncode == 0, out.stderr
    assert "5-14 of 20" in out.stdout
    assert (run / "report.png").read_bytes()[:8] == PNG_MAGIC


def test_a_bare_log_without_sizes_is_a_clear_error():
    out = run_report(str(FIXTURES / "nemo_70b_fp8.log"))
    assert out.returncode == 2
    assert "--gbs, --seq, --gpus" in out.stderr


def test_a_run_without_timings_is_a_clear_error(tmp_path):
    run = _run_dir(tmp_path, "empty", 0.25)
    (run / "metrics.jsonl").unlink()
    out = run_report(str(run))
    assert out.returncode == 2 and "no step timings" in out.stderr


def test_benchmark_row_averages_the_last_steps_against_the_bf16_peak(tmp_path):
    from launcher.config.compose import compose
    from launcher.plan.build import build_plan

    bench_train = bench_script("bench_train")
    plan = build_plan(compose(["training=llama31/8b", "cluster=bcm", "dtype=fp8"])).to_json_dict()
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    step_times = [30.0, 14.0, 12.0, 13.0]
    (tmp_path / "metrics.jsonl").write_text(
        "".join(
            json.dumps({"step": i + 1, "loss": 9.0 - i, "step_time_s": t, "peak_memory_gib": 50.0 + i}) + "\n"
            for i, t in enumerate(step_times)
        )
    )

    row = bench_train.table_row("fp8", tmp_path, window=2)

    step = 12.5
    gpus, gbs = plan["num_gpus"], plan["global_batch_size"]
    assert row["step_time_s"] == pytest.approx(step)
    assert row["tokens_per_s_per_gpu"] == pytest.approx(gbs * plan["seq_length"] / step / gpus)
    # An fp8 run is still divided by the bf16 peak, so rows of both dtypes compare.
    bf16_peak = gpu_spec(plan["gpu_type"]).bf16_peak_flops
    assert row["mfu_bf16"] == pytest.approx(gbs * plan["model_flops_per_sample"] / step / gpus / bf16_peak)
    assert row["layout"] == f"TP{plan['tp']} PP1 CP{plan['cp']} DP{plan['dp']} MBS{plan['micro_batch_size']}"
    assert (row["peak_memory_gib"], row["final_loss"], row["dtype"]) == (53.0, 6.0, "fp8")


def test_a_fine_tuning_run_reports_its_trained_tokens_beside_all_tokens(tmp_path):
    """metrics.jsonl of an SFT run carries trained_tokens_per_s (the loss mask's tokens); the table adds the column
    (a token-weighted average over the window), and a log's progress lines give the same."""
    sft = _run_dir(tmp_path, "sft", 0.25)
    records = [json.loads(line) for line in (sft / "metrics.jsonl").read_text().splitlines()[:-1]]
    # Steps alternate 1,000 and 3,000 trained tokens in 0.25 s: 8,000 per second over the window.
    for r in records:
        if "step_time_s" in r:
            r["trained_tokens_per_s"] = (1000 if r["step"] % 2 else 3000) / r["step_time_s"]
    (sft / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    plain = _run_dir(tmp_path, "plain", 0.25)
    out = run_report(str(sft), str(plain), "--window", "4:14", "--plot", str(tmp_path / "sft.png"))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    header = next(line for line in lines if line.startswith("run"))
    assert "trained tok/s" in header
    assert "8,000" in next(line for line in lines if line.startswith("sft"))
    assert "65,536" in next(line for line in lines if line.startswith("plain"))
    text = "step 3/20 | reduced_train_loss=2.0000 | train_step_timing in s=0.5000 | trained_tokens_per_s=6000"
    assert throughput.parse_log(text)[0].trained_tokens_per_s == 6000
    alone = run_report(str(plain))
    assert "trained tok/s" not in alone.stdout  # pretraining trains on every token: no column
