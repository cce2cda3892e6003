"""The four-GPU measurements, checked without a GPU: bench/four_gpu.py's groups and bench/autoconf_cases.py
--gpus 4. Every main.py command they would run (the exact command bench_train.run_case builds) passes the plan on 4
H200, so a bad override fails here, not after a device's start-up; each command stays within a 10-minute device
call by the estimates; each variant differs from its group's defaults in what it measures; the table's and the
ranking's layouts are the ones parallelism=auto keeps and plans alike; a command cut short goes on with --previous."""

from __future__ import annotations

from collections import defaultdict
import dataclasses
import json
import sys

import pytest
import yaml

from launcher.autoconf import search, steptime
from launcher.config.compose import compose
from launcher.plan.hardware import LocalGpus, gpu_spec
from launcher.plan.validate import validate
from launcher.report import ranking

from launcher_helpers import bench_script

four = bench_script("four_gpu")
cases = bench_script("autoconf_cases")
FOUR = cases.cases(4)
FOUR_H200 = LocalGpus(4, "h200", ("NVIDIA H200",) * 4)


class _NoGpu:
    """subprocess.Popen for bench_train.run_case: records the command, exits 1 with no output (no run directory,
    so the case is an error row and nothing else happens)."""

    commands: list[list[str]] = []

    def __init__(self, cmd, **kwargs):
        _NoGpu.commands.append(cmd)
        self.pid, self.returncode = 0, 1

    def communicate(self, timeout=None):
        return "", None


@pytest.fixture
def no_gpu(monkeypatch):
    _NoGpu.commands = []
    monkeypatch.setattr(four.bench_train.subprocess, "Popen", _NoGpu)
    return _NoGpu.commands


def _planned_on_four_h200(command: list[str]):
    """The plan main.py makes of a recorded command (every check) on 4 H200 visible to cluster=local."""
    assert command[1].endswith("main.py")
    return validate(compose(command[2:]), FOUR_H200).plan


# --------------------------------------------------------------------------- bench/four_gpu.py
@pytest.mark.parametrize("which", list(four.GROUPS))
def test_every_command_of_a_group_plans_on_four_h200(which, no_gpu, tmp_path, capsys):
    group = four.GROUPS[which]
    assert four.main([which, "--out", str(tmp_path), "--repeat", "1"]) == 0
    assert len(no_gpu) == len(group.cases)
    for command, name in zip(no_gpu, group.cases):
        assert f"run_name={name}" in command and f"results_dir={tmp_path / which}" in command
        plan = _planned_on_four_h200(command)
        assert plan.num_gpus == 4 and plan.seq_length == 8192 and plan.micro_batch_size == 1
        assert plan.global_batch_size == group.gbs and plan.est_memory_gib_per_gpu <= gpu_spec("h200").memory_gib
    # Every run failed here (no GPU): the rows say so and the --json file has them.
    rows = json.loads((tmp_path / f"{which}.json").read_text())
    assert [r["case"] for r in rows] == list(group.cases) and all("error" in r for r in rows)


@pytest.mark.parametrize("which", list(four.GROUPS))
def test_each_group_fits_a_ten_minute_device_call(which):
    group = four.GROUPS[which]
    planned = four.plan_cases(which)
    total = four.estimate_s(which)
    assert total <= 540, f"{which}: {total:.0f} s estimated"
    # The last run starts by the budget less a run, a hung one is killed by the timeout: under 10 minutes.
    assert group.budget_s - min(p.run_s for p in planned) + group.timeout_s <= 590
    assert group.timeout_s >= 1.4 * max(p.run_s for p in planned)
    assert group.h200_only == (not all(p.fits_h100 for p in planned))
    assert group.window < group.steps


def test_the_list_prints_every_case_with_its_estimate(capsys):
    assert four.main(["table-405b", "--list"]) == 0
    out = capsys.readouterr().out
    assert "405b4-bf16-tp4" in out and "405b4-fp8-tp4" in out and " no " in out and "min in all" in out


def test_the_callers_arguments_win_and_the_defaults_come_first():
    argv = four.bench_argv("ub-fp8", ["--repeat", "3", "--budget-s", "300", "--previous", "a.json"], "OUT")
    names = [argv[i + 1] for i, a in enumerate(argv) if a == "--case"]
    assert names == list(four.GROUPS["ub-fp8"].cases) and names[0] == "70b10-fp8-tp4"
    assert argv[-6:] == ["--repeat", "3", "--budget-s", "300", "--previous", "a.json"]
    assert argv[argv.index("--results") + 1] == "OUT/ub-fp8" and argv[argv.index("--json") + 1] == "OUT/ub-fp8.json"


def _plan(which: str, name: str):
    group = four.GROUPS[which]
    return validate(four.case_config(group, group.cases[name]), None).plan


def _cfg(which: str, name: str):
    group = four.GROUPS[which]
    return four.case_config(group, group.cases[name])


def test_each_variant_differs_from_its_defaults_in_what_it_measures():
    # FP8 param gather: off by default at 4 optimizer shards (DP4) where bf16 weights fit, on in the variant.
    assert not _plan("param-gather", "8b16-fp8-dp4").fp8_param_gather
    assert _plan("param-gather", "8b16-fp8-dp4-param-gather-on").fp8_param_gather
    # Userbuffers at TP4 in FP8: the h8192_tp4 preset (the search's for 70B TP4), Transformer Engine's defaults,
    # and the preset with bf16 reduce-scatter buffers.
    preset, te, bf16_buf = (
        _cfg("ub-fp8", n) for n in ("70b10-fp8-tp4", "70b10-fp8-tp4-te-ub", "70b10-fp8-tp4-bf16-buf")
    )
    assert preset.parallelism.tp_comm_overlap_cfg is not None and te.parallelism.tp_comm_overlap_cfg is None
    assert preset.dtype.userbuffers_fp8_buf and not bf16_buf.dtype.userbuffers_fp8_buf
    assert all(c.parallelism.tp_comm_overlap and c.parallelism.tp == 4 for c in (preset, te, bf16_buf))
    # CUDA graphs with TP overlap: none by default, then per layer and full iteration, overlap on in each.
    graphs = [_plan("graphs-overlap", n) for n in four.GROUPS["graphs-overlap"].cases]
    assert [p.cuda_graphs for p in graphs] == ["none", "per_layer", "full_iteration"]
    assert all(_cfg("graphs-overlap", n).parallelism.tp_comm_overlap for n in four.GROUPS["graphs-overlap"].cases)
    # The rank order: megatron-core's default pp_last, then data-parallel last, on PP2 x DP2 where it matters.
    default, dp_last = (_plan("rank-order", n) for n in four.GROUPS["rank-order"].cases)
    assert (default.rank_order, dp_last.rank_order) == ("tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp")
    assert default.pp == dp_last.pp == 2 and default.dp == dp_last.dp == 2
    # Besides the key measured, each variant's plan is its defaults'.
    for which, differs in (
        ("param-gather", {"fp8_param_gather"}),
        ("ub-fp8", set()),
        ("graphs-overlap", {"cuda_graphs"}),
        ("rank-order", {"rank_order"}),
    ):
        first, *others = (_plan(which, n).to_json_dict() for n in four.GROUPS[which].cases)
        for other in others:
            changed = {k for k in first if k not in ("command", "env", "run_name") and first[k] != other[k]}
            assert changed <= differs | {"est_memory_gib_per_gpu"}, (which, changed)


def _search_candidate(model: str, layers: int, dtype: str, gbs: int, gpu: str):
    cfg = compose(
        [
            f"training=llama31/{model}",
            f"training.model.num_layers={layers}",
            f"dtype={dtype}",
            "parallelism=auto",
            "parallelism.num_gpus=4",
            "cluster=bcm",
            f"cluster.gpu_type={gpu}",
            "cluster.gpus_per_node=4",
            f"training.global_batch_size={gbs}",
        ]
    )
    return cfg, search.search(cfg)


@pytest.mark.parametrize(
    "which,name,model,layers",
    [
        ("table-70b", "70b10-bf16-tp4", "70b", 10),
        ("table-70b", "70b10-fp8-tp4", "70b", 10),
        ("table-405b", "405b4-bf16-tp4", "405b", 4),
        ("table-405b", "405b4-fp8-tp4", "405b", 4),
    ],
)
def test_the_tables_tp4_rows_are_the_searchs_tp4_candidates(which, name, model, layers):
    """TP4 + SP + overlap with the userbuffer preset parallelism=auto gives TP4 at the model's hidden size, planned
    as the search's TP4 candidate on 4 H200: the row measures what the auto-configurator would run."""
    cfg, found = _search_candidate(model, layers, _cfg(which, name).dtype.name, 32, "h200")
    (tp4,) = [
        r
        for r in found.ranked
        if (r.layout.tp, r.layout.pp, r.layout.cp, r.layout.micro_batch_size, r.layout.recompute) == (4, 1, 1, 1, None)
    ]
    preset = search.userbuffer_preset(cfg.parallelism.auto, cfg.training.model.hidden_size, tp4.layout)
    assert f"+userbuffers@parallelism.tp_comm_overlap_cfg={preset}" in four.GROUPS[which].cases[name]
    ours, theirs = _plan(which, name).to_json_dict(), tp4.plan.to_json_dict()
    assert {k for k in ours if k not in ("command", "env", "run_name") and ours[k] != theirs[k]} == set()


def test_the_8b_rows_are_the_searchs_first_on_four_h200_and_the_models_default_layout():
    for dtype, name in (("bf16", "8b-bf16-dp4"), ("fp8", "8b-fp8-dp4")):
        _, found = _search_candidate("8b", 32, dtype, 32, "h200")
        first = found.ranked[0].layout
        assert (first.tp, first.pp, first.cp, first.micro_batch_size, first.recompute) == (1, 1, 1, 1, None)
        assert _plan("table-8b", name).dp == 4
    assert compose(["training=llama31/8b"]).training.default_layout.bf16 == "tp1_cp2"
    assert "parallelism=tp1_cp2" in four.GROUPS["table-8b"].cases["8b-bf16-cp2"]


def test_a_cut_group_goes_on_with_previous_without_rerunning_finished_runs(no_gpu, tmp_path, monkeypatch):
    group = four.GROUPS["param-gather"]
    first = [four.bench_train.run_name(n, group.repeat, 0) for n in group.cases]
    earlier = tmp_path / "old" / "param-gather.json"
    earlier.parent.mkdir()
    row = {"model": "llama31_8b", "layout": "TP1 PP1 CP1 DP4 MBS1", "dtype": "fp8", "gpus": 4, "gbs": 16}
    row |= {"step_time_s": 1.0, "tokens_per_s_per_gpu": 8192.0, "mfu_bf16": 0.5, "mfu_fp8": 0.25}
    row |= {"vs_nvidia": None, "nvidia": None, "peak_memory_gib": 50.0}
    rows = [{"case": name, **row} for name in first]
    earlier.write_text(json.dumps({"runs": rows}))
    four.main(["param-gather", "--out", str(tmp_path / "new"), "--previous", str(earlier)])
    ran = [next(c.split("=", 1)[1] for c in command if c.startswith("run_name=")) for command in no_gpu]
    assert len(ran) == len(group.cases) * (group.repeat - 1) and not set(ran) & set(first)


# --------------------------------------------------------------------------- autoconf_cases.py --gpus 4
def _checks(selected) -> list[steptime.Check]:
    rows = [{**cases.pending_entry(c), "step_time_s": 1.0} for c in selected]
    return steptime.check_rows(rows=rows)


def test_both_proxies_have_six_layouts_or_more_in_bf16_and_fp8_in_the_searchs_first_three():
    layouts = defaultdict(list)
    for c in FOUR:
        layouts[c.model, "bf16" if "dtype=bf16" in c.overrides else "fp8"].append(c.key.split("-", 2)[2])
    assert layouts["8b", "bf16"] == list(cases.FOUR_GPU_BF16["8b"]) and len(layouts["8b", "bf16"]) >= 6
    assert layouts["70b", "bf16"] == list(cases.FOUR_GPU_BF16["70b"]) and len(layouts["70b", "bf16"]) >= 6
    assert layouts["8b", "fp8"] == list(cases.FOUR_GPU_FP8["8b"])
    assert layouts["70b", "fp8"] == list(cases.FOUR_GPU_FP8["70b"])
    assert all(c.gpus == 4 and c.gpu == "h100" for c in FOUR)
    assert len({c.name for c in FOUR}) == len({c.key for c in FOUR}) == len(FOUR)
    held_out = {c.key for c in FOUR if c.split == "held_out"}
    assert held_out == {"8b-bf16-tp2-cp2", "70b-bf16-tp2-cp2", "70b-bf16-tp2-pp2-vp5", "8b-fp8-cp2", "70b-fp8-tp2-cp2"}


@pytest.mark.parametrize("model,layers", cases.FOUR_GPU_PROXIES)
def test_the_searchs_pick_is_measured_and_fp8_has_its_first_two(model, layers):
    """In each dtype the search's first layout on 4 H100 is among the cases; in fp8 its first two at MBS 1 are (the
    70B's third fp8 case is TP4, the four-GPU table's layout, where the search's third is CP4)."""
    ours = defaultdict(set)
    for case, check in zip(FOUR, _checks(FOUR)):
        if case.model == model:
            ours["bf16" if "dtype=bf16" in case.overrides else "fp8"].add(ranking.layout_of(check))
    for dtype in ("bf16", "fp8"):
        _, found = _search_candidate(model, layers, dtype, cases.GBS, "h100")
        mbs1 = [r.layout for r in found.ranked if r.layout.micro_batch_size == 1]
        assert mbs1[0] in ours[dtype], (dtype, mbs1[0])
        if dtype == "fp8":
            assert set(mbs1[:2]) <= ours[dtype], mbs1[:3]


def test_each_four_gpu_case_is_the_layout_parallelism_auto_keeps_and_plans_alike():
    """The case's plan and settings are the search candidate's of the same layout on 4 H100 (besides the layout's
    name; the userbuffer preset is one the search writes, not one planning reads): the ranking ranks what
    parallelism=auto would run."""
    by_proxy = defaultdict(list)
    for case, check in zip(FOUR, _checks(FOUR)):
        by_proxy[tuple(o for o in case.overrides if o.startswith(("training", "dtype")))].append((case, check))
    for proxy, members in by_proxy.items():
        cfg = compose([*proxy, "parallelism=auto", "parallelism.num_gpus=4", *cases._cluster(4, "h100")])
        found = {r.layout: r for r in search.search(cfg).ranked}
        for case, check in members:
            layout = ranking.layout_of(check)
            assert layout in found, f"{case.key}: {layout} is not among the search's layouts"
            ours, theirs = check.plan.to_json_dict(), found[layout].plan.to_json_dict()
            assert {k for k in ours if k not in ("command", "env") and ours[k] != theirs[k]} == set(), case.key
            ours, theirs = dataclasses.asdict(check.cfg.parallelism), dataclasses.asdict(found[layout].cfg.parallelism)
            differ = {k for k in ours if k not in ("name", "auto", "tp_comm_overlap_cfg") and ours[k] != theirs[k]}
            assert differ == set(), case.key
            assert check.cfg.training == found[layout].cfg.training, case.key
            # The preset the search would write for the layout (search.layout_overrides), and no other.
            written = [o for o in search.layout_overrides(found[layout], cfg) if o.startswith("+userbuffers@")]
            assert [o for o in case.overrides if o.startswith("+userbuffers@")] == written, case.key


def test_a_four_gpu_case_plans_as_bench_train_runs_it(no_gpu, tmp_path, monkeypatch):
    """Every four-GPU case through autoconf_cases.main as the documented shard commands run it: the recorded main.py
    commands plan on 4 H200 (the H100 check is the test above's)."""
    monkeypatch.setitem(sys.modules, "bench_train", four.bench_train)
    for shard in ("1/5", "2/5", "3/5", "4/5", "5/5"):
        out = tmp_path / shard.replace("/", "of")
        assert cases.main(["--gpus", "4", "--shard", shard, "--out", str(out), "--budget-s", "1e9"]) == 1
    assert len(no_gpu) == len(FOUR)
    for command in no_gpu:
        plan = _planned_on_four_h200(command)
        assert plan.num_gpus == 4 and plan.global_batch_size == cases.GBS


def test_a_shard_of_the_four_gpu_cases_fits_a_ten_minute_command():
    # --budget-s 450 --timeout-s 180 (the documented command): the last case starts by 450 s minus its estimate
    # and is killed 180 s after, so a command ends within 10 minutes even when a case hangs.
    shards = [cases.pick(FOUR, "default", f"{i}/5") for i in (1, 2, 3, 4, 5)]
    assert sorted(c.key for s in shards for c in s) == sorted(c.key for c in FOUR)
    assert all(sum(c.estimate_s for c in s) <= 450 for s in shards)
    assert 450 - min(c.estimate_s for c in FOUR) + 180 <= 570
    assert "--gpus 4 --shard 1/5 --budget-s 450 --timeout-s 180" in cases.__doc__


def test_the_pending_entries_print_for_four_gpus(capsys):
    assert cases.main(["--gpus", "4", "--pending"]) == 0
    entries = yaml.safe_load(capsys.readouterr().out)
    assert [e["name"] for e in entries] == [c.name for c in FOUR]
    assert all(e["gpus_per_node"] == 4 and e["gpu"] == "h100" and e["step_time_s"] is None for e in entries)
