"""bench/bench_train.py's rows: MFU against the bf16 and the fp8 peak, and the ratio to NVIDIA's published row for
the model and dtype (conf/perf/nvidia_h100.yaml), also for layer-count proxies."""

from __future__ import annotations

import json

import pytest
import yaml

from launcher.autoconf.perfdata import NVIDIA_H100, nvidia_reference, training_model
from launcher.config.compose import compose
from launcher.plan.build import build_plan
from launcher.plan.formulas import model_flops_per_sample
from launcher.plan.hardware import gpu_spec

from launcher_helpers import bench_script


def _run_dir(tmp_path, overrides, step_time):
    plan = build_plan(
        compose([*overrides, "cluster=bcm", "cluster.gpu_type=h200", "cluster.gpus_per_node=4", "memory_check=false"])
    )
    (tmp_path / "plan.json").write_text(json.dumps(plan.to_json_dict()))
    (tmp_path / "metrics.jsonl").write_text(
        "".join(
            json.dumps({"step": i + 1, "loss": 5.0, "step_time_s": step_time, "peak_memory_gib": 70.0}) + "\n"
            for i in range(4)
        )
    )
    return plan


@pytest.mark.parametrize(
    "row", yaml.safe_load(NVIDIA_H100.read_text())["rows"], ids=lambda r: f"{r['model']}-{r['dtype']}"
)
def test_published_mfu_is_what_the_plan_formula_gives_for_the_published_throughput(row):
    reference = nvidia_reference(row["model"], row["dtype"])
    mfu = reference.mfu(training_model(row["model"]), row["published_mfu_peak"])
    assert mfu == pytest.approx(row["published_mfu"], rel=0.015)


def test_an_fp8_row_shows_both_peaks_and_its_ratio_to_nvidia(tmp_path):
    plan = _run_dir(
        tmp_path,
        [
            "training=llama31/8b",
            "parallelism=tp1",
            "parallelism.num_gpus=4",
            "dtype=fp8",
            "training.global_batch_size=32",
        ],
        4.4,
    )
    row = bench_script("bench_train").table_row("dp4-fp8", tmp_path, window=2)
    h200 = gpu_spec("h200")
    mfu = 32 * plan.model_flops_per_sample / 4.4 / 4 / h200.bf16_peak_flops
    assert row["mfu_bf16"] == pytest.approx(mfu)
    assert row["mfu_fp8"] == pytest.approx(mfu * h200.bf16_peak_flops / h200.fp8_peak_flops)
    flops_per_token = model_flops_per_sample(training_model("llama31_8b"), 8192) / 8192
    theirs = 14048 * flops_per_token / gpu_spec("h100").bf16_peak_flops
    assert row["nvidia_mfu_bf16"] == pytest.approx(theirs)
    assert row["vs_nvidia"] == pytest.approx(mfu / theirs)
    assert "14,048 tokens/s/GPU on 8 H100" in row["nvidia"] and "DGX Cloud" in row["nvidia"]


def test_a_layer_proxy_compares_with_the_full_models_row(tmp_path):
    plan = _run_dir(
        tmp_path,
        [
            "training=llama31/405b",
            "training.model.num_layers=4",
            "parallelism=custom",
            "parallelism.tp=4",
            "parallelism.num_gpus=4",
            "parallelism.sequence_parallel=true",
            "parallelism.tp_comm_overlap=true",
            "training.global_batch_size=32",
        ],
        12.0,
    )
    row = bench_script("bench_train").table_row("405b-proxy", tmp_path, window=2)
    full = nvidia_reference("llama31_405b", "bf16").mfu(training_model("llama31_405b"))
    assert row["vs_nvidia"] == pytest.approx(row["mfu_bf16"] / full)
    # The proxy's own FLOPs (4 layers) give its MFU; the reference's are the 126-layer model's.
    assert plan.model_flops_per_sample < model_flops_per_sample(training_model("llama31_405b"), 8192) / 10


def test_rows_without_a_reference_print_a_dash(tmp_path, capsys):
    _run_dir(tmp_path, ["training=llama31/tiny", "parallelism=tp1"], 0.1)
    bench = bench_script("bench_train")
    row = bench.table_row("tiny", tmp_path, window=2)
    assert row["vs_nvidia"] is None and row["nvidia"] is None
    bench.print_table([row])
    bench.print_references([row])
    line = capsys.readouterr().out.splitlines()[-1]
    # vs NVIDIA, then memory, SM clock and power (no telemetry here: dashes).
    assert line.split()[-4] == "-" and line.split()[-2:] == ["-", "-"] and "vs NVIDIA" not in line


def _telemetry(run_dir, samples):
    """A telemetry CSV as recipes/observability/telemetry.py writes it: (step, SM MHz, W, reasons, activity)."""
    (run_dir / "telemetry").mkdir()
    lines = ["time,node,step,gpu,util_pct,mem_util_pct,mem_used_mib,mem_total_mib,power_w,temp_c,sm_clock_mhz,"
             "sm_clock_max_mhz,clock_events,activity"]  # fmt: skip
    for i, (step, mhz, watts, reasons, activity) in enumerate(samples):
        lines.append(f"{i}.0,n0,{step},0,100,50,1000,80000,{watts},60,{mhz},1980,{reasons},{activity}")
    (run_dir / "telemetry" / "n0.csv").write_text("\n".join(lines) + "\n")


def test_a_row_has_the_clock_and_power_of_the_timed_steps_only(tmp_path, capsys):
    _run_dir(tmp_path, ["training=llama31/tiny", "parallelism=tp1"], 0.1)
    # Steps 1-4, window 2: steps 3 and 4, so samples taken after step 2 or 3 ended (their step column 2 or 3).
    _telemetry(
        tmp_path,
        [
            (0, 1980, 100, "", "startup"),
            (1, 1980, 300, "", ""),
            (2, 1700, 690, "sw_power_cap", ""),
            (2, 1750, 700, "sw_power_cap", ""),
            (2, 1800, 650, "", "checkpoint"),  # not a step's sample
            (3, 1900, 600, "", ""),
            (4, 1980, 90, "gpu_idle", ""),  # after the last step
        ],
    )
    bench = bench_script("bench_train")
    row = bench.table_row("tiny", tmp_path, window=2)
    assert row["telemetry_samples"] == 3
    assert row["sm_clock_mhz"] == 1750 and row["power_w"] == 690
    assert row["clock_events"] == "sw_power_cap 67%"
    bench.print_table([row])
    out = capsys.readouterr().out.splitlines()
    assert out[-2].split()[-2:] == ["1,750", "690"]
    assert out[-1] == "  tiny: clock events in the timed steps' samples: sw_power_cap 67%"


def test_repeats_take_the_median_clock_of_the_runs_that_sampled():
    rows = [
        {**_row("a-r1", 100.0, 1.0, "a"), "sm_clock_mhz": 1700.0, "power_w": 700.0},
        {**_row("a-r2", 101.0, 1.0, "a"), "sm_clock_mhz": 1800.0, "power_w": None},
        _row("a-r3", 102.0, 1.0, "a"),
    ]
    (summary,) = bench_script("bench_train").summarize_repeats(["a"], rows)
    assert summary.sm_clock_mhz == 1750.0 and summary.power_w == 700.0


def _row(case, tokens, step_time, base=None, mfu=0.5):
    row = {"case": case, "tokens_per_s_per_gpu": tokens, "step_time_s": step_time, "mfu_bf16": mfu}
    return {**row, "base_case": base} if base else row


def test_repeats_give_medians_spread_and_the_change_against_the_first_case():
    bench = bench_script("bench_train")
    rows = [
        _row("defaults-r1", 100.0, 1.0, "defaults"),
        _row("variant-r1", 90.0, 1.1, "variant"),
        _row("defaults-r2", 104.0, 0.96, "defaults"),
        _row("variant-r2", 99.0, 1.01, "variant"),
        _row("defaults-r3", 98.0, 1.02, "defaults"),
        {"case": "variant-r3", "error": "exit 1", "base_case": "variant"},
    ]
    defaults, variant = bench.summarize_repeats(["defaults", "variant"], rows)
    assert (defaults.runs, defaults.failed) == (3, 0)
    assert defaults.tokens_per_s_per_gpu == 100.0 and defaults.step_time_s == 1.0
    assert (defaults.tokens_min, defaults.tokens_max) == (98.0, 104.0)
    assert defaults.spread == pytest.approx(0.06) and defaults.vs_first == 0.0
    # Two runs: the median is their mean; the failed third is counted, not averaged.
    assert (variant.runs, variant.failed) == (2, 1)
    assert variant.tokens_per_s_per_gpu == pytest.approx(94.5)
    assert variant.step_time_s == pytest.approx(1.055)
    assert variant.vs_first == pytest.approx(94.5 / 100 - 1)
    table = bench.format_repeats([defaults, variant], 3)
    line = next(x for x in table.splitlines() if x.startswith("variant"))
    assert "2/3" in line and "90-99" in line and line.split()[-3] == "-5.5%"


def test_a_case_without_a_finished_run_has_no_median():
    bench = bench_script("bench_train")
    first, second = bench.summarize_repeats(
        ["a", "b"], [{"case": "a", "error": "exit 1", "base_case": "a"}, _row("b", 50.0, 2.0, "b")]
    )
    assert first.tokens_per_s_per_gpu is None and first.spread is None
    assert second.vs_first is None  # nothing to compare with
    assert "no run finished" in bench.format_repeats([first, second], 2)


def test_repeats_interleave_the_cases_and_go_on_where_an_earlier_invocation_stopped(tmp_path, monkeypatch):
    bench = bench_script("bench_train")
    # An earlier invocation finished dflt-r1 (4 steps) and was killed in fp8-r1 after 2 of 4 steps.
    for name, steps in (("dflt-r1", 4), ("fp8-r1", 2)):
        run_dir = tmp_path / name
        run_dir.mkdir()
        _run_dir(run_dir, ["training=llama31/tiny", "parallelism=tp1"], 0.1)
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()[:steps]
        (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    ran = []

    def fake_run_case(name, overrides, args, results, timeout=None):
        ran.append((name, overrides))
        return {"case": name, "tokens_per_s_per_gpu": 10.0, "step_time_s": 1.0, "mfu_bf16": 0.1}

    monkeypatch.setattr(bench, "run_case", fake_run_case)
    monkeypatch.setattr(bench, "print_table", lambda rows: None)
    args = type(
        "A",
        (),
        {
            "repeat": 2,
            "case": [["dflt", "dtype=bf16"], ["fp8", "dtype=fp8 x=1"]],
            "steps": 4,
            "window": 2,
            "budget_s": None,
            "timeout_s": None,
        },
    )()
    rows, left = bench.run_repeats(args, tmp_path)
    assert [r["case"] for r in rows] == ["dflt-r1", "fp8-r1", "dflt-r2", "fp8-r2"]
    assert [r["base_case"] for r in rows] == ["dflt", "fp8", "dflt", "fp8"]
    assert ran == [("fp8-r1", ["dtype=fp8", "x=1"]), ("dflt-r2", ["dtype=bf16"]), ("fp8-r2", ["dtype=fp8", "x=1"])]
    assert rows[0]["step_time_s"] == pytest.approx(0.1) and left == []


def test_a_repeat_past_its_budget_names_the_runs_it_left(tmp_path, monkeypatch):
    bench = bench_script("bench_train")
    clock = [0.0]  # a clock that only a run moves: each takes 20 s

    def fake_run_case(name, *args, **kwargs):
        clock[0] += 20
        return {"case": name, "tokens_per_s_per_gpu": 1.0, "step_time_s": 1.0}

    monkeypatch.setattr(bench.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(bench, "print_table", lambda rows: None)
    monkeypatch.setattr(bench, "run_case", fake_run_case)
    args = type(
        "A",
        (),
        {"repeat": 3, "case": [["a", ""], ["b", ""]], "steps": 4, "window": 2, "budget_s": 45, "timeout_s": None},
    )()
    rows, left = bench.run_repeats(args, tmp_path)
    # At 40 s a third run of 20 s would end past 45 s: it and every later one are left.
    assert [r["case"] for r in rows] == ["a-r1", "b-r1"]
    assert left == ["a-r2", "b-r2", "a-r3", "b-r3"]


def test_a_single_run_keeps_its_name():
    bench = bench_script("bench_train")
    assert bench.run_name("dp2-fp8", 1, 0) == "dp2-fp8"
    assert bench.run_name("dp2-fp8", 3, 2) == "dp2-fp8-r3"


def test_runs_an_earlier_invocation_brought_back_count_as_done(tmp_path, monkeypatch):
    """A machine given back between invocations keeps no run directories: the rows of its --json file stand in."""
    bench = bench_script("bench_train")
    earlier = tmp_path / "earlier.json"
    runs = [_row("a-r1", 100.0, 1.0, "a"), {"case": "b-r1", "error": "exit 1", "base_case": "b"}]
    earlier.write_text(json.dumps({"runs": runs, "medians": []}))
    ran, saved = [], []

    def fake_run_case(name, *args, **kwargs):
        ran.append(name)
        return _row(name, 90.0, 1.1)

    monkeypatch.setattr(bench, "run_case", fake_run_case)
    monkeypatch.setattr(bench, "print_table", lambda rows: None)
    args = type(
        "A",
        (),
        {"repeat": 2, "case": [["a", ""], ["b", ""]], "steps": 4, "window": 2, "budget_s": None, "timeout_s": None},
    )()
    previous = bench.read_previous([str(earlier)])
    rows, left = bench.run_repeats(args, tmp_path / "results", previous, lambda rows: saved.append(len(rows)))
    assert ran == ["b-r1", "a-r2", "b-r2"]  # the failed run is run again
    assert rows[0]["tokens_per_s_per_gpu"] == 100.0 and saved == [1, 2, 3, 4]
    out = bench.json_output(rows, ["a", "b"], 2)
    assert [m["case"] for m in out["medians"]] == ["a", "b"] and out["medians"][0]["tokens_per_s_per_gpu"] == 95.0
    assert bench.json_output(rows, ["a", "b"], 1) == rows
    earlier.write_text("[1, 2")
    with pytest.raises(SystemExit, match="not a bench_train.py --json file"):
        bench.read_previous([str(earlier)])


def test_profile_traces_a_step_before_the_window_of_every_run_and_names_its_join(tmp_path, monkeypatch, capsys):
    bench = bench_script("bench_train")
    ran = []

    def fake_run_case(name, overrides, *args, **kwargs):
        ran.append(overrides)
        return _row(name, 90.0, 1.1) if name == "a" else {"case": name, "error": "exit 1"}

    monkeypatch.setattr(bench, "run_case", fake_run_case)
    monkeypatch.setattr(bench, "print_table", lambda rows: None)
    monkeypatch.setattr(bench, "print_references", lambda rows: None)
    common = ["--steps", "12", "--window", "6", "--results", str(tmp_path), "--profile"]
    bench.main([*common, "--case", "a", "dtype=bf16", "--case", "b", ""])
    traced = f"profile.start_step={bench.PROFILED_STEP}"
    assert ran[0][0] == "dtype=bf16" and all(traced in run and "profile.enabled=true" in run for run in ran)
    joins = [line for line in capsys.readouterr().out.splitlines() if "bench_kernels.py --trace" in line]
    # Only the finished run has a trace to join; its name is the one the profiler writes.
    assert joins == [f"a: python bench/bench_kernels.py --trace {tmp_path}/a/profile/rank0_steps4-4.pt.trace.json.gz"]
    with pytest.raises(SystemExit):
        bench.main([*common, "--window", "9", "--case", "a", ""])
    assert "--window 9 would time it" in capsys.readouterr().err
