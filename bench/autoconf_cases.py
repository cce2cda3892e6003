"""The auto-configurator's single-GPU cases: the 8B shape with 16 layers and the 70B shape with 2 (plus the 405B shape
with 1 layer where the plan's memory estimate fits one GPU) x bf16 / fp8 x MBS 1 / 2 x recompute none / selective /
full, on one GPU with mock data, seq 8192, GBS 8, the defaults of conf/. Each case is a bench/bench_train.py run;
the script prints the measured rows in the form conf/perf/measured.yaml takes (its `pending` list names the same
cases: paste each printed row over the pending entry of the same name, in `rows`, and
`python -m launcher.autoconf.steptime` then shows the model against it).

    bash bench/gpu_autoconf_cases.sh OUTDIR                  # the default 8 cases, about 9 minutes
    bash bench/gpu_autoconf_cases.sh OUTDIR --cases all --shard 1/4   # every case (~28 min) in four runs: 1/4 .. 4/4
    python bench/autoconf_cases.py --pending                 # the pending entries for measured.yaml (no GPU)
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
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
# Our estimate of one run's wall time on one H200 (startup ~30 s + 12 steps), by model, for the time budget.
ESTIMATE_S = {"8b": 70, "70b": 52, "405b": 60}
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

    @property
    def estimate_s(self) -> int:
        factor = 1.3 if "full" in self.key else 1.0
        return int(ESTIMATE_S[self.model] * factor)


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


def fits_one_gpu(overrides: list[str]) -> bool:
    """The plan's memory estimate for the case fits the GPU (without the auto-configurator's headroom)."""
    from launcher.config.compose import compose
    from launcher.plan.build import build_plan
    from launcher.plan.hardware import gpu_spec

    plan = build_plan(compose([*overrides, *_cluster(), "memory_check=false"]))
    return plan.est_memory_gib_per_gpu <= gpu_spec(GPU).memory_gib


def _cluster() -> list[str]:
    return [
        "cluster=bcm",
        f"cluster.gpu_type={GPU}",
        f"cluster.gpus_per_node={GPUS_PER_NODE}",
        f"training.global_batch_size={GBS}",
    ]


def cases() -> list[Case]:
    out = [
        _case(model, layers, dtype, mbs, recompute)
        for model, layers in PROXIES
        for dtype in ("bf16", "fp8")
        for mbs in (1, 2)
        for recompute in RECOMPUTE
    ]
    # The 405B shape only where one layer of it fits one GPU by the plan's estimate (bf16 does not: 140.7 GiB of
    # 139.8 on an H200; fp8, with FP8 weights, does).
    out += [c for c in (_case("405b", 1, dtype, 1, "none") for dtype in ("bf16", "fp8")) if fits_one_gpu(c.overrides)]
    return out


def measured_row(case: Case, result: dict) -> dict:
    """A row of conf/perf/measured.yaml from bench_train's result."""
    return {
        "name": case.name,
        "split": case.split,
        "overrides": case.overrides,
        "gpu": GPU,
        "gpus_per_node": GPUS_PER_NODE,
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
        "gpu": GPU,
        "gpus_per_node": GPUS_PER_NODE,
        "global_batch_size": GBS,
        "tokens_per_s_per_gpu": None,
        "step_time_s": None,
        "peak_memory_gib": None,
    }


def to_yaml(rows: list[dict]) -> str:
    return yaml.safe_dump(rows, sort_keys=False, default_flow_style=None, width=118)


def pick(all_cases: list[Case], which: str, shard: str | None) -> list[Case]:
    if which == "default":
        chosen = [c for c in all_cases if c.key in DEFAULT]
    elif which == "all":
        chosen = list(all_cases)
    else:
        keys = which.split(",")
        unknown = sorted(set(keys) - {c.key for c in all_cases})
        if unknown:
            raise SystemExit(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(c.key for c in all_cases)}")
        chosen = [c for c in all_cases if c.key in keys]
    if shard:
        index, count = (int(x) for x in shard.split("/"))
        chosen = chosen[index - 1 :: count]
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="where run directories and measured_rows.yaml go")
    parser.add_argument("--cases", default="default", help="default, all, or comma-separated keys (see --list)")
    parser.add_argument("--shard", default=None, help="I/N: every N-th case from the I-th, to split --cases all")
    parser.add_argument("--budget-s", type=float, default=560.0, help="skip cases that would end after this")
    parser.add_argument("--timeout-s", type=float, default=300.0, help="kill a case's run after this")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--window", type=int, default=6)
    parser.add_argument("--list", action="store_true", help="print the cases")
    parser.add_argument("--pending", action="store_true", help="print measured.yaml's pending entries")
    args = parser.parse_args(argv)
    all_cases = cases()
    if args.pending:
        print(to_yaml([pending_entry(c) for c in all_cases]), end="")
        return 0
    chosen = pick(all_cases, args.cases, args.shard)
    if args.list:
        for c in chosen:
            print(f"{c.estimate_s:>4} s  {c.key:<26} {c.name}")
        print(f"{sum(c.estimate_s for c in chosen)} s estimated in all")
        return 0
    if not args.out:
        parser.error("--out is required to measure")
    import bench_train

    out = Path(args.out).absolute()
    runs = out / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    rows, failed, skipped = [], [], []
    for case in chosen:
        if time.monotonic() - start + case.estimate_s > args.budget_s:
            skipped.append(case.key)
            continue
        bench_args = SimpleNamespace(
            model=f"llama31/{case.model}", gpus=1, gbs=GBS, steps=args.steps, window=args.window
        )
        # The model is given by bench_train itself; the case's other overrides follow it.
        result = bench_train.run_case(case.key, case.overrides[1:], bench_args, runs, timeout=args.timeout_s)
        if "error" in result:
            failed.append(f"{case.key} ({result['error']})")
        else:
            rows.append(measured_row(case, result))
        print(f"[{time.monotonic() - start:6.0f} s] {case.key}: {result.get('error') or 'ok'}", flush=True)
    text = to_yaml(rows) if rows else ""
    (out / "measured_rows.yaml").write_text(text)
    (out / "measured_rows.json").write_text(json.dumps(rows, indent=1))
    print("\n# rows for conf/perf/measured.yaml (rows:), measured on one GPU with bench/autoconf_cases.py")
    print(text, end="")
    if failed:
        print(f"# failed: {', '.join(failed)}")
    if skipped:
        print(f"# skipped for the {args.budget_s:.0f} s budget: {', '.join(skipped)} (run them with --cases)")
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
