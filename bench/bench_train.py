"""Training throughput on this machine's GPUs: each case is a `python main.py ... cluster=local` run on mock data;
one table row per case with the step time (mean over the last steps), tokens/s/GPU, MFU against the bf16 and the
fp8 peak, the ratio to NVIDIA's published H100 row for the model and dtype (conf/perf/nvidia_h100.yaml, its MFU
recomputed with the same FLOPs formula), and peak memory.

    python bench/bench_train.py --model llama31/8b --gpus 2 --gbs 32 --steps 12 --window 6 \\
        --case dp2-bf16 "parallelism=tp1 dtype=bf16" --case dp2-fp8 "parallelism=tp1 dtype=fp8"

`--repeat N` runs the cases N times interleaved (A B C, A B C, ...: drift in clocks or temperature hits every case
alike) and adds a table of medians: per case the median step time and tokens/s/GPU over its N runs, their min-max
spread and the change against the first case (the defaults, say). Runs are named CASE-r1 ... CASE-rN; a run
directory that already holds metrics (from an earlier invocation with the same --results) is read, not run again,
so a measurement cut short by --budget-s goes on where it stopped when the same command runs again; where the run
directories are gone (a machine given back in between), --previous names the --json files that earlier invocations
wrote (after every run) and their finished runs count.

`--profile` traces step 4 of every run with the torch profiler (before a timing window of the last 6 of 12
steps, so the profiler's overhead stays out of it) and prints, per run, the bench/bench_kernels.py command that puts
each kernel class of that step (communication and what of it is exposed included) beside its ceiling on this GPU.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from common.plan import Plan  # noqa: E402
from common.run import trace_path  # noqa: E402
from launcher.autoconf.perfdata import Reference, nvidia_reference, training_model  # noqa: E402
from launcher.plan.hardware import gpu_spec  # noqa: E402
from launcher.plan.table import layout  # noqa: E402
from launcher.report import telemetry  # noqa: E402
from launcher.report.throughput import RunInfo, StepRecord, read_metrics, summarize  # noqa: E402

PROFILED_STEP = 4
PROFILE = ["profile.enabled=true", "profile.tool=torch", f"profile.start_step={PROFILED_STEP}",
           f"profile.end_step={PROFILED_STEP + 1}"]  # fmt: skip
# Transformer Engine's fused MLP, as the plan lets it run: its weights skip the overlapped parameter gather's hooks
# (on one rank too, launcher/plan/checks/precision.py), so the gather runs after the optimizer step.
OP_FUSER = ["dtype.te_op_fuser=true", "parallelism.overlap_param_gather=false"]


def run_case(name: str, overrides: list[str], args, results: Path, timeout: float | None = None) -> dict:
    """One case as its own main.py run; `timeout` seconds: the run's whole process group is killed after it (a
    hung rank otherwise holds the GPU for the cases after it)."""
    cmd = [
        sys.executable,
        str(REPO / "main.py"),
        f"training={args.model}",
        "cluster=local",
        f"parallelism.num_gpus={args.gpus}",
        f"training.global_batch_size={args.gbs}",
        f"training.train_steps={args.steps}",
        "training.val_interval=0",
        "training.checkpoint.interval=0",
        "training.checkpoint.save_at_end=false",
        "training.data.mock=true",
        f"results_dir={results}",
        f"run_name={name}",
        *overrides,
    ]
    print("$", " ".join(shlex.quote(c) for c in cmd), flush=True)
    proc = subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
        status = f"exit {proc.returncode}"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        status = f"killed after {timeout:.0f} s"
    log = results / f"{name}.out"
    log.write_text(output)
    run_dir = results / name
    metrics_file = run_dir / "metrics.jsonl"
    if proc.returncode != 0 or not metrics_file.exists():
        print(f"case {name} failed ({status}); log {log}\n{output[-3000:]}", flush=True)
        return {"case": name, "error": status}
    return table_row(name, run_dir, args.window)


def table_row(name: str, run_dir: Path, window: int) -> dict:
    """One row from a finished run directory: step time averaged over the last `window` steps."""
    metrics_file = run_dir / "metrics.jsonl"
    plan = Plan(**json.loads((run_dir / "plan.json").read_text()))
    records = read_metrics(metrics_file)
    gpu = gpu_spec(plan.gpu_type or "h100")
    # MFU against the bf16 peak whatever the dtype, so bf16 and fp8 rows compare.
    info = RunInfo(
        name,
        plan.global_batch_size,
        plan.seq_length,
        plan.num_gpus,
        plan.model_flops_per_sample,
        gpu.bf16_peak_flops,
        f"{gpu.name} bf16",
    )
    first = max(0, len(records) - window)
    report = summarize(info, records, window=(first, len(records)))
    reference = nvidia_reference(plan.model, plan.dtype)
    return {
        "case": name,
        "model": plan.model,
        "layout": f"{layout(plan.tp, plan.pp, plan.cp, plan.vp, plan.dp)} MBS{plan.micro_batch_size}",
        "dtype": plan.dtype,
        "gpus": plan.num_gpus,
        "gpu": plan.gpu_type,  # the card the run found: a measured row records it
        "gbs": plan.global_batch_size,
        "step_time_s": report.step_time_s,
        "tokens_per_s_per_gpu": report.tokens_per_s_per_gpu,
        "mfu_bf16": report.mfu,
        "mfu_fp8": report.mfu * gpu.bf16_peak_flops / gpu.fp8_peak_flops if gpu.fp8_peak_flops else None,
        **_versus(report.mfu, reference),
        "peak_memory_gib": max((r.peak_memory_gib or 0) for r in records),
        "final_loss": records[-1].loss,
        **window_clocks(run_dir, records[first:]),
        "run_dir": str(run_dir),
    }


def window_clocks(run_dir: Path, timed: list[StepRecord]) -> dict:
    """The GPUs' median SM clock and power while the timed steps ran, from the run's telemetry (telemetry.enabled,
    one sample every telemetry.interval_s), and the clock event reasons of those samples with their share: whether
    the steps ran at full clock or under the power cap. None where the run sampled nothing."""
    steps = {r.step for r in timed}
    # A sample's step is the last one finished when it was taken: it fell in the step after.
    samples = [s for s in telemetry.load(run_dir) if not s.activity and s.step is not None and int(s.step) + 1 in steps]
    clocks = [s.sm_clock_mhz for s in samples if s.sm_clock_mhz is not None]
    power = [s.power_w for s in samples if s.power_w is not None]
    reasons: dict[str, int] = {}
    for s in samples:
        for reason in filter(None, s.clock_events.split("+")):
            reasons[reason] = reasons.get(reason, 0) + 1
    return {
        "sm_clock_mhz": statistics.median(clocks) if clocks else None,
        "power_w": statistics.median(power) if power else None,
        "clock_events": ", ".join(f"{r} {n / len(samples):.0%}" for r, n in sorted(reasons.items())) or None,
        "telemetry_samples": len(samples),
    }


def _versus(mfu_bf16: float, reference: Reference | None) -> dict:
    """Our MFU over the published row's (both against the bf16 peak, with the full model's FLOPs for theirs, so a
    layer-count proxy compares per layer shape)."""
    if reference is None:
        return {"nvidia": None, "nvidia_mfu_bf16": None, "vs_nvidia": None}
    theirs = reference.mfu(training_model(reference.model))
    label = (
        f"{reference.model} {reference.dtype}: {reference.tokens_per_s_per_gpu:,.0f} tokens/s/GPU on "
        f"{reference.gpus} {reference.gpu.upper()}, {reference.layout} ({reference.source})"
    )
    return {"nvidia": label, "nvidia_mfu_bf16": theirs, "vs_nvidia": mfu_bf16 / theirs}


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def print_table(rows: list[dict]) -> None:
    header = (
        f"{'case':<22} {'model':<13} {'layout':<28} {'dtype':<5} {'GPUs':>4} {'GBS':>4} {'step s':>8} "
        f"{'tok/s/GPU':>10} {'MFU(bf16)':>9} {'MFU(fp8)':>8} {'vs NVIDIA':>9} {'mem GiB':>8} {'SM MHz':>7} "
        f"{'W':>5}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        if "error" in r:
            print(f"{r['case']:<22} {r['error']}")
            continue
        versus = "-" if r["vs_nvidia"] is None else f"{r['vs_nvidia']:.2f}x"
        print(
            f"{r['case']:<22} {r['model']:<13} {r['layout']:<28} {r['dtype']:<5} {r['gpus']:>4} {r['gbs']:>4} "
            f"{r['step_time_s']:>8.3f} {r['tokens_per_s_per_gpu']:>10,.0f} {_pct(r['mfu_bf16']):>9} "
            f"{_pct(r['mfu_fp8']):>8} {versus:>9} {r['peak_memory_gib']:>8.1f} {_number(r.get('sm_clock_mhz')):>7} "
            f"{_number(r.get('power_w')):>5}"
        )
    events = {r["case"]: r["clock_events"] for r in rows if r.get("clock_events")}
    for case, reasons in events.items():
        print(f"  {case}: clock events in the timed steps' samples: {reasons}")


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def print_references(rows: list[dict]) -> None:
    """The published rows the ratios divide by, each once."""
    seen = dict.fromkeys((r["nvidia"], r["nvidia_mfu_bf16"]) for r in rows if r.get("nvidia"))
    if seen:
        print(
            "vs NVIDIA = MFU / the MFU of NVIDIA's published H100 row for the model and dtype, both against the "
            "bf16 peak and the full model's FLOPs (conf/perf/nvidia_h100.yaml):"
        )
    for label, mfu in seen:
        print(f"  {label}: {mfu * 100:.1f}% MFU (bf16 peak)")


def run_name(case: str, repeat: int, index: int) -> str:
    """One run's directory name: the case itself for a single run, CASE-r<k> for the k-th of several."""
    return case if repeat == 1 else f"{case}-r{index + 1}"


def finished_row(name: str, results: Path, steps: int, window: int) -> dict | None:
    """The row of a run an earlier invocation finished (metrics up to the last step), or None: so a cut-short repeat
    goes on where it stopped instead of running a case again. A run killed halfway is not a result."""
    run_dir = results / name
    metrics = run_dir / "metrics.jsonl"
    if not (metrics.exists() and (run_dir / "plan.json").exists()):
        return None
    records = read_metrics(metrics)
    if not records or records[-1].step < steps:
        return None
    return table_row(name, run_dir, window)


@dataclass
class RepeatSummary:
    """One case over its runs: medians, the min-max spread of tokens/s/GPU and the change against the first case."""

    case: str
    runs: int  # runs with a result
    failed: int
    step_time_s: float | None = None  # median
    tokens_per_s_per_gpu: float | None = None  # median
    tokens_min: float | None = None
    tokens_max: float | None = None
    mfu_bf16: float | None = None  # median
    vs_first: float | None = None  # median tokens/s over the first case's, minus 1
    sm_clock_mhz: float | None = None  # median of the runs' timed-step medians
    power_w: float | None = None

    @property
    def spread(self) -> float | None:
        """(max - min) / median of tokens/s/GPU: how far apart the runs of this case are."""
        if self.tokens_per_s_per_gpu is None or self.tokens_min is None or self.tokens_max is None:
            return None
        return (self.tokens_max - self.tokens_min) / self.tokens_per_s_per_gpu


def summarize_case(case: str, rows: list[dict]) -> RepeatSummary:
    """Medians over a case's runs; failed runs are counted, not averaged."""
    good = [r for r in rows if "error" not in r]
    summary = RepeatSummary(case, len(good), len(rows) - len(good))
    if good:
        tokens = [r["tokens_per_s_per_gpu"] for r in good]
        summary.step_time_s = statistics.median(r["step_time_s"] for r in good)
        summary.tokens_per_s_per_gpu = statistics.median(tokens)
        summary.tokens_min, summary.tokens_max = min(tokens), max(tokens)
        summary.mfu_bf16 = statistics.median(r["mfu_bf16"] for r in good)
        summary.sm_clock_mhz = _median_of(good, "sm_clock_mhz")
        summary.power_w = _median_of(good, "power_w")
    return summary


def _median_of(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(values) if values else None


def summarize_repeats(cases: list[str], rows: list[dict]) -> list[RepeatSummary]:
    """One summary per case in the given order, each against the first case's median tokens/s/GPU (rows carry
    `base_case`, their case's name without the run suffix)."""
    summaries = [summarize_case(c, [r for r in rows if r.get("base_case", r["case"]) == c]) for c in cases]
    first = summaries[0].tokens_per_s_per_gpu if summaries else None
    for s in summaries:
        if first and s.tokens_per_s_per_gpu is not None:
            s.vs_first = s.tokens_per_s_per_gpu / first - 1
    return summaries


def format_repeats(summaries: list[RepeatSummary], repeat: int) -> str:
    header = (
        f"{'case':<26} {'runs':>5} {'step s':>8} {'tok/s/GPU':>10} {'min-max':>15} {'spread':>7} "
        f"{'MFU(bf16)':>9} {'vs first':>9} {'SM MHz':>7} {'W':>5}"
    )
    lines = [f"median of {repeat} interleaved runs per case; vs first: against {summaries[0].case}", header]
    lines.append("-" * len(header))
    for s in summaries:
        runs = f"{s.runs}/{s.runs + s.failed}"
        if s.tokens_per_s_per_gpu is None or s.step_time_s is None:
            lines.append(f"{s.case:<26} {runs:>5} no run finished")
            continue
        span = f"{s.tokens_min:,.0f}-{s.tokens_max:,.0f}"
        versus = "-" if s.vs_first is None else f"{s.vs_first * 100:+.1f}%"
        lines.append(
            f"{s.case:<26} {runs:>5} {s.step_time_s:>8.3f} {s.tokens_per_s_per_gpu:>10,.0f} {span:>15} "
            f"{_pct(s.spread):>7} {_pct(s.mfu_bf16):>9} {versus:>9} {_number(s.sm_clock_mhz):>7} "
            f"{_number(s.power_w):>5}"
        )
    return "\n".join(lines)


def read_previous(paths: list[str]) -> dict[str, dict]:
    """Finished runs of earlier invocations by run name, from their --json files (a list of rows, or with --repeat
    {"runs": [...], ...}): a machine that went back between invocations took the run directories with it, not the
    rows the earlier invocation brought back."""
    done: dict[str, dict] = {}
    for path in paths:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as err:
            raise SystemExit(f"--previous {path}: not a bench_train.py --json file ({err})") from None
        rows = data["runs"] if isinstance(data, dict) and "runs" in data else data
        if not isinstance(rows, list):
            raise SystemExit(f"--previous {path}: not a bench_train.py --json file (no rows)")
        done.update({r["case"]: r for r in rows if isinstance(r, dict) and "case" in r and "error" not in r})
    return done


def run_repeats(
    args, results: Path, previous: dict[str, dict] | None = None, save: Callable[[list[dict]], None] | None = None
) -> tuple[list[dict], list[str]]:
    """Every case args.repeat times, interleaved; a run already finished (a run directory with its metrics, or a
    row of `previous`) is read back; no run starts once --budget-s would be passed by it (its length guessed from
    the longest run so far). `save` gets the rows after every run, so a command killed halfway leaves them. Returns
    the rows and the runs left for a later invocation."""
    start = time.monotonic()
    longest = 0.0
    rows: list[dict] = []
    left: list[str] = []
    for index in range(args.repeat):
        for case, overrides in args.case:
            name = run_name(case, args.repeat, index)
            row = (previous or {}).get(name)
            # A single run keeps the old behaviour (main.py decides about an existing run directory).
            if row is None and args.repeat > 1:
                row = finished_row(name, results, args.steps, args.window)
            if row is None:
                if args.budget_s and time.monotonic() - start + longest > args.budget_s:
                    left.append(name)
                    continue
                began = time.monotonic()
                row = run_case(name, shlex.split(overrides), args, results, timeout=args.timeout_s)
                longest = max(longest, time.monotonic() - began)
            row["base_case"] = case
            rows.append(row)
            print_table(rows[-1:])
            if save:
                save(rows)
    return rows, left


def print_join_commands(rows: list[dict], results: Path) -> None:
    """--profile: per finished run, the command that joins its trace with the kernels' ceilings."""
    print()
    for row in [r for r in rows if "error" not in r]:
        trace = trace_path(str(results / row["case"]), 0, PROFILED_STEP, PROFILED_STEP)
        print(f"{row['case']}: python bench/bench_kernels.py --trace {trace}")


def json_output(rows: list[dict], cases: list[str], repeat: int) -> dict | list:
    """--json: the rows as before for single runs; with --repeat the runs and the medians."""
    if repeat == 1:
        return rows
    return {"runs": rows, "medians": [{**vars(s), "spread": s.spread} for s in summarize_repeats(cases, rows)]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="llama31/8b")
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--gbs", type=int, default=32)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--window", type=int, default=6, help="average the step time over the last N steps")
    parser.add_argument(
        "--case",
        nargs=2,
        action="append",
        metavar=("NAME", "OVERRIDES"),
        required=True,
        help="a name and space-separated Hydra overrides; repeat for more cases",
    )
    parser.add_argument(
        "--only",
        action="append",
        metavar="NAME",
        help="run only this case beside the first (repeat for more): halves of a list on two GPU sets of one host",
    )
    parser.add_argument("--results", default=None, help="where run directories go (default: a temp dir)")
    parser.add_argument("--json", default=None, help="also write the rows (and with --repeat the medians) here")
    parser.add_argument("--repeat", type=int, default=1, help="run every case N times, interleaved; table of medians")
    parser.add_argument(
        "--budget-s", type=float, default=None, help="start no run that would end past this (the same command goes on)"
    )
    parser.add_argument("--timeout-s", type=float, default=None, help="kill a run's process group after this")
    parser.add_argument("--profile", action="store_true", help=f"trace step {PROFILED_STEP} of every run")
    parser.add_argument(
        "--previous", nargs="+", default=None, help="--json files of earlier invocations: their finished runs count"
    )
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error(f"--repeat {args.repeat}: give 1 or more runs per case")
    names = [case for case, _ in args.case]
    if len(set(names)) != len(names):
        parser.error(f"case names repeat ({', '.join(names)}): give each --case its own name")
    unknown = sorted(set(args.only or []) - set(names))
    if unknown:
        parser.error(f"--only {', '.join(unknown)}: not a case (one of {', '.join(names)})")
    if args.only:
        args.case = [case for case in args.case if case[0] == names[0] or case[0] in args.only]
        names = [case for case, _ in args.case]
    if args.profile:
        if args.window > args.steps - PROFILED_STEP:
            parser.error(f"--profile traces step {PROFILED_STEP}: --window {args.window} would time it")
        args.case = [(name, f"{overrides} {' '.join(PROFILE)}") for name, overrides in args.case]
    results = Path(args.results or tempfile.mkdtemp(prefix="bench_train_"))
    results.mkdir(parents=True, exist_ok=True)
    previous = read_previous(args.previous or [])

    def save(rows: list[dict]) -> None:
        if args.json:
            Path(args.json).write_text(json.dumps(json_output(rows, names, args.repeat), indent=1))

    rows, left = run_repeats(args, results, previous, save)
    print()
    print_table(rows)
    print_references(rows)
    if args.repeat > 1:
        print()
        print(format_repeats(summarize_repeats(names, rows), args.repeat))
    if args.profile:
        print_join_commands(rows, results)
    if left:
        print(
            f"\nnot run within --budget-s {args.budget_s:.0f}: {', '.join(left)}; run the same command again (with "
            "--previous and this --json file where the run directories are gone) to go on"
        )
    save(rows)


if __name__ == "__main__":
    main()
