"""The single-GPU measurements behind the defaults in conf/dtype/ and conf/training/: one GPU with the training stack,
mock data, seq 8192, GBS 8, MBS 1 (the 8B shape with 16 layers and the 70B shape with 2, as torchtitan-comparable
proxies), each case a bench/bench_train.py run; then the kernel breakdown of one profiled FP8 step before and after
the new defaults. Two parts, each within about 9 minutes of wall time (the estimate per case is in CASES):

    bash bench/gpu_measurements.sh OUTDIR             # part 1: defaults, casts, 70B, graphs on the tiny model
    bash bench/gpu_measurements.sh OUTDIR --part 2    # part 2: graphs and the other casts on the 8B proxy

OUTDIR gets table_part<N>.txt (bench_train's table), rows_part<N>.json, profile_breakdown.txt (part 1), runs/
(every run directory and its log). A case that would end past --budget-s is skipped and named at the end."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
import json
from pathlib import Path
import sys
import time
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_train  # noqa: E402
import profile_breakdown  # noqa: E402

PROXY_8B = ["training.model.num_layers=16", "parallelism=tp1"]
PROXY_70B = ["training.model.num_layers=2", "parallelism=tp1"]
TINY = ["parallelism=tp1"]
# The profiled step sits just before the timing window (steps 7-12 of 12), so its overhead stays out of it.
PROFILE = ["profile.enabled=true", "profile.start_step=6", "profile.end_step=7"]
# What dtype=fp8 meant before the single-GPU defaults: FP8 weights gathered in FP8, Transformer Engine's loss.
OLD_FP8 = ["dtype=fp8", "dtype.fp8_param_gather=true", "training.model.cross_entropy_fusion=te"]


@dataclass(frozen=True)
class Case:
    name: str
    model: str
    overrides: list[str]
    estimate_s: int  # wall time of the whole run on one H200, startup included (our estimate)
    part: int
    steps: int = 12
    window: int = 6
    profile: str | None = None  # "before" / "after": its trace goes into the breakdown
    tags: tuple[str, ...] = field(default=())


CASES: list[Case] = [
    # Part 1 (~505 s): the new defaults and the old FP8 default, profiled; the most promising cast change; 70B;
    # CUDA graphs where launch overhead matters most (the tiny model's small kernels).
    Case("8b16-bf16", "llama31/8b", [*PROXY_8B, "dtype=bf16"], 70, 1),
    Case("8b16-fp8", "llama31/8b", [*PROXY_8B, "dtype=fp8", *PROFILE], 70, 1, profile="after"),
    Case("8b16-fp8-old-default", "llama31/8b", [*PROXY_8B, *OLD_FP8, *PROFILE], 75, 1, profile="before"),
    Case("8b16-fp8-op-fuser", "llama31/8b", [*PROXY_8B, "dtype=fp8", *bench_train.OP_FUSER], 70, 1),
    Case("70b2-bf16", "llama31/70b", [*PROXY_70B, "dtype=bf16"], 55, 1),
    Case("70b2-fp8", "llama31/70b", [*PROXY_70B, "dtype=fp8"], 50, 1),
    Case("tiny-graphs-none", "llama31/tiny", [*TINY, "training.cuda_graphs=none"], 35, 1, steps=40, window=20),
    Case(
        "tiny-graphs-per-layer", "llama31/tiny", [*TINY, "training.cuda_graphs=per_layer"], 40, 1, steps=40, window=20
    ),
    Case(
        "tiny-graphs-full-iter",
        "llama31/tiny",
        [*TINY, "training.cuda_graphs=full_iteration"],
        40,
        1,
        steps=40,
        window=20,
    ),
    # Part 2 (~360 s): CUDA graphs on the 8B proxy (graphs off is part 1's 8b16-fp8), the other cast changes, the
    # block-scaled recipe Hopper has.
    Case("8b16-fp8-graphs-per-layer", "llama31/8b", [*PROXY_8B, "dtype=fp8", "training.cuda_graphs=per_layer"], 75, 2),
    Case(
        "8b16-fp8-graphs-full-iter",
        "llama31/8b",
        [*PROXY_8B, "dtype=fp8", "training.cuda_graphs=full_iteration"],
        75,
        2,
    ),
    Case("8b16-fp8-te-act", "llama31/8b", [*PROXY_8B, "dtype=fp8", "dtype.te_activation_func=true"], 70, 2),
    # The op fuser casts weights every microbatch unless they are FP8 already: with FP8 weights it may win.
    Case(
        "8b16-fp8-op-fuser-fp8w",
        "llama31/8b",
        [*PROXY_8B, "dtype=fp8", *bench_train.OP_FUSER, "dtype.fp8_param_gather=true"],
        70,
        2,
    ),
    Case("8b16-fp8-blockwise", "llama31/8b", [*PROXY_8B, "dtype=fp8", "dtype.fp8_recipe=blockwise"], 70, 2),
]


def selected(part: str, only: list[str] | None) -> list[Case]:
    cases = [c for c in CASES if part == "all" or c.part == int(part)]
    if only:
        unknown = sorted(set(only) - {c.name for c in CASES})
        if unknown:
            raise SystemExit(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(c.name for c in CASES)}")
        cases = [c for c in CASES if c.name in only]
    return cases


def run(cases: list[Case], out: Path, budget_s: float, timeout_s: float, label: str) -> list[dict]:
    runs = out / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    rows, skipped = [], []
    for case in cases:
        elapsed = time.monotonic() - start
        if elapsed + case.estimate_s > budget_s:
            skipped.append(case.name)
            continue
        args = SimpleNamespace(model=case.model, gpus=1, gbs=8, steps=case.steps, window=case.window)
        began = time.monotonic()
        row = bench_train.run_case(case.name, case.overrides, args, runs, timeout=timeout_s)
        row["wall_s"] = round(time.monotonic() - began, 1)
        row["estimate_s"] = case.estimate_s
        row["overrides"] = case.overrides
        rows.append(row)
        print(
            f"[{time.monotonic() - start:6.0f} s] {case.name}: {row.get('error') or 'ok'} in {row['wall_s']} s "
            f"(estimated {case.estimate_s} s)",
            flush=True,
        )
    with open(out / f"table_{label}.txt", "w") as f:
        stdout, sys.stdout = sys.stdout, f
        try:
            bench_train.print_table(rows)
            bench_train.print_references(rows)
            print("\nwall time per case (s): " + ", ".join(f"{r['case']} {r['wall_s']}" for r in rows))
            if skipped:
                print(f"skipped for the {budget_s:.0f} s budget: {', '.join(skipped)} (run them with --only)")
        finally:
            sys.stdout = stdout
    (out / f"rows_{label}.json").write_text(json.dumps(rows, indent=1))
    print((out / f"table_{label}.txt").read_text())
    return rows


def write_breakdown(cases: list[Case], rows: list[dict], out: Path) -> None:
    """The profiled FP8 step before (old default) and after (new default), kernels grouped."""
    by_name = {r["case"]: r for r in rows if "error" not in r}
    named, sources = [], []
    for label in ("before", "after"):
        case = next((c for c in cases if c.profile == label), None)
        if case is None or case.name not in by_name:
            continue
        traces = sorted(Path(by_name[case.name]["run_dir"]).glob("profile/*.pt.trace.json.gz"))
        if traces:
            named.append((label, profile_breakdown.breakdown(profile_breakdown.load_events(traces[0]))))
            sources.append(f"{label}: {case.name} ({traces[0]})")
    if not named:
        return
    text = (
        "One FP8 step of the 8B proxy (16 layers, seq 8192, GBS 8 = 8 microbatches), GPU kernel time by group.\n"
        "before: dtype=fp8 as it was (FP8 weights gathered in FP8, Transformer Engine's loss); after: the new "
        "defaults.\n" + "\n".join(sources) + "\n\n" + profile_breakdown.format_breakdowns(named, top=5)
    )
    (out / "profile_breakdown.txt").write_text(text + "\n")
    print(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="where the tables, traces and run directories go")
    parser.add_argument("--part", default="1", choices=["1", "2", "all"])
    parser.add_argument("--only", default=None, help="comma-separated case names (any part)")
    parser.add_argument("--budget-s", type=float, default=540.0, help="skip cases that would end after this")
    parser.add_argument("--timeout-s", type=float, default=300.0, help="kill a case's run after this")
    parser.add_argument("--list", action="store_true", help="print the cases and their estimates")
    args = parser.parse_args(argv)
    cases = selected(args.part, args.only.split(",") if args.only else None)
    if args.list:
        for c in cases:
            print(f"part {c.part}  {c.estimate_s:>4} s  {c.name:<28} training={c.model} {' '.join(c.overrides)}")
        print(f"{sum(c.estimate_s for c in cases)} s estimated in all")
        return 0
    out = Path(args.out).absolute()
    out.mkdir(parents=True, exist_ok=True)
    taken = [c.name for c in cases if (out / "runs" / c.name).exists()]
    if taken:  # a run directory belongs to one run: its metrics would mix with the earlier run's
        raise SystemExit(f"{out / 'runs'} already holds {', '.join(taken)}; give this measurement another OUTDIR")
    label = f"part{args.part}" if not args.only else "only"
    rows = run(cases, out, args.budget_s, args.timeout_s, label)
    write_breakdown(cases, rows, out)
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
