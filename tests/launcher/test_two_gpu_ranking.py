"""The auto-configurator's two-GPU cases (bench/autoconf_cases.py --gpus 2), checked without a GPU: each is a layout
parallelism=auto keeps and ranks on 2 H100, the ranking table of measured rows (launcher/report/ranking.py:
rank_rows) calls a swapped top 3 a mismatch, and new rows join the step-time fit with their held-out error printed
per row (bench/fit_steptime.py --rows)."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections import defaultdict

import pytest
import yaml

from launcher.autoconf import perfdata, search, steptime
from launcher.config.compose import compose
from launcher.report import ranking

from launcher_helpers import REPO, bench_script


cases = bench_script("autoconf_cases")
fit = bench_script("fit_steptime")
TWO = cases.cases(2)


def _checks(selected) -> list[steptime.Check]:
    """The cases as measured.yaml rows (their pending entries), planned and predicted; nothing measured yet."""
    rows = [{**cases.pending_entry(c), "step_time_s": 1.0} for c in selected]
    return steptime.check_rows(rows=rows)


def test_both_proxies_have_six_layouts_or_more_in_bf16_and_fp8_in_three():
    layouts = defaultdict(set)
    for c in TWO:
        layouts[c.model, "bf16" if "dtype=bf16" in c.overrides else "fp8"].add(c.key.split("-", 2)[2])
    assert len(layouts["8b", "bf16"]) >= 6 and len(layouts["70b", "bf16"]) >= 6
    assert layouts["8b", "fp8"] == layouts["70b", "fp8"] == set(cases.TWO_GPU_FP8)
    # Asymmetric PP2 VP2 only where the layers split (70B's 2 layers need it, 8B's 16 cannot have it), MBS 2 of DP2
    # only where it fits 80 GB.
    assert {"pp2-vp2", "dp2-full", "tp2", "tp2-overlap"} <= layouts["8b", "bf16"] - {"pp2-vp2-asym", "dp2-mbs2"}
    assert {"pp2-vp2-asym", "dp2-mbs2"} <= layouts["70b", "bf16"] and "pp2-vp2" not in layouts["70b", "bf16"]
    assert all(c.gpus == 2 and c.gpu == "h100" for c in TWO)
    assert len({c.name for c in TWO}) == len({c.key for c in TWO}) == len(TWO)


def test_the_held_out_cases_are_the_documented_ones():
    held_out = {c.key for c in TWO if c.split == "held_out"}
    assert held_out == {"8b-bf16-pp2-vp2", "70b-bf16-pp2-vp2-asym", "70b-bf16-dp2-mbs2", "8b-fp8-cp2", "70b-fp8-cp2"}
    # Each proxy keeps every other layout in the fit, so what is held out is extrapolated from fit rows of the shape.
    for model in ("8b", "70b"):
        assert {c.key.split("-", 2)[2] for c in TWO if c.model == model and c.split == "fit"} >= {
            "dp2",
            "tp2",
            "tp2-overlap",
            "cp2",
            "pp2",
            "dp2-full",
        }


def test_each_case_is_the_layout_parallelism_auto_keeps_and_plans_alike():
    """The case's plan and settings are the search candidate's of the same layout on 2 H100 (TP2 without overlap
    differs in that key only): the ranking table ranks what parallelism=auto would run."""
    by_proxy = defaultdict(list)
    for case, check in zip(TWO, _checks(TWO)):
        by_proxy[tuple(o for o in case.overrides if o.startswith(("training", "dtype")))].append((case, check))
    for proxy, members in by_proxy.items():
        cfg = compose([*proxy, "parallelism=auto", "parallelism.num_gpus=2", *cases._cluster(2, "h100")])
        found = {r.layout: r for r in search.search(cfg).ranked}
        for case, check in members:
            layout = ranking.layout_of(check)
            assert layout in found, f"{case.key}: {layout} is not among the search's layouts"
            ours, theirs = check.plan.to_json_dict(), found[layout].plan.to_json_dict()
            differ = {k for k in ours if k not in ("command", "env") and ours[k] != theirs[k]}
            expected = {"tp_comm_overlap"} if case.key.endswith("-tp2") else set()
            assert differ == expected, case.key
            # The run's settings too, beyond what the plan records (70B's pipelines defer the embedding's wgrad).
            ours, theirs = dataclasses.asdict(check.cfg.parallelism), dataclasses.asdict(found[layout].cfg.parallelism)
            differ = {k for k in ours if k not in ("name", "auto") and ours[k] != theirs[k]}
            assert differ == expected, case.key
            assert check.cfg.training == found[layout].cfg.training, case.key


def test_a_shard_of_the_two_gpu_cases_fits_a_nine_minute_command():
    # --budget-s 420 --timeout-s 150 (the documented command): the last case starts by 420 s minus its estimate
    # and is killed by 150 s after, so a command ends within 9 minutes even when a case hangs.
    shards = [cases.pick(TWO, "default", f"{i}/4") for i in (1, 2, 3, 4)]
    assert sorted(c.key for s in shards for c in s) == sorted(c.key for c in TWO)
    assert all(sum(c.estimate_s for c in s) <= 420 for s in shards)
    assert 420 - min(c.estimate_s for c in TWO) + 150 <= 540
    with pytest.raises(SystemExit, match="--shard 5/4: give I/N"):
        cases.pick(TWO, "default", "5/4")


def test_named_cases_run_in_the_order_given_once_each():
    # A command that the device's time may cut short runs the cases its user put first.
    last, first = TWO[-1].key, TWO[0].key
    assert [c.key for c in cases.pick(TWO, f"{last},{first},{last}", None)] == [last, first]


def test_cases_an_earlier_command_measured_are_not_run_again(tmp_path, monkeypatch, capsys):
    shard = cases.pick(TWO, "default", "2/4")
    earlier = [{**cases.pending_entry(c), "gpu": "h200", "step_time_s": 1.5} for c in shard]
    previous = tmp_path / "before" / "measured_rows.json"
    previous.parent.mkdir()
    previous.write_text(json.dumps(earlier))
    ran = []
    monkeypatch.setitem(sys.modules, "bench_train", type(sys)("bench_train"))
    sys.modules["bench_train"].run_case = lambda name, *args, **kwargs: ran.append(name) or {"error": "no GPU"}
    out = tmp_path / "after"
    argv = ["--gpus", "2", "--shard", "2/4", "--out", str(out), "--previous", str(previous)]
    assert cases.main(argv) == 0 and ran == []
    assert yaml.safe_load((out / "measured_rows.yaml").read_text()) == earlier
    assert json.loads((out / "measured_rows.json").read_text()) == earlier
    # One row missing: only its case runs.
    previous.write_text(json.dumps(earlier[1:]))
    assert cases.main(argv) == 1 and ran == [shard[0].key]
    assert "# failed: " + shard[0].key in capsys.readouterr().out


# --------------------------------------------------------------------------- the ranking table
def _measured_in(checks, order, times):
    """The checks with measured step times: times[i] for order[i] (the "measurement" of each row)."""
    step = dict(zip((c.name for c in order), times))
    return [
        dataclasses.replace(c, measured=c.plan.global_batch_size * c.plan.seq_length / step[c.name] / c.plan.num_gpus)
        for c in checks
    ]


@pytest.fixture(scope="module")
def eight_b_bf16():
    return _checks([c for c in TWO if c.model == "8b" and "dtype=bf16" in c.overrides])


def test_rows_measured_as_the_model_predicts_match_and_a_swapped_top_three_does_not(eight_b_bf16):
    (group,) = ranking.rank_rows(eight_b_bf16)
    order = group.predicted  # parallelism=auto's order of the layouts
    assert len(order) >= 6 and [group.predicted_rank[c.name] for c in order] == list(range(len(order)))
    times = sorted(c.predicted.total_s for c in eight_b_bf16)  # the model's own times, fastest to the pick

    (agree,) = ranking.rank_rows(_measured_in(eight_b_bf16, order, times))
    assert agree.top_matches and [c.name for c in agree.measured] == [c.name for c in order]
    assert "predicted top 3 matches the measured top 3 in order" in ranking.format_row_ranking([agree])

    # The 2nd and 3rd swap places in the measurement: the same three, another order, reported as a mismatch.
    swapped = [times[0], times[2], times[1], *times[3:]]
    (disagree,) = ranking.rank_rows(_measured_in(eight_b_bf16, order, swapped))
    assert not disagree.top_matches
    text = ranking.format_row_ranking([disagree])
    assert "predicted top 3 does NOT match the measured top 3 in order" in text
    assert f"    measured:  {order[0].name}, {order[2].name}, {order[1].name}" in text
    assert "0 of 1 groups: predicted top 3 = measured top 3, in order" in text

    # A swap below the top 3 leaves the verdict alone (the pairs count it).
    low = [*times[:3], times[4], times[3], *times[5:]]
    (below,) = ranking.rank_rows(_measured_in(eight_b_bf16, order, low))
    assert below.top_matches
    pairs = len(order) * (len(order) - 1) // 2
    assert f"{pairs - 1} of {pairs} pairs alike" in ranking.format_row_ranking([below])


def test_a_row_that_pins_another_setting_ranks_in_its_own_group(eight_b_bf16):
    # The same DP2 layout with Transformer Engine's SwiGLU pinned, as a row measured before a default changed: not a
    # layout the search chooses among, so it is not ranked against the others.
    dp2 = next(c for c in TWO if c.key == "8b-bf16-dp2")
    row = {**cases.pending_entry(dp2), "name": "8b dp2 te swiglu", "step_time_s": 0.5}
    row["overrides"] = [*row["overrides"], "dtype.te_activation_func=true"]
    (pinned,) = steptime.check_rows(rows=[row])
    groups = ranking.rank_rows([*eight_b_bf16, pinned])
    assert sorted(len(g.measured) for g in groups) == [1, len(eight_b_bf16)]
    (alone,) = [g for g in groups if len(g.measured) == 1]
    assert alone.measured == [pinned]
    assert alone.label == "llama31_8b 16-layer bf16 dtype.te_activation_func=true on 2 h100 GPUs, GBS 8"


def test_the_table_reads_the_benchs_rows_and_groups_them_by_proxy(tmp_path, capsys, eight_b_bf16):
    (group,) = ranking.rank_rows(eight_b_bf16)
    order = group.predicted
    by_name = {c.name: c for c in TWO}
    # The bench's rows for the 8B proxy, measured in the model's order but with the first two swapped, and the
    # 70B proxy's DP2 and CP2 in the model's order, in two files as two commands would write them.
    times = dict(zip((c.name for c in order), [1.1, 1.0, *(2.0 + i / 10 for i in range(len(order) - 2))]))
    rows = [{**cases.pending_entry(by_name[name]), "step_time_s": t} for name, t in times.items()]
    seventy = [by_name["70b 2-layer bf16 dp2 (2 GPUs)"], by_name["70b 2-layer bf16 tp2 sp overlap (2 GPUs)"]]
    rows70 = [{**cases.pending_entry(c), "step_time_s": 1.0 + i / 10} for i, c in enumerate(seventy)]
    first, second = tmp_path / "a" / "measured_rows.yaml", tmp_path / "b" / "measured_rows.json"
    first.parent.mkdir(), second.parent.mkdir()
    first.write_text(cases.to_yaml(rows[:4]))
    second.write_text(yaml.safe_dump(rows[4:] + rows70))
    assert cases.main(["--rank", str(first), str(second)]) == 0
    out = capsys.readouterr().out
    assert "llama31_8b 16-layer bf16 on 2 h100 GPUs, GBS 8" in out and "llama31_70b 2-layer bf16 on 2 h100" in out
    assert "predicted top 3 does NOT match" in out and "predicted top 2 matches the measured top 2" in out
    assert "1 of 2 groups: predicted top 3 = measured top 3, in order" in out
    eight = out[out.index("llama31_8b") : out.index("llama31_70b")]
    table = eight.splitlines()[2:4]  # measured fastest first
    assert order[1].name in table[0] and order[0].name in table[1]

    with pytest.raises(SystemExit, match="not a file of measured rows"):
        cases.main(["--rank", str(tmp_path / "missing.yaml")])


def test_measured_yaml_ranks_its_two_gpu_rows_and_pending_entries_are_left_out(capsys):
    assert cases.main(["--rank", "--gpus", "2"]) == 0
    out = capsys.readouterr().out
    assert "llama31_8b 32-layer bf16 on 2 h200 GPUs, GBS 32" in out
    # Every measured case that has a layout to be ranked against is in the table: each proxy's bf16 rows; fp8 has
    # DP2 alone of each proxy so far, a group of one, which the table leaves out. No pending entry is in it.
    measured = {r["name"] for r in perfdata.measured_rows()}
    ranked = {c.name for c in TWO if c.name in measured and "dtype=bf16" in c.overrides}
    assert len(ranked) == 15
    assert all((c.name in out) == (c.name in ranked) for c in TWO)


# --------------------------------------------------------------------------- the fit
def test_new_rows_join_the_fit_replacing_measured_yaml_rows_of_their_name(tmp_path):
    first = perfdata.measured_rows()[0]
    unmeasured = [c for c in TWO if c.name not in {r["name"] for r in perfdata.measured_rows()}]
    new = {**cases.pending_entry(unmeasured[0]), "gpu": "h200", "step_time_s": 1.7}
    path = tmp_path / "measured_rows.yaml"
    path.write_text(cases.to_yaml([{**first, "tokens_per_s_per_gpu": 1}, new, cases.pending_entry(unmeasured[1])]))
    rows = fit.all_rows([str(path)])
    names = [r["name"] for r in rows]
    assert len(names) == len(set(names)) == len(perfdata.measured_rows()) + 1  # the pending entry is left out
    assert rows[-2]["tokens_per_s_per_gpu"] == 1 and rows[-1] == new
    with pytest.raises(SystemExit, match="not a file of measured rows"):
        fit.all_rows([str(REPO / "pyproject.toml")])


def test_every_held_out_row_is_printed_with_its_error_before_and_after_the_fit():
    checks = steptime.check_rows()
    later = [c.again(steptime.default_constants()) for c in checks]  # constants as a fit that changed nothing
    text = fit.format_held_out(checks, later)
    held_out = [c for c in checks if c.split == "held_out"]
    lines = text.splitlines()[1:]
    assert len(lines) == len(held_out) >= 5
    for c, line in zip(held_out, lines):
        assert line.startswith(c.name) and line.count(f"{c.error * 100:+.1f}%") == 2
