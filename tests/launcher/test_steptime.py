"""The step-time model that ranks parallelism=auto's layouts: held to every measured run (conf/perf/measured.yaml)
and, more tightly, to the runs held out of its fit, ordering the layouts measured on one machine as they measured,
its terms behaving as the formulas say, and the fit (launcher/autoconf/stepfit.py) finding constants that made the
rows."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
from collections import defaultdict

import pytest
import yaml

from common.typed import changed
from launcher.autoconf import perfdata, search, stepfit, steptime
from launcher.config.compose import compose
from launcher.plan.build import build_plan
from launcher.report.ranking import group_key

from launcher_helpers import REPO, bench_script

CHECKS = steptime.check_rows()
CONSTANTS = steptime.default_constants()


@pytest.mark.parametrize("check", CHECKS, ids=[c.name for c in CHECKS])
def test_every_measured_run_is_predicted_within_15_percent(check):
    assert abs(check.error) < 0.15, (
        f"{check.name}: measured {check.measured:.0f}, model {check.predicted.tokens_per_s_per_gpu:.0f} tokens/s/GPU"
    )


# The held-out rows (measured.yaml's `split: held_out`), predicted by auto.yaml's constants: bench/fit_steptime.py
# prints for them a mean |error| of 2.8% and a largest of 5.2% (70B TP4 PP4 CP2 VP5 on 64 H100); the constants fit
# to the fit rows alone give 3.2% and 6.6%. 8% per row and 4% on average hold them to about that, with room for a
# refit's shift of a point or so, and well inside the 15% every row is held to.
HELD_OUT_ROW_TOLERANCE = 0.08
HELD_OUT_MEAN_TOLERANCE = 0.04


def test_every_row_has_a_split_and_both_splits_have_rows():
    rows = perfdata.measured_rows()
    assert all(row.get("split") in perfdata.SPLITS for row in rows)
    assert {row["split"] for row in rows} == set(perfdata.SPLITS) == {"fit", "held_out"}
    assert [c.split for c in CHECKS] == [row["split"] for row in rows]
    # The pending cases carry theirs already, so a measured one keeps it when it moves into `rows`.
    assert {row.get("split") for row in perfdata.pending_rows()} == {"fit", "held_out"}


def test_a_row_without_a_valid_split_is_refused_by_name():
    row = {**perfdata.measured_rows()[0], "name": "unsplit"}
    for split in (None, "test"):
        with pytest.raises(ValueError, match="'unsplit': split=.* must be one of fit, held_out"):
            steptime.check_rows(rows=[{**row, "split": split}])


@pytest.mark.parametrize("check", [c for c in CHECKS if c.split == "held_out"], ids=lambda c: c.name)
def test_held_out_rows_are_predicted_within_the_held_out_tolerance(check):
    assert abs(check.error) < HELD_OUT_ROW_TOLERANCE, (
        f"{check.name}: measured {check.measured:.0f}, model {check.predicted.tokens_per_s_per_gpu:.0f} tokens/s/GPU"
    )


def test_held_out_rows_are_predicted_within_the_mean_tolerance():
    held_out = [abs(c.error) for c in CHECKS if c.split == "held_out"]
    assert len(held_out) >= 5 and sum(held_out) / len(held_out) < HELD_OUT_MEAN_TOLERANCE


# The largest misses are the TP4 fp8 proxies on 4 H200, which today's code runs 9.1% and 10.3% faster than the model
# predicts (constants fit to them are worse on the held-out rows, so auto.yaml keeps today's), and the 70B proxy's PP2.
def test_our_runs_on_h200_are_predicted_within_11_percent():
    ours = [c for c in CHECKS if "NVIDIA" not in c.name]
    assert len(ours) >= 10 and max(abs(c.error) for c in ours) < 0.11


def test_layouts_measured_on_the_same_machine_keep_their_measured_order():
    groups = defaultdict(list)  # the same model (and depth), dtype, pinned settings, GPUs and batch -> checks
    for check in CHECKS:
        groups[group_key(check)].append(check)
    # A pair predicted within the search's tie width is a tie the search breaks by the memory estimate, not an order
    # the model claims: every pair that differs only in MBS (the model's only MBS term, the per-microbatch overhead,
    # puts them within 0.13%; measured, MBS 1 is 0.2-3.3% faster without recomputation, and either is up to 2.8%
    # faster with it) and the 70B proxy's TP2 x CP2 against PP2 VP5 x DP2 on 4 GPUs (0.4% predicted). Every other
    # pair is held.
    separated, swapped = 0, set()
    for checks in groups.values():
        measured = sorted(checks, key=lambda c: -c.measured)
        for i, faster in enumerate(measured):
            for slower in measured[i + 1 :]:
                predicted = faster.predicted.total_s / slower.predicted.total_s
                if abs(predicted - 1) < search.TIE:
                    continue
                separated += 1
                if predicted > 1:
                    swapped.add((faster.name, slower.name))
    assert separated >= 120  # 135 on the rows of 2026-12-02
    # Every separated pair is ordered as measured but one of the two-GPU proxies' (docs/autoconf.md's ranking table):
    # 8B's TP2 with and without userbuffer overlap, measured 0.3% apart in single runs, where the model charges the
    # overlap more GEMM slowdown than the communication it hides (0.55% predicted).
    # And two of the four-GPU ones, each measured closer than a run's spread: 8B's TP2 and CP2 x DP2, 0.6% apart in
    # single runs, where the model puts CP2 4% ahead; and 70B's PP2 VP5 with CP2 or with DP2, 0.2% apart in runs of
    # different days, where the model gives CP2's chunked attention 2% more time. And 8B's DP4 with full
    # recomputation against its TP4, measured 2.7% apart: the model predicts that TP4 7% fast, its largest miss among
    # the four-GPU rows, and puts it 5% ahead.
    assert swapped == {
        ("8b 16-layer bf16 tp2 sp overlap (2 GPUs)", "8b 16-layer bf16 tp2 sp (2 GPUs)"),
        ("8b 16-layer bf16 tp2 sp overlap (4 GPUs)", "8b 16-layer bf16 cp2 (4 GPUs)"),
        ("8b 16-layer bf16 dp4 full recompute (4 GPUs)", "8b 16-layer bf16 tp4 sp overlap (4 GPUs)"),
        ("70b 10-layer bf16 pp2 cp2 vp5 (4 GPUs)", "70b 10-layer bf16 pp2 vp5 dp2 (4 H200)"),
    }


def test_the_breakdown_adds_up_to_the_step():
    for check in CHECKS:
        p = check.predicted
        assert p.total_s == pytest.approx(p.compute_s + p.bubble_s + p.comm_s + p.other_s)
        assert p.comm_s == pytest.approx(sum(p.comm_parts.values()))
        assert p.tokens_per_s_per_gpu == pytest.approx(
            check.plan.global_batch_size * check.plan.seq_length / p.total_s / check.plan.num_gpus
        )


def _predict(*overrides: str, constants=CONSTANTS):
    cfg = compose(["cluster=bcm", "memory_check=false", *overrides])
    plan = build_plan(cfg)
    return steptime.predict(cfg, plan, constants), plan


def test_the_bubble_is_pp_minus_one_over_vp_stage_times():
    base = ["training=llama31/70b", "parallelism=tp4_pp8_vp5"]
    for vp in (None, 2, 5):
        t, plan = _predict(*base, f"parallelism.vp={'null' if vp is None else vp}")
        stage = (t.compute_s + t.comm_s - t.comm_parts["dp"]) / plan.num_microbatches
        assert t.bubble_s == pytest.approx((plan.pp - 1) / (vp or 1) * stage)
    no_pp, _ = _predict("training=llama31/8b", "parallelism=tp1_cp2")
    assert no_pp.bubble_s == 0


def test_data_parallel_traffic_costs_more_across_nodes_than_within():
    # The same 8B DP8 layout on one node of 8 and on 8 nodes of 1: only the DP link changes.
    one_node, _ = _predict("training=llama31/8b", "parallelism=tp1", "parallelism.num_gpus=8", "cluster.gpu_type=h200")
    spread, _ = _predict(
        "training=llama31/8b",
        "parallelism=tp1",
        "parallelism.num_gpus=8",
        "cluster.gpu_type=h200",
        "cluster.gpus_per_node=1",
    )
    assert spread.comm_parts["dp"] > one_node.comm_parts["dp"] > 0
    assert spread.compute_s == pytest.approx(one_node.compute_s)


def test_tp_overlap_hides_communication_and_wider_tp_costs_more():
    overlap, _ = _predict("training=llama31/8b", "parallelism=tp2_sp")
    plain, _ = _predict("training=llama31/8b", "parallelism=tp2_sp", "parallelism.tp_comm_overlap=false")
    assert plain.comm_parts["tp"] > overlap.comm_parts["tp"]
    tp4, _ = _predict("training=llama31/70b", "parallelism=tp4_pp8_vp5")
    tp8, _ = _predict("training=llama31/70b", "parallelism=tp4_pp8_vp5", "parallelism.tp=8", "parallelism.num_gpus=128")
    assert tp8.comm_parts["tp"] > tp4.comm_parts["tp"] / 2  # per GPU, more than half of TP4's on half the work


def test_fp8_is_faster_and_full_recomputation_slower():
    bf16, _ = _predict("training=llama31/8b")
    fp8, _ = _predict("training=llama31/8b", "dtype=fp8")
    full, _ = _predict(
        "training=llama31/8b",
        "parallelism.recompute_granularity=full",
        "parallelism.recompute_method=uniform",
        "parallelism.recompute_num_layers=1",
    )
    assert fp8.total_s < bf16.total_s < full.total_s
    assert full.compute_s == pytest.approx(bf16.compute_s * 4 / 3, rel=0.02)  # one more forward of every layer


def test_fp8_attention_speeds_up_the_attention_core_only():
    """With FP8 attention the step is shorter by the attention core's time x (1 - 1 / speedup): the causal half of
    12 x heads x head size x seq FLOPs per token, at attention_efficiency of the bf16 peak (worked out here)."""
    proxy = ["training=llama31/8b", "training.model.num_layers=16", "parallelism=tp1", "parallelism.num_gpus=2"]
    on, plan = _predict(*proxy, "dtype=fp8", "cluster.gpus_per_node=2", "cluster.gpu_type=h200")
    off, _ = _predict(*proxy, "dtype=fp8", "dtype.fp8_dot_product_attention=false", "cluster.gpus_per_node=2",
                      "cluster.gpu_type=h200")  # fmt: skip
    assert plan.fp8_dot_product_attention
    seq, layers, micro = 8192, 16, plan.num_microbatches
    attention_s = layers * micro * 0.5 * 12 * 32 * 128 * seq * seq / (989e12 * CONSTANTS.attention_efficiency)
    saved = attention_s * (1 - 1 / CONSTANTS.fp8_attention_speedup)
    assert off.compute_s - on.compute_s == pytest.approx(saved, rel=1e-3)
    assert off.comm_s == on.comm_s


def test_the_model_prints_against_the_measured_runs():
    out = subprocess.run(
        [sys.executable, "-m", "launcher.autoconf.steptime"], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    for check in CHECKS:
        # The split, measured and predicted step time side by side, then tokens/s/GPU.
        line = next(line for line in out.stdout.splitlines() if line.startswith(check.name + " "))
        split, measured_s, model_s = line[len(check.name) :].split()[:3]
        assert split == check.split
        assert float(measured_s) == pytest.approx(check.measured_step_s, abs=1e-3)
        assert float(model_s) == pytest.approx(check.predicted.total_s, abs=1e-3)
    assert f"{len(CHECKS)} rows; largest error" in out.stdout
    for split in perfdata.SPLITS:
        errors = [abs(c.error) for c in CHECKS if c.split == split]
        assert (
            f"{split}: {len(errors)} rows; mean |error| {sum(errors) / len(errors) * 100:.1f}%, "
            f"largest {max(errors) * 100:.1f}%"
        ) in out.stdout
    # The single-GPU proxies awaiting measurement: listed with their split, the prediction and a dash for the
    # measurement.
    for row in perfdata.pending_rows():
        line = next(line for line in out.stdout.splitlines() if line.startswith(row["name"] + " "))
        assert line[len(row["name"]) :].split()[:2] == [row["split"], "-"]


def test_single_gpu_rows_are_held_to_the_model_and_pending_ones_are_not():
    single = [c for c in CHECKS if c.plan.num_gpus == 1]
    assert len(single) >= 4 and max(abs(c.error) for c in single) < 0.10
    names = {c.name for c in CHECKS}
    pending = perfdata.pending_rows()
    assert len(pending) >= 8 and not any(row["name"] in names for row in pending)
    assert not any(perfdata.is_measured(row) for row in pending)


def test_a_row_given_as_a_step_time_is_that_many_tokens_per_second():
    row = {
        "name": "x",
        "split": "fit",
        "overrides": [
            "training=llama31/8b",
            "training.model.num_layers=16",
            "parallelism=tp1",
            "parallelism.num_gpus=1",
        ],
        "gpu": "h200",
        "gpus_per_node": 1,
        "global_batch_size": 8,
        "step_time_s": 2.0,
    }
    (check,) = steptime.check_rows(rows=[row])
    assert check.measured == pytest.approx(8 * 8192 / 2.0) and check.measured_step_s == pytest.approx(2.0)


def test_the_pending_cases_are_the_ones_bench_autoconf_cases_measures():
    cases = bench_script("autoconf_cases")
    pending = [(r["name"], r["split"], r["overrides"], r["gpu"], r["gpus_per_node"]) for r in perfdata.pending_rows()]
    both = [*cases.cases(), *cases.cases(2), *cases.cases(4)]
    # A measured case has moved into `rows` (with the card it ran on) and keeps its name, split and overrides there;
    # every other one is pending, in the script's order.
    measured = {r["name"]: r for r in perfdata.measured_rows()}
    assert pending == [(c.name, c.split, c.overrides, c.gpu, c.gpus) for c in both if c.name not in measured]
    # A row measured before a default changed may pin what it ran with after the case's own overrides.
    pins = {"dtype.fp8_dot_product_attention=false", "training.model.cross_entropy_fusion=native"}
    for c in both:
        if c.name in measured:
            row = measured[c.name]
            ran = row["overrides"][: len(c.overrides)]
            assert (row["split"], ran, row["gpus_per_node"]) == (c.split, c.overrides, c.gpus), c.name
            assert set(row["overrides"][len(c.overrides) :]) <= pins, c.name
    scripted = [(c.name, c.split, c.overrides) for c in cases.cases()]
    # 8B and 70B proxies x bf16 / fp8 x MBS 1 / 2 x three recomputations, each leaving the search's headroom free.
    assert len(scripted) == 24
    assert all(cases.fits_one_gpu(overrides) for _, _, overrides in scripted)
    # MBS 2 is held out of the fit, MBS 1 fits.
    assert all((split == "held_out") == ("training.micro_batch_size=2" in o) for _, split, o in scripted)
    # One layer of the 405B shape: bf16 is estimated over the GPU, and fp8, estimated under it but inside the
    # headroom, ran out of memory on an H200.
    assert not any(cases.fits_one_gpu(cases._case("405b", 1, dtype, 1, "none").overrides) for dtype in ("bf16", "fp8"))
    default = cases.pick(cases.cases(), "default", None)
    assert len(default) >= 8 and sum(c.estimate_s for c in default) <= 560
    shards = [cases.pick(cases.cases(), "all", f"{i}/4") for i in range(1, 5)]
    assert sorted(c.key for s in shards for c in s) == sorted(c.key for c in cases.cases())


def test_a_row_the_script_prints_is_one_measured_yaml_takes():
    cases = bench_script("autoconf_cases")
    case = cases.cases()[0]
    result = {"tokens_per_s_per_gpu": 20000.4, "step_time_s": 3.2768, "peak_memory_gib": 90.04}
    row = cases.measured_row(case, result)
    printed = yaml.safe_load(cases.to_yaml([row]))[0]
    assert printed == {
        **cases.pending_entry(case),
        "tokens_per_s_per_gpu": 20000,
        "step_time_s": 3.277,
        "peak_memory_gib": 90.0,
    }
    (check,) = steptime.check_rows(rows=[printed])
    assert check.measured == 20000 and perfdata.is_measured(printed)


# --------------------------------------------------------------------------- the fit
def test_least_squares_recovers_the_coefficients_of_a_plain_model():
    # Step time = FLOPs / rate + bytes / bandwidth + a fixed cost, over rows of different shapes; the solver works on
    # the coefficients' logs, as fit_constants does.
    rate, bandwidth, fixed = 4.0e14, 2.5e12, 0.08
    rows = [(flops * 1e14, size * 1e11) for flops, size in [(1, 1), (8, 1), (2, 6), (30, 2), (4, 40), (0.5, 0.2)]]
    measured = [f / rate + b / bandwidth + fixed for f, b in rows]

    def residuals(x):
        r, bw, c = (math.exp(v) for v in x)
        return [math.log((f / r + b / bw + c) / t) for (f, b), t in zip(rows, measured)]

    found = [math.exp(v) for v in stepfit.least_squares(residuals, [math.log(1e14), math.log(1e12), math.log(1.0)])]
    assert found == pytest.approx([rate, bandwidth, fixed], rel=1e-6)


def test_the_fit_recovers_the_constants_that_made_synthetic_rows():
    # Rows whose "measured" throughput is the model's own with known constants (auto.yaml's, each free one moved by
    # its own factor), on the fit rows' plans: started from auto.yaml's, the fit must land on the known ones.
    factors = dict(zip(stepfit.FREE, (0.9, 1.1, 0.8, 1.5, 0.6, 1.3)))
    known = changed(CONSTANTS, {path: stepfit.constant(CONSTANTS, path) * f for path, f in factors.items()})
    synthetic = [
        dataclasses.replace(c, measured=c.again(known).predicted.tokens_per_s_per_gpu)
        for c in CHECKS
        if c.split == "fit"
    ]
    fitted = stepfit.fit_constants(synthetic, CONSTANTS)
    for path, factor in factors.items():
        assert stepfit.constant(fitted, path) == pytest.approx(stepfit.constant(CONSTANTS, path) * factor, rel=1e-4)
    # The constants the fit does not move stay as they were.
    assert fitted.gpus == CONSTANTS.gpus and fitted.memory_efficiency == CONSTANTS.memory_efficiency


def test_fitted_constants_go_into_auto_yaml_with_its_comments_kept():
    auto = REPO / "conf" / "parallelism" / "auto.yaml"
    text = auto.read_text()
    values = {"gemm_efficiency.fp8": 0.512, "attention_efficiency": 0.437, "tp_ring_step_s": 3.5e-05}
    written = stepfit.yaml_with_constants(text, values)
    before, after = yaml.safe_load(text), yaml.safe_load(written)
    assert after["auto"]["step_time"]["gemm_efficiency"] == {
        "bf16": before["auto"]["step_time"]["gemm_efficiency"]["bf16"],
        "fp8": 0.512,
    }
    assert after["auto"]["step_time"]["attention_efficiency"] == 0.437
    assert after["auto"]["step_time"]["tp_ring_step_s"] == 3.5e-05
    for key in ("gemm_efficiency", "attention_efficiency", "tp_ring_step_s"):
        del before["auto"]["step_time"][key], after["auto"]["step_time"][key]
    assert after == before
    # Only the three values' lines changed; every comment is where it was.
    changed_lines = [(a, b) for a, b in zip(text.splitlines(), written.splitlines()) if a != b]
    assert len(text.splitlines()) == len(written.splitlines()) and len(changed_lines) == 3
    assert all(not a.lstrip().startswith("#") for a, _ in changed_lines)


def test_the_bench_prints_each_split_and_writes_only_constants_no_worse_on_held_out_rows():
    out = subprocess.run(
        [sys.executable, str(REPO / "bench" / "fit_steptime.py")], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    today, fitted = out.stdout.split("\nfitted constants\n")
    # Today's table is the model with auto.yaml's constants: each row's split and error, each split's summary.
    for check in CHECKS:
        line = next(line for line in today.splitlines() if line.startswith(check.name + " "))
        assert line[len(check.name) :].split()[0] == check.split
        assert f"{check.error * 100:+.1f}%" in line
    held_out = [abs(c.error) for c in CHECKS if c.split == "held_out"]
    assert f"held_out: {len(held_out)} rows; mean |error| {sum(held_out) / len(held_out) * 100:.1f}%" in today
    for path in stepfit.FREE:
        assert path in fitted
    assert "the fitted constants are" in fitted and "on the held-out rows" in fitted
    # Each held-out row on a line of its own, with its error with today's constants (and then the fitted ones').
    section = fitted[fitted.index("the held-out rows") : fitted.index("\nconstant ")]
    for check in CHECKS:
        if check.split == "held_out":
            line = next(line for line in section.splitlines() if line.startswith(check.name + " "))
            assert line[len(check.name) :].split()[2] == f"{check.error * 100:+.1f}%"
