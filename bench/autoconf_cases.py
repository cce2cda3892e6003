"""The auto-configurator's measured cases, each a bench/bench_train.py run on mock data, seq 8192, GBS 8, the defaults
of conf/. The script prints the measured rows in the form conf/perf/measured.yaml takes (its `pending` list names the
same cases: paste each printed row over the pending entry of the same name, in `rows`, and
`python -m launcher.autoconf.steptime` then shows the model against it).

One GPU (`--gpus 1`, the default): the 8B shape with 16 layers and the 70B shape with 2 x bf16 / fp8 x MBS 1 / 2 x
recompute none / selective / full (no 405B shape: one layer of it does not fit one H200).

    bash bench/gpu_autoconf_cases.sh OUTDIR                  # the default 8 cases, about 9 minutes
    bash bench/gpu_autoconf_cases.sh OUTDIR --cases all --shard 1/4   # every case (~28 min) in four runs: 1/4 .. 4/4
    python bench/autoconf_cases.py --pending                 # the pending entries for measured.yaml (no GPU)

Two GPUs (`--gpus 2`): the same two proxies in the layouts parallelism=auto ranks on 2 GPUs (DP2, TP2 with sequence
parallelism without and with userbuffer overlap, CP2, PP2, PP2 VP2 (asymmetric for the 70B proxy, whose 2 layers
split over PP2 x VP2 only with the embedding and the loss as stages), DP2 with full recomputation, DP2 with MBS 2
where it fits), bf16, and fp8 in DP2, TP2 with overlap and CP2; every case passes the plan's layout checks and the
search's memory filter on 2 H100 (80 GB), so it runs on H100 or H200. GBS 8 and seq 8192 as on one GPU: at DP2 each
rank runs 4 microbatches, and a pipeline 8 (its bubble 1/8 of the step, 1/16 with VP2). 21 cases, about 23 minutes
on 2 GPUs (~70 s a run of the 8B proxy, ~55 s of the 70B one), in four commands of under 9 minutes (at most 6.3
minutes of estimates each); each writes its rows after every case, and `--previous` skips the cases an earlier
command measured:

    bash bench/gpu_autoconf_cases.sh OUT/2gpu-1 --gpus 2 --shard 1/4 --budget-s 420 --timeout-s 150   # ~6 min each
    bash bench/gpu_autoconf_cases.sh OUT/2gpu-2 --gpus 2 --shard 2/4 --budget-s 420 --timeout-s 150
    bash bench/gpu_autoconf_cases.sh OUT/2gpu-3 --gpus 2 --shard 3/4 --budget-s 420 --timeout-s 150
    bash bench/gpu_autoconf_cases.sh OUT/2gpu-4 --gpus 2 --shard 4/4 --budget-s 420 --timeout-s 150
    # a shard that lists skipped cases: the same command, a new OUT dir, --previous OUT/2gpu-I/measured_rows.json
    python bench/autoconf_cases.py --rank OUT/2gpu-*/measured_rows.yaml  # the ranking table (no GPU)
    python bench/fit_steptime.py --rows OUT/2gpu-*/measured_rows.yaml    # the fit with them, held-out error per row

Four GPUs (`--gpus 4`): the 8B proxy (16 layers) and the 70B shape with 10 layers (not 2 as on two GPUs:
2 layers leave 4 GPUs only data parallelism), seq 8192, GBS 8, in layouts parallelism=auto keeps on 4 H100 (80 GB),
chosen from its ranking to spread over every dimension, each planned as the search's candidate of its layout (TP4 at
hidden 8192 with the h8192_tp4 userbuffer preset, pipelines of the 70B shape with the embedding's wgrad deferred).
8B: DP4, DP4 full recompute, CP2 x DP2, CP4, TP2 x DP2, TP4, TP2 x CP2, PP2 VP8 x DP2; 70B: TP2 x DP2 (the search's
first), TP2 full recompute, TP4, TP2 x CP2, PP2 x CP2, PP2 VP5 x CP2, TP2 x PP2 VP5 (DP4, CP alone and PP2 x DP2
exceed 80 GB);
bf16; fp8 in the three layouts the search ranks first in fp8 at MBS 1 for the 8B (DP4, CP2, TP2) and its first two
for the 70B (CP2, TP2) with TP4 (the four-GPU table's layout) in place of its third (CP4). 21 cases,
about 32 minutes on 4 H100 or H200 (~85 s a run of the 8B proxy, ~95 s of the 70B one), in five commands:

    bash bench/gpu_autoconf_cases.sh OUT/4gpu-1 --gpus 4 --shard 1/5 --budget-s 450 --timeout-s 180   # ~6.5 min each
    bash bench/gpu_autoconf_cases.sh OUT/4gpu-2 --gpus 4 --shard 2/5 --budget-s 450 --timeout-s 180
    bash bench/gpu_autoconf_cases.sh OUT/4gpu-3 --gpus 4 --shard 3/5 --budget-s 450 --timeout-s 180
    bash bench/gpu_autoconf_cases.sh OUT/4gpu-4 --gpus 4 --shard 4/5 --budget-s 450 --timeout-s 180
    bash bench/gpu_autoconf_cases.sh OUT/4gpu-5 --gpus 4 --shard 5/5 --budget-s 450 --timeout-s 180
    python bench/autoconf_cases.py --rank OUT/4gpu-*/measured_rows.yaml --gpus 4   # the ranking table (no GPU)
    python bench/autoconf_cases.py --gpus 4 --pending                             # their pending entries

Held out of the fit, chosen before measuring (FOUR_GPU_HELD_OUT): TP2 x CP2 of each proxy and the 70B's TP2 x PP2
VP5 (the fit has each dimension alone on 4 GPUs, never two model-parallel ones together) and fp8 CP2 of the 8B (as on
2 GPUs; the 70B's fp8 context-parallel case is its TP2 x CP2, held out with the bf16 one).

The ranking table (`--rank FILE...`: the printed rows, or measured.yaml; `--rank` alone reads measured.yaml) groups
the rows by model proxy, dtype, GPU type and count and batch, orders each group by measured step time beside the
step-time model's prediction and the rank parallelism=auto's own ranking (launcher/autoconf/search.py: rank) gives
it among the group, and says whether the predicted top 3 is the measured top 3 in order.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
import functools
import json
from pathlib import Path
import sys
import time
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

import yaml  # noqa: E402

GPU, GPUS_PER_NODE, GBS = "h200", 1, 8
# The two-GPU cases are checked against the smaller card (H100, 80 GB) so that they run on either; a measured row
# records the card it ran on, and the pending entries are predicted for H100.
TWO_GPU = "h100"
RECOMPUTE = {
    "none": [],
    "selective": ["parallelism.recompute_granularity=selective"],
    "full": [
        "parallelism.recompute_granularity=full",
        "parallelism.recompute_method=uniform",
        "parallelism.recompute_num_layers=1",
    ],
}
# (model, layers): the shapes of NVIDIA's 8B and 70B layers, as many as one GPU holds with room for MBS 2.
PROXIES = (("8b", 16), ("70b", 2))
# Our estimate of one run's wall time (startup ~30 s + 12 steps), by GPU count and model, for the time budget.
# Four GPUs: ~75 s start-up (bench/four_gpu.py's STARTUP_S, measured) plus 12 steps of the 8B proxy (0.7-1 s at GBS 8
# on H200 by the step-time model) and ~72 s plus 12 of the 70B shape with 10 layers (1.5-2 s).
ESTIMATE_S = {1: {"8b": 70, "70b": 52, "405b": 60}, 2: {"8b": 70, "70b": 55}, 4: {"8b": 85, "70b": 95}}
# The two-GPU layouts (main.py overrides after the model), each kept for a proxy only where the plan accepts it on
# 2 H100 (fits_two_gpus): 8B's asymmetric PP2 VP2 does not split (18 stages' worth of layers over 4 chunks), 70B's
# symmetric one neither (2 layers over 4 chunks), 8B's DP2 MBS 2 exceeds 80 GB.
DP2 = ["parallelism=tp1", "parallelism.num_gpus=2"]
TWO_GPU_LAYOUTS: dict[str, list[str]] = {
    "dp2": DP2,
    "dp2-mbs2": [*DP2, "training.micro_batch_size=2"],
    "dp2-full": [*DP2, *RECOMPUTE["full"]],
    "tp2": ["parallelism=tp2_sp", "parallelism.tp_comm_overlap=false"],
    "tp2-overlap": ["parallelism=tp2_sp"],
    "cp2": ["parallelism=tp1_cp2", "parallelism.num_gpus=2"],
    "pp2": ["parallelism=custom", "parallelism.num_gpus=2", "parallelism.pp=2"],
    "pp2-vp2": ["parallelism=pp2_vp2_asym", "parallelism.asymmetric_pipeline=false"],
    "pp2-vp2-asym": ["parallelism=pp2_vp2_asym"],
}
# Row names in measured.yaml's style where the key is terse.
TWO_GPU_LABELS = {"dp2-full": "dp2 full recompute", "tp2": "tp2 sp", "tp2-overlap": "tp2 sp overlap"}
# fp8 in the layouts the search ranks first for both proxies (DP2, CP2, TP2 with overlap): one run each beside bf16.
TWO_GPU_FP8 = ("dp2", "tp2-overlap", "cp2")
# Held out of the step-time fit, chosen before measuring: the interleaved pipeline (the fit keeps plain PP2, so the
# held-out error is the VP bubble term's on a layout it was not fit to), MBS 2 (as on one GPU) and fp8 CP2 (the fit
# has fp8 only without CP on our stack, and CP2 in bf16).
TWO_GPU_HELD_OUT = ("pp2-vp2", "pp2-vp2-asym", "dp2-mbs2", "fp8-cp2")
# The four-GPU cases are checked against H100 (80 GB) too; the 70B proxy has 10 layers there (the four-GPU table's).
FOUR_GPU = "h100"
FOUR_GPU_PROXIES = (("8b", 16), ("70b", 10))
_SP = ["parallelism.sequence_parallel=true", "parallelism.tp_comm_overlap=true"]
DP4 = ["parallelism=tp1", "parallelism.num_gpus=4"]
_CUSTOM4 = ["parallelism=custom", "parallelism.num_gpus=4"]
FOUR_GPU_LAYOUTS: dict[str, list[str]] = {
    "dp4": DP4,
    "dp4-full": [*DP4, *RECOMPUTE["full"]],
    "cp2": ["parallelism=tp1_cp2", "parallelism.num_gpus=4"],
    "cp4": [*_CUSTOM4, "parallelism.cp=4"],
    "tp2": ["parallelism=tp2_sp", "parallelism.num_gpus=4"],
    "tp2-full": ["parallelism=tp2_sp", "parallelism.num_gpus=4", *RECOMPUTE["full"]],
    "tp4": [*_CUSTOM4, "parallelism.tp=4", *_SP],
    "tp2-cp2": [*_CUSTOM4, "parallelism.tp=2", "parallelism.cp=2", *_SP],
    "pp2": [*_CUSTOM4, "parallelism.pp=2"],
    "pp2-vp5": [*_CUSTOM4, "parallelism.pp=2", "parallelism.vp=5"],
    "pp2-vp8": [*_CUSTOM4, "parallelism.pp=2", "parallelism.vp=8"],
    "pp2-cp2": [*_CUSTOM4, "parallelism.pp=2", "parallelism.cp=2"],
    "pp2-cp2-vp5": [*_CUSTOM4, "parallelism.pp=2", "parallelism.cp=2", "parallelism.vp=5"],
    "tp2-pp2-vp5": [*_CUSTOM4, "parallelism.tp=2", "parallelism.pp=2", "parallelism.vp=5", *_SP],
}
# Per proxy, in bf16: layouts the search keeps on 4 H100, spread over every dimension (its first ones included) ...
FOUR_GPU_BF16 = {
    "8b": ("dp4", "dp4-full", "cp2", "cp4", "tp2", "tp4", "tp2-cp2", "pp2-vp8"),
    # The 70B's pipelines split its sequence too (CP2): PP2 x DP2 holds the deferred output-layer gradients of every
    # microbatch and no longer fits an H100 by the memory estimate.
    "70b": ("tp2", "tp2-full", "tp4", "tp2-cp2", "pp2-cp2", "pp2-cp2-vp5", "tp2-pp2-vp5"),
}
# ... and in fp8 the three it ranks first in fp8 at MBS 1 (the 70B's second is TP4, the four-GPU table's layout; its
# CP2 x DP2 no longer fits an H100 by the memory estimate once FP8 weights count their transpose).
FOUR_GPU_FP8 = {"8b": ("dp4", "cp2", "tp2"), "70b": ("tp2", "tp4", "tp2-cp2")}
FOUR_GPU_LABELS = {
    "dp4-full": "dp4 full recompute",
    "tp2": "tp2 sp overlap",
    "tp2-full": "tp2 sp overlap full recompute",
    "tp4": "tp4 sp overlap",
    "tp2-cp2": "tp2 cp2 sp overlap",
    "tp2-pp2-vp5": "tp2 pp2 vp5 sp overlap",
}
FOUR_GPU_HELD_OUT = ("tp2-cp2", "tp2-pp2-vp5", "fp8-cp2")
DEFAULT = (
    "8b-bf16-mbs1-none",
    "8b-fp8-mbs1-none",
    "8b-bf16-mbs2-none",
    "8b-fp8-mbs2-none",
    "8b-bf16-mbs1-selective",
    "8b-bf16-mbs1-full",
    "70b-bf16-mbs1-none",
    "70b-fp8-mbs1-none",
)


@dataclass(frozen=True)
class Case:
    key: str  # short name for --cases
    name: str  # measured.yaml's row name
    model: str
    overrides: list[str]  # measured.yaml's row overrides (what main.py is given, besides the batch and cluster)
    split: str  # measured.yaml's split (fit or held_out), fixed before the case is measured
    gpus: int = 1
    gpu: str = GPU  # the card of the pending entry (a measured row records the one it ran on)

    @property
    def estimate_s(self) -> int:
        factor = 1.3 if "full" in self.key else 1.0
        return int(ESTIMATE_S[self.gpus][self.model] * factor)


def _case(model: str, layers: int, dtype: str, mbs: int, recompute: str) -> Case:
    overrides = [
        f"training=llama31/{model}",
        f"training.model.num_layers={layers}",
        "parallelism=tp1",
        "parallelism.num_gpus=1",
        f"dtype={dtype}",
        f"training.micro_batch_size={mbs}",
        *RECOMPUTE[recompute],
    ]
    label = "" if recompute == "none" else f" {recompute} recompute"
    name = f"{model} {layers}-layer {dtype} mbs{mbs}{label} (1 H200)"
    # MBS 2 is held out of the step-time fit: the fit sees every shape, dtype and recomputation once (at MBS 1),
    # and the held-out rows measure the model on the other microbatch size the auto-configurator searches.
    split = "held_out" if mbs == 2 else "fit"
    return Case(f"{model}-{dtype}-mbs{mbs}-{recompute}", name, model, overrides, split)


def _pipeline_settings(model: str) -> list[str]:
    """What parallelism=auto adds to a pipeline of the model's hidden size (parallelism.auto.tuned: 70B's 8192 defers
    the embedding's weight-gradient GEMMs), so a PP case runs as the search's candidate of its layout would."""
    from launcher.config.compose import compose

    cfg = compose([f"training=llama31/{model}", "parallelism=auto"])
    auto, hidden = cfg.parallelism.auto, cfg.training.model.hidden_size
    tuned = next((t for t in auto.tuned if t.hidden_size == hidden), None) if auto else None
    if tuned is None:
        return []
    return [
        "parallelism.defer_embedding_wgrad_compute=true",
        f"parallelism.wgrad_deferral_limit={tuned.wgrad_deferral_limit}",
    ]


def _two_gpu_case(model: str, layers: int, dtype: str, layout: str) -> Case:
    overrides = [f"training=llama31/{model}", f"training.model.num_layers={layers}", *TWO_GPU_LAYOUTS[layout]]
    if layout.startswith("pp"):
        overrides += _pipeline_settings(model)
    overrides.append(f"dtype={dtype}")
    name = f"{model} {layers}-layer {dtype} {TWO_GPU_LABELS.get(layout, layout.replace('-', ' '))} (2 GPUs)"
    held_out = layout in TWO_GPU_HELD_OUT or f"{dtype}-{layout}" in TWO_GPU_HELD_OUT
    return Case(f"{model}-{dtype}-{layout}", name, model, overrides, "held_out" if held_out else "fit", 2, TWO_GPU)


def _userbuffer_preset(model: str, tp: int) -> list[str]:
    """The userbuffer preset parallelism=auto gives a TP layout of the model's hidden size (parallelism.auto.tuned:
    h8192_tp4 for 70B's TP4), as the override that sets it."""
    from launcher.config.compose import compose

    cfg = compose([f"training=llama31/{model}", "parallelism=auto"])
    auto, hidden = cfg.parallelism.auto, cfg.training.model.hidden_size
    tuned = next((t for t in auto.tuned if t.hidden_size == hidden), None) if auto else None
    preset = next((u.preset for u in tuned.userbuffers if u.tp == tp), None) if tuned else None
    return [f"+userbuffers@parallelism.tp_comm_overlap_cfg={preset}"] if preset else []


def _four_gpu_case(model: str, layers: int, dtype: str, layout: str) -> Case:
    overrides = [f"training=llama31/{model}", f"training.model.num_layers={layers}", *FOUR_GPU_LAYOUTS[layout]]
    tp = next((int(o.split("=")[1]) for o in overrides if o.startswith("parallelism.tp=")), 2 if "tp2" in layout else 1)
    overrides += _userbuffer_preset(model, tp) if tp > 1 else []
    if "pp2" in layout:
        overrides += _pipeline_settings(model)
    overrides.append(f"dtype={dtype}")
    name = f"{model} {layers}-layer {dtype} {FOUR_GPU_LABELS.get(layout, layout.replace('-', ' '))} (4 GPUs)"
    held_out = layout in FOUR_GPU_HELD_OUT or f"{dtype}-{layout}" in FOUR_GPU_HELD_OUT
    return Case(f"{model}-{dtype}-{layout}", name, model, overrides, "held_out" if held_out else "fit", 4, FOUR_GPU)


def fits_one_gpu(overrides: list[str]) -> bool:
    """parallelism=auto would keep the case on one H200: the plan's memory estimate leaves the search's headroom
    free, as fits_two_gpus asks of the two-GPU cases."""
    return fits_gpus(overrides, 1, GPU)


def fits_two_gpus(overrides: list[str]) -> bool:
    """parallelism=auto would keep the layout on 2 H100: the plan's layout checks pass (the splits, the batch, the
    memory estimate) and the estimate leaves the search's memory headroom free."""
    return fits_gpus(overrides, 2, TWO_GPU)


def fits_gpus(overrides: list[str], gpus: int, gpu: str) -> bool:
    """parallelism=auto would keep the layout on `gpus` `gpu`s of one node (fits_two_gpus's checks)."""
    from launcher.autoconf.search import auto_settings
    from launcher.config.compose import compose
    from launcher.plan.errors import PlanError
    from launcher.plan.hardware import gpu_spec
    from launcher.plan.validate import LAYOUT_CHECKS, validate

    cfg = compose([*overrides, *_cluster(gpus, gpu)])
    try:
        plan = validate(cfg, None, checks=LAYOUT_CHECKS).plan
    except PlanError:
        return False
    headroom = auto_settings(compose(["parallelism=auto"])).memory_headroom
    return plan.est_memory_gib_per_gpu <= (1 - headroom) * gpu_spec(gpu).memory_gib


def _cluster(gpus: int = GPUS_PER_NODE, gpu: str = GPU) -> list[str]:
    return [
        "cluster=bcm",
        f"cluster.gpu_type={gpu}",
        f"cluster.gpus_per_node={gpus}",
        f"training.global_batch_size={GBS}",
    ]


@functools.lru_cache(maxsize=None)
def two_gpu_cases() -> tuple[Case, ...]:
    """Both proxies in every two-GPU layout the plan accepts, bf16, then fp8 in TWO_GPU_FP8 (planning each takes a
    moment: cached)."""
    candidates = [
        _two_gpu_case(model, layers, dtype, layout)
        for dtype in ("bf16", "fp8")
        for model, layers in PROXIES
        for layout in TWO_GPU_LAYOUTS
        if dtype == "bf16" or layout in TWO_GPU_FP8
    ]
    return tuple(c for c in candidates if fits_two_gpus(c.overrides))


@functools.lru_cache(maxsize=None)
def four_gpu_cases() -> tuple[Case, ...]:
    """Both four-GPU proxies in their bf16 layouts, then fp8 in theirs, each kept only where the search would keep
    it on 4 H100 (a layout dropped there is a test failure, not a silent gap)."""
    candidates = [
        _four_gpu_case(model, layers, dtype, layout)
        for dtype, chosen in (("bf16", FOUR_GPU_BF16), ("fp8", FOUR_GPU_FP8))
        for model, layers in FOUR_GPU_PROXIES
        for layout in chosen[model]
    ]
    return tuple(c for c in candidates if fits_gpus(c.overrides, 4, FOUR_GPU))


def cases(gpus: int = 1) -> list[Case]:
    if gpus == 2:
        return list(two_gpu_cases())
    if gpus == 4:
        return list(four_gpu_cases())
    out = [
        _case(model, layers, dtype, mbs, recompute)
        for model, layers in PROXIES
        for dtype in ("bf16", "fp8")
        for mbs in (1, 2)
        for recompute in RECOMPUTE
    ]
    # No 405B case: one layer of it does not fit one H200. bf16 is estimated at 140.7 GiB of 139.8; fp8 at 136.7
    # left no headroom, and its run (2026-12-02) ran out of memory creating Adam's state, with 139.4 GiB in use.
    return out


def measured_row(case: Case, result: dict) -> dict:
    """A row of conf/perf/measured.yaml from bench_train's result, on the card the run found (its plan's)."""
    return {
        "name": case.name,
        "split": case.split,
        "overrides": case.overrides,
        "gpu": result.get("gpu") or case.gpu,
        "gpus_per_node": case.gpus,
        "global_batch_size": GBS,
        "tokens_per_s_per_gpu": round(result["tokens_per_s_per_gpu"]),
        "step_time_s": round(result["step_time_s"], 3),
        "peak_memory_gib": round(result["peak_memory_gib"], 1),
    }


def pending_entry(case: Case) -> dict:
    return {
        "name": case.name,
        "split": case.split,
        "overrides": case.overrides,
        "gpu": case.gpu,
        "gpus_per_node": case.gpus,
        "global_batch_size": GBS,
        "tokens_per_s_per_gpu": None,
        "step_time_s": None,
        "peak_memory_gib": None,
    }


def to_yaml(rows: list[dict]) -> str:
    return yaml.safe_dump(rows, sort_keys=False, default_flow_style=None, width=118)


def pick(all_cases: list[Case], which: str, shard: str | None) -> list[Case]:
    if which == "default" and all_cases and all_cases[0].gpus > 1:
        chosen = list(all_cases)  # the two- and four-GPU sets are measured whole: their ranking needs every layout
    elif which == "default":
        chosen = [c for c in all_cases if c.key in DEFAULT]
    elif which == "all":
        chosen = list(all_cases)
    else:
        keys = which.split(",")
        unknown = sorted(set(keys) - {c.key for c in all_cases})
        if unknown:
            raise SystemExit(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(c.key for c in all_cases)}")
        by_key = {c.key: c for c in all_cases}
        chosen = [by_key[key] for key in dict.fromkeys(keys)]  # in the order given: the first ones first
    if shard:
        index, count = _shard(shard)
        chosen = chosen[index - 1 :: count]
    return chosen


def _shard(shard: str) -> tuple[int, int]:
    parts = shard.split("/")
    if len(parts) != 2 or not all(p.isdigit() for p in parts) or not 1 <= int(parts[0]) <= int(parts[1]):
        raise SystemExit(f"--shard {shard}: give I/N with 1 <= I <= N (e.g. 1/4)")
    return int(parts[0]), int(parts[1])


def read_rows(paths: list[str]) -> list[dict]:
    """Measured rows of these files (perfdata.rows_from_files); a bad file is one line."""
    from launcher.autoconf.perfdata import rows_from_files

    try:
        return rows_from_files(paths)
    except ValueError as err:
        raise SystemExit(str(err)) from None


def rank(paths: list[str], gpus: int | None) -> str:
    """The ranking table of the rows (on `gpus` GPUs where given) in groups of two or more (launcher/report/ranking.py:
    rank_rows)."""
    from launcher.autoconf.perfdata import MEASURED
    from launcher.autoconf.steptime import check_rows
    from launcher.report.ranking import format_row_ranking, rank_rows

    # A row in several files (measured.yaml and the bench's) counts once, as the last file has it.
    rows = list({r["name"]: r for r in read_rows(paths or [str(MEASURED)])}.values())
    checks = [c for c in check_rows(rows=rows) if gpus is None or c.plan.num_gpus == gpus]
    groups = [g for g in rank_rows(checks) if len(g.measured) >= 2]
    if not groups:
        where = ", ".join(paths or [str(MEASURED)])
        raise SystemExit(f"no two measured rows differ only in layout{f' on {gpus} GPUs' if gpus else ''} in {where}")
    return format_row_ranking(groups)


def _write_rows(out: Path, rows: list[dict]) -> str:
    """measured_rows.yaml and .json, after every case: a command cut short keeps the rows it measured."""
    text = to_yaml(rows) if rows else ""
    (out / "measured_rows.yaml").write_text(text)
    (out / "measured_rows.json").write_text(json.dumps(rows, indent=1))
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="where run directories and measured_rows.yaml go")
    parser.add_argument(
        "--gpus",
        type=int,
        default=None,
        choices=[1, 2, 4],
        help="the one-GPU (default), two-GPU or four-GPU cases; --rank: rows on these",
    )
    parser.add_argument(
        "--cases", default="default", help="default, all, or comma-separated keys, run in that order (see --list)"
    )
    parser.add_argument("--shard", default=None, help="I/N: every N-th case from the I-th, to split --cases all")
    parser.add_argument("--budget-s", type=float, default=560.0, help="skip cases that would end after this")
    parser.add_argument("--timeout-s", type=float, default=300.0, help="kill a case's run after this")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--window", type=int, default=6)
    parser.add_argument("--list", action="store_true", help="print the cases")
    parser.add_argument("--pending", action="store_true", help="print measured.yaml's pending entries")
    parser.add_argument(
        "--previous", nargs="+", default=[], help="measured_rows files of earlier commands: their cases are not rerun"
    )
    parser.add_argument(
        "--rank", nargs="*", default=None, metavar="ROWS", help="print the ranking table of these rows (no GPU)"
    )
    args = parser.parse_args(argv)
    if args.rank is not None:
        print(rank(args.rank, args.gpus))
        return 0
    all_cases = cases(args.gpus or 1)
    if args.pending:
        print(to_yaml([pending_entry(c) for c in all_cases]), end="")
        return 0
    chosen = pick(all_cases, args.cases, args.shard)
    if args.list:
        for c in chosen:
            print(f"{c.estimate_s:>4} s  {c.key:<26} {c.split:<8} {c.name}")
        print(f"{sum(c.estimate_s for c in chosen)} s estimated in all")
        return 0
    if not args.out:
        parser.error("--out is required to measure")
    import bench_train

    out = Path(args.out).absolute()
    runs = out / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    earlier = {r["name"]: r for r in read_rows(args.previous)}
    start = time.monotonic()
    rows, failed, skipped = [], [], []
    for case in chosen:
        if case.name in earlier:
            rows.append(earlier[case.name])
            continue
        if time.monotonic() - start + case.estimate_s > args.budget_s:
            skipped.append(case.key)
            continue
        bench_args = SimpleNamespace(
            model=f"llama31/{case.model}", gpus=case.gpus, gbs=GBS, steps=args.steps, window=args.window
        )
        # The model is given by bench_train itself; the case's other overrides follow it.
        result = bench_train.run_case(case.key, case.overrides[1:], bench_args, runs, timeout=args.timeout_s)
        if "error" in result:
            failed.append(f"{case.key} ({result['error']})")
        else:
            rows.append(measured_row(case, result))
            _write_rows(out, rows)
        print(f"[{time.monotonic() - start:6.0f} s] {case.key}: {result.get('error') or 'ok'}", flush=True)
    text = _write_rows(out, rows)
    gpus = args.gpus or 1
    print(f"\n# rows for conf/perf/measured.yaml (rows:), measured on {gpus} GPU(s) with bench/autoconf_cases.py")
    print(text, end="")
    if failed:
        print(f"# failed: {', '.join(failed)}")
    if skipped:
        print(f"# skipped for the {args.budget_s:.0f} s budget: {', '.join(skipped)} (run them with --cases)")
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
