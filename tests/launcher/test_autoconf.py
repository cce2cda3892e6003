"""parallelism=auto: the enumeration keeps exactly the layouts the plan accepts and the memory estimate fits, the
ranking is stable and its table explains it, the pick is written as a command line that gives the same run
directory, and the errors are one line (no layout fits: the smallest GPU count that would)."""

from __future__ import annotations

import itertools
import json
import random
import re
import shlex

import pytest

from common.typed import changed
from launcher.autoconf import search as autoconf
from launcher.config.compose import compose
from launcher.plan.build import build_plan
from launcher.plan.errors import PlanError
from launcher.plan.hardware import gpu_spec
from launcher.plan.table import layout as layout_label

from launcher_helpers import NO_GPU, planned, run_main

MODELS = ("8b", "70b", "405b")
GPU_COUNTS = (8, 64, 512, 1024)
GPU_TYPES = ("h100", "h200")
_composed: dict[tuple[str, str], dict] = {}


def auto_cfg(model: str, gpu: str, num_gpus: int, *overrides: str) -> dict:
    """parallelism=auto on Slurm nodes of 8 GPUs; composed once per model, GPU type and extra overrides."""
    key = (model, gpu, *overrides)
    if key not in _composed:
        _composed[key] = compose(
            [f"training=llama31/{model}", "parallelism=auto", "cluster=bcm", f"cluster.gpu_type={gpu}", *overrides]
        )
    return changed(_composed[key], {"parallelism.num_gpus": num_gpus})


def _candidate_count(space: dict, num_gpus: int) -> int:
    """Combinations of the search lists whose model-parallel size divides the GPUs (VP and the asymmetric split
    only with a pipeline), counted without the module's generator."""
    count = 0
    per_pipeline = len(space["vp"]) * len(space["asymmetric_pipeline"])
    for tp, pp, cp in itertools.product(space["tp"], space["pp"], space["cp"]):
        if num_gpus % (tp * pp * cp) == 0:
            count += (per_pipeline if pp > 1 else 1) * len(space["micro_batch_size"]) * len(space["recompute"])
    return count


# --------------------------------------------------------------------------- enumeration and memory filter
@pytest.mark.parametrize("model,gpu,num_gpus", list(itertools.product(MODELS, GPU_TYPES, GPU_COUNTS)))
def test_search_keeps_exactly_the_layouts_that_plan_and_fit(model, gpu, num_gpus):
    cfg = auto_cfg(model, gpu, num_gpus)
    result = autoconf.search(cfg)
    space = cfg["parallelism"]["auto"]["search"]
    assert result.tried == _candidate_count(space, num_gpus)
    assert result.tried == len(result.ranked) + sum(result.dropped.values())
    limit = (1 - cfg["parallelism"]["auto"]["memory_headroom"]) * gpu_spec(gpu).memory_gib
    model_cfg = cfg["training"]["model"]
    seen = set()
    for r in result.ranked:
        p = r.plan
        assert p.tp * p.pp * p.cp * p.dp == num_gpus and p.gpu_type == gpu
        assert model_cfg["num_attention_heads"] % p.tp == 0 and model_cfg["num_query_groups"] % p.tp == 0
        assert sum(p.layers_per_pipeline_stage) == model_cfg["num_layers"] and len(p.layers_per_pipeline_stage) == p.pp
        assert p.global_batch_size % (p.micro_batch_size * p.dp) == 0
        assert p.est_memory_gib_per_gpu <= limit
        assert p.sequence_parallel == p.tp_comm_overlap == (p.tp > 1)
        assert (p.vp is None or p.pp > 1) and (not p.asymmetric_pipeline or p.pp > 1)
        assert p.tp <= p.gpus_per_node
        seen.add(r.layout)
        # The plan the search ranked is the plan of the config it wrote for this layout.
        assert build_plan(r.cfg).to_json_dict() == p.to_json_dict()
    assert len(seen) == len(result.ranked)  # no layout twice


def test_the_reference_layouts_fit_and_rank_near_the_top():
    """NVIDIA's 8B and 405B H100 layouts are among the fastest predicted (the model is fit to such runs)."""
    for model, num_gpus, want in (("8b", 8, (1, 1, 2, None, False)), ("405b", 1024, (8, 8, 2, 8, True))):
        ranked = autoconf.search(auto_cfg(model, "h100", num_gpus)).ranked
        shapes = [(r.plan.tp, r.plan.pp, r.plan.cp, r.plan.vp, r.plan.asymmetric_pipeline) for r in ranked]
        assert want in shapes[:3], shapes[:5]


def test_the_memory_filter_is_the_plan_estimate_against_the_gpu_with_the_headroom():
    dp8 = autoconf.Layout(tp=1, pp=1, cp=1, vp=None, micro_batch_size=1, recompute=None, asymmetric=False)
    unchecked = changed(autoconf.candidate_config(auto_cfg("8b", "h100", 8), dp8), {"memory_check": False})
    est = build_plan(unchecked).est_memory_gib_per_gpu
    h100, h200 = gpu_spec("h100").memory_gib, gpu_spec("h200").memory_gib
    assert 0.95 * h100 < est < h200  # 8B on DP8 alone fits an H200 but not (with headroom) an H100

    def layouts(*args):
        return {r.layout for r in autoconf.search(auto_cfg(*args)).ranked}

    assert dp8 in layouts("8b", "h200", 8) and dp8 not in layouts("8b", "h100", 8)
    # Layouts within 5% of the GPU's memory are kept only without the headroom.
    without = autoconf.search(auto_cfg("70b", "h100", 64, "parallelism.auto.memory_headroom=0")).ranked
    tight = {r.layout for r in without if r.plan.est_memory_gib_per_gpu > 0.95 * h100}
    assert tight and {r.layout for r in without} - layouts("70b", "h100", 64) == tight
    reasons = autoconf.search(auto_cfg("70b", "h100", 64)).dropped
    assert any(r.startswith("estimated N GiB per GPU exceeds") for r in reasons)
    assert reasons["estimated memory within parallelism.auto.memory_headroom=0.05 of the GPU's"] == len(tight)


def test_every_drop_reason_is_a_plan_problem_without_its_numbers():
    cfg = auto_cfg("70b", "h100", 64)
    reasons = autoconf.search(cfg).dropped
    assert reasons and not any(re.search(r"\d", r.replace("memory_headroom=0.05", "")) for r in reasons)
    # The same problem with other numbers counts as the same reason.
    a = "parallelism.tp=8 spans nodes (cluster.gpus_per_node=4); keep TP within a node"
    b = "parallelism.tp=16 spans nodes (cluster.gpus_per_node=8); keep TP within a node"
    assert autoconf.drop_reason(a) == autoconf.drop_reason(b)


# --------------------------------------------------------------------------- ranking
@pytest.mark.parametrize("model,num_gpus", [("8b", 8), ("70b", 64), ("405b", 512)])
def test_the_ranking_is_stable_and_ordered_by_predicted_step_time(model, num_gpus):
    cfg = auto_cfg(model, "h200", num_gpus)
    ranked = autoconf.search(cfg).ranked
    shuffled = list(ranked)
    random.Random(0).shuffle(shuffled)
    assert [r.layout for r in autoconf.rank(shuffled)] == [r.layout for r in ranked]
    space = cfg.parallelism.auto.search
    reordered = changed(cfg, {f"parallelism.auto.search.{k}": list(reversed(v)) for k, v in space.items()})
    assert [r.layout for r in autoconf.search(reordered).ranked] == [r.layout for r in ranked]
    best = min(r.time.total_s for r in ranked)
    bins = [round(r.time.total_s / best / autoconf.TIE) for r in ranked]
    assert bins == sorted(bins)
    for a, b in zip(ranked, ranked[1:]):  # within a bin of near-equal predictions, less memory first
        if round(a.time.total_s / best / autoconf.TIE) == round(b.time.total_s / best / autoconf.TIE):
            assert a.plan.est_memory_gib_per_gpu <= b.plan.est_memory_gib_per_gpu


def test_the_table_explains_the_ranking_and_every_drop():
    cfg = auto_cfg("70b", "h100", 256)
    result = autoconf.search(cfg)
    text = autoconf.format_search(result, top=5, pick=7)
    for reason, count in result.dropped.items():
        assert f"{count:,}  {reason}" in text
    assert f"{result.tried:,} layouts tried: {len(result.ranked):,} fit" in text
    rows = [line.split() for line in text.splitlines() if re.match(r"\s+\d+\*?\s+TP", line)]
    assert [row[0] for row in rows] == ["0", "1", "2", "3", "4", "7*"]  # the top 5 and the pick
    for row, r in zip(rows, [*result.ranked[:5], result.ranked[7]]):
        assert " ".join(row[1:6]) == layout_label(r.plan.tp, r.plan.pp, r.plan.cp, r.plan.vp, r.plan.dp)
        step, compute, bubble, comm, other = (float(x) for x in row[-7:-2])
        assert step == pytest.approx(compute + bubble + comm + other, abs=0.003)
        assert step == pytest.approx(r.time.total_s, abs=0.0005)


# --------------------------------------------------------------------------- the pick, through main.py
def _same_run_command(stdout: str) -> list[str]:
    lines = stdout.splitlines()
    index = next(i for i, line in enumerate(lines) if "the same run without the search" in line)
    return shlex.split(lines[index + 1])[2:]  # after "python main.py"


def test_the_pick_is_written_exactly_as_its_command_line_gives_it(tmp_path):
    results = tmp_path / "results"
    out = run_main(
        "training=llama31/70b",
        "parallelism=auto",
        "parallelism.num_gpus=256",
        "cluster=bcm",
        "cluster.gpu_type=h100",
        "dry_run=true",
        f"results_dir={results}",
    )
    assert out.returncode == 0, out.stderr
    assert "auto-configurator: llama31_70b bf16 on 256 h100 GPUs" in out.stdout
    (run_dir,) = results.iterdir()
    first = {name: (run_dir / name).read_text() for name in ("config.yaml", "plan.json", "submission.sbatch")}
    run_dir.rename(tmp_path / "first")

    again = run_main(*_same_run_command(out.stdout))
    assert again.returncode == 0, again.stderr
    assert "auto-configurator" not in again.stdout
    assert [p.name for p in results.iterdir()] == [run_dir.name]
    for name, text in first.items():
        assert (run_dir / name).read_text() == text, name
    plan = json.loads(first["plan.json"])
    top = autoconf.search(auto_cfg("70b", "h100", 256)).ranked[0].plan
    assert (plan["tp"], plan["pp"], plan["cp"], plan["vp"], plan["dp"]) == (top.tp, top.pp, top.cp, top.vp, top.dp)


def test_a_sweep_over_picks_writes_the_ranked_layouts_in_their_own_run_directories(tmp_path):
    results = tmp_path / "results"
    out = run_main(
        "-m",
        "training=llama31/8b",
        "parallelism=auto",
        "parallelism.num_gpus=4",
        "cluster=bcm",
        "cluster.gpu_type=h200",
        "cluster.gpus_per_node=4",
        "training.global_batch_size=32",
        "dry_run=true",
        f"results_dir={results}",
        "parallelism.auto.pick=0,1,2",
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("auto-configurator:") == 1  # the table once per sweep
    ranked = autoconf.search(
        auto_cfg("8b", "h200", 4, "cluster.gpus_per_node=4", "training.global_batch_size=32")
    ).ranked
    runs = [p for p in results.iterdir() if p.name != "sweeps"]
    assert len(runs) == 3
    planned = {json.loads((run / "plan.json").read_text())["est_memory_gib_per_gpu"]: run for run in runs}
    for r in ranked[:3]:
        run = next(run for run in runs if run.name.startswith(f"llama31_8b_bf16_{r.layout.name(1)}_4gpu"))
        plan = json.loads((run / "plan.json").read_text())
        assert (plan["tp"], plan["cp"], plan["micro_batch_size"]) == (r.plan.tp, r.plan.cp, r.plan.micro_batch_size)
        assert "pick" not in run.name
    assert len(planned) >= 2


# --------------------------------------------------------------------------- one-line errors
def test_no_layout_fits_names_the_smallest_gpu_count_that_would():
    cfg = auto_cfg("405b", "h100", 8)
    with pytest.raises(PlanError) as err:
        autoconf.resolve(
            [
                "training=llama31/405b",
                "parallelism=auto",
                "cluster=bcm",
                "cluster.gpu_type=h100",
                "parallelism.num_gpus=8",
            ],
            cfg,
            say=None,
        )
    (line,) = err.value.problems
    assert "\n" not in line and "parallelism.num_gpus=8 h100 GPUs" in line
    smallest = int(
        re.search(r"the smallest GPU count with one that fits is (\d+): set parallelism.num_gpus=\1", line).group(1)
    )
    assert autoconf.search(auto_cfg("405b", "h100", smallest)).ranked
    for fewer in range(8, smallest, 8):  # no whole number of nodes below it has one
        assert not autoconf.search(auto_cfg("405b", "h100", fewer)).ranked, fewer


def test_main_py_stops_with_one_line_and_writes_nothing(tmp_path):
    results = tmp_path / "results"
    out = run_main(
        "training=llama31/70b", "parallelism=auto", "parallelism.num_gpus=8", "cluster=bcm", f"results_dir={results}"
    )
    assert out.returncode == 2
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("error: parallelism=auto: no layout of llama31_70b (bf16) fits parallelism.num_gpus=8")
    assert "set parallelism.num_gpus=" in line
    assert not results.exists()


@pytest.mark.parametrize(
    "overrides,words",
    [
        (["parallelism.tp=4"], ["parallelism.tp is decided by parallelism=auto", "parallelism.auto.search.tp=[...]"]),
        (["training.micro_batch_size=2"], ["training.micro_batch_size", "parallelism.auto.search.micro_batch_size"]),
        (["parallelism.auto.pick=100000"], ["parallelism.auto.pick=100000", "layouts fit; use a rank in 0.."]),
        (["parallelism.auto.search.tp=[]"], ["parallelism.auto.search.tp must be a non-empty list"]),
        (["parallelism.auto.search.cp=[0]"], ["parallelism.auto.search.cp[0]=0 must be positive"]),
    ],
)
def test_bad_auto_inputs_are_one_line_naming_the_key(overrides, words):
    args = ["training=llama31/8b", "parallelism=auto", "cluster=bcm", *overrides]
    with pytest.raises(PlanError) as err:
        autoconf.resolve(args, compose(args), say=None)
    text = str(err.value)
    for word in words:
        assert word in text, text
    assert all("\n" not in p for p in err.value.problems)


def test_the_gpu_type_is_needed_and_an_unresolved_search_never_plans():
    args = ["parallelism=auto"]  # cluster=local, no GPU here, no cluster.gpu_type
    with pytest.raises(PlanError, match=r"parallelism=auto needs the GPU type .* set cluster.gpu_type"):
        autoconf.resolve(args, compose(args), NO_GPU, say=None)
    with pytest.raises(PlanError, match="parallelism=auto is a search, not a layout"):
        planned(compose(["parallelism=auto", "cluster=bcm", "dry_run=true"]))
