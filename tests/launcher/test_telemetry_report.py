"""The report's GPU telemetry: parsing RUN_DIR/telemetry/<node>.csv (fixtures: two nodes of two GPUs, one GPU
throttled, one nearly idle), the summary over the steps, flagging, the plot, and `python -m launcher.report`."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.config.compose import compose
from launcher.jobs.rundir import config_yaml
from launcher.report import telemetry

from launcher_helpers import REPO

# A run directory of four GPUs on two nodes (docs/report.md and docs/watching.md show its report).
RUN_FIXTURE = Path(__file__).parent / "fixtures" / "telemetry_run"
FIXTURES = RUN_FIXTURE / "telemetry"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A run directory with the fixture telemetry, a plan and ten steps of metrics."""
    run = tmp_path / "run"
    shutil.copytree(FIXTURES, run / "telemetry")
    plan = {
        "model": "llama31_tiny",
        "num_gpus": 4,
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
    (run / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "loss": 10.0 - s, "step_time_s": 1.0}) + "\n" for s in range(1, 11))
    )
    return run


def test_rows_parse_and_a_line_cut_short_is_skipped():
    rows = telemetry.read_csv(FIXTURES / "gpu-b.csv")
    assert len(rows) == 26  # 13 samples x 2 GPUs; the truncated last line is dropped
    first = rows[0]
    assert (first.node, first.gpu, first.step, first.util_pct, first.sm_clock_mhz) == (
        "gpu-b",
        0,
        0.0,
        0.0,
        345.0,
    )
    assert first.clock_events == "gpu_idle"


def test_samples_during_steps_leave_out_start_up_and_the_end(tmp_path):
    assert telemetry.load(tmp_path) == []  # no telemetry/ directory
    rows = telemetry.read_csv(FIXTURES / "gpu-a.csv") + telemetry.read_csv(FIXTURES / "gpu-b.csv")
    steady = telemetry.during_steps(rows)
    # Steps 1..9 of a run whose last sample is at step 10: 9 samples per GPU, 4 GPUs; not the checkpoint save's.
    assert len(steady) == 36
    assert {r.step for r in steady} == set(range(1, 10))
    assert any(r.activity == "checkpoint" for r in rows) and not any(r.activity for r in steady)


def test_summary_and_flags_match_the_fixture_values():
    rows = telemetry.read_csv(FIXTURES / "gpu-a.csv") + telemetry.read_csv(FIXTURES / "gpu-b.csv")
    summaries = {s.name: s for s in telemetry.summarize(telemetry.during_steps(rows))}
    assert summaries["gpu-a GPU 0"].util_pct == 95 and summaries["gpu-a GPU 0"].sm_clock_mhz == 1980
    assert summaries["gpu-a GPU 1"].sm_clock_mhz == 1400 and summaries["gpu-a GPU 1"].temp_c == 83
    assert summaries["gpu-a GPU 1"].clock_events == {
        "sw_thermal_slowdown": pytest.approx(1.0),
        "hw_thermal_slowdown": pytest.approx(1.0),
    }
    assert summaries["gpu-b GPU 1"].util_pct == 30 and summaries["gpu-b GPU 1"].power_w == 240
    assert summaries["gpu-b GPU 0"].mem_used_gib == 40.0 and summaries["gpu-b GPU 0"].samples == 9

    flagged = telemetry.flag(list(summaries.values()), util_fraction=0.8, clock_fraction=0.9)
    # Utilisation median (94 + 95) / 2 = 94.5: 30 < 0.8 x 94.5 = 75.6. SM clock median 1980: 1400 < 1782.
    assert set(flagged) == {"gpu-b GPU 1", "gpu-a GPU 1"}
    assert flagged["gpu-b GPU 1"] == "utilisation 30% is below 80% of the median 94% over all GPUs"
    assert flagged["gpu-a GPU 1"].startswith("SM clock 1400 MHz is below 90% of the median 1980 MHz")
    # Looser thresholds flag only the idle GPU; a GPU alone has no peers to fall behind.
    assert set(telemetry.flag(list(summaries.values()), 0.5, 0.7)) == {"gpu-b GPU 1"}  # 1400 > 0.7 x 1980
    assert telemetry.flag([summaries["gpu-b GPU 1"]], 0.8, 0.9) == {}


def test_thresholds_come_from_the_run_config_or_conf(run_dir):
    assert telemetry.thresholds(run_dir) == (0.8, 0.9)  # no config.yaml: conf/observability.yaml
    cfg = compose(["telemetry.flag_utilization_below=0.25", "telemetry.flag_sm_clock_below=0.5"])
    (run_dir / "config.yaml").write_text(config_yaml(cfg))
    assert telemetry.thresholds(run_dir) == (0.25, 0.5)


def test_report_prints_the_table_and_flags_and_writes_the_plot(run_dir):
    lines: list[str] = []
    flagged = telemetry.report(run_dir, lines.append)
    assert set(flagged) == {"gpu-b GPU 1", "gpu-a GPU 1"}
    text = "\n".join(lines)
    assert "telemetry: 4 GPUs on 2 nodes, samples during steps 1-9" in text
    assert "flagged: gpu-b GPU 1: utilisation 30%" in text
    table_rows = [line for line in text.splitlines() if line.startswith(("gpu-a", "gpu-b"))]
    assert len(table_rows) == 4 and sum("<- flagged" in row for row in table_rows) == 2
    assert (run_dir / "telemetry.png").read_bytes()[:8] == PNG_MAGIC


def test_many_gpus_plot_node_medians_and_the_flagged_ones(tmp_path):
    rows = []
    for node in range(3):
        for gpu in range(8):
            for i in range(6):
                util = 20.0 if (node, gpu) == (2, 5) else 90.0
                rows.append(
                    telemetry.Sample(
                        time=100.0 + i,
                        node=f"n{node}",
                        gpu=gpu,
                        step=float(i),
                        util_pct=util,
                        mem_util_pct=10.0,
                        mem_used_mib=1000.0,
                        mem_total_mib=8e4,
                        power_w=500.0,
                        temp_c=60.0,
                        sm_clock_mhz=1980.0,
                        sm_clock_max_mhz=1980.0,
                        clock_events="",
                    )
                )
    steady = telemetry.during_steps(rows)
    flagged = telemetry.flag(telemetry.summarize(steady), 0.8, 0.9)
    assert list(flagged) == ["n2 GPU 5"]
    path = telemetry.plot(rows, tmp_path / "t.png", flagged, steady)
    assert path.read_bytes()[:8] == PNG_MAGIC


def test_the_plot_breaks_between_a_killed_run_and_its_resume_not_within_a_jittery_stretch():
    killed = [0.0, 1.1, 1.9, 3.0, 4.2, 5.0]  # ~1 s sampling with jitter
    resumed = [48.0, 49.0, 50.1, 51.0]  # after 43 s with no sampler running
    stretches = telemetry.sampling_stretches(killed + resumed)
    assert stretches == [(0.0, 5.0), (48.0, 51.0)]
    assert telemetry.sampling_stretches(killed) == [(0.0, 5.0)]
    points = telemetry.broken_at_gaps([(t, 90.0) for t in killed + resumed], stretches)
    gaps = [i for i, (x, y) in enumerate(points) if math.isnan(x) and math.isnan(y)]
    assert gaps == [len(killed)] and len(points) == len(killed) + len(resumed) + 1


def test_the_report_command_adds_telemetry_for_a_run_directory(run_dir):
    out = subprocess.run(
        [sys.executable, "-m", "launcher.report", str(run_dir)], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "tokens/s/GPU" in out.stdout  # the throughput table is still first
    assert "flagged: gpu-a GPU 1: SM clock 1400 MHz" in out.stdout
    assert f"telemetry plot: {run_dir / 'telemetry.png'}" in out.stdout
    assert (run_dir / "report.png").exists() and (run_dir / "telemetry.png").exists()


def test_a_run_without_telemetry_reports_as_before(run_dir):
    shutil.rmtree(run_dir / "telemetry")
    assert telemetry.report(run_dir, print) is None
    out = subprocess.run(
        [sys.executable, "-m", "launcher.report", str(run_dir)], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and "telemetry:" not in out.stdout and "telemetry plot" not in out.stdout
