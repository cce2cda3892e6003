"""Throughput report: step time over a late window, tokens/s, tokens/s/GPU, TFLOPS/GPU, MFU (naming the peak)
and days to train 1T tokens, for run directories or bare training logs (NeMo's progress lines included), plus a
PNG of loss and step time per run.

    python -m launcher.report results/RUN_A results/RUN_B
    python -m launcher.report --rank results/llama31_8b_bf16_*      # fastest first, beside the model's prediction
    python -m launcher.report nemo.log --gbs 128 --seq 8192 --gpus 64 --model llama31/70b --peak fp8
    python -m launcher.report --compare results/RUN_A results/RUN_B   # evaluation rows side by side
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from launcher.report import evaluation, mlperf, resilience, telemetry
from launcher.report.throughput import default_plot_path, format_table, load, mfu_warnings, plot, summarize


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m launcher.report", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("paths", nargs="+", type=Path, help="run directories and/or training log files")
    p.add_argument(
        "--window",
        help="positions START:END (half-open) of the logged steps to average; "
        "default: 70%%..90%% of the run (35:45 of 50)",
    )
    p.add_argument(
        "--rank",
        action="store_true",
        help="also rank the runs, fastest first, beside the step-time model's prediction for each (run directories)",
    )
    p.add_argument(
        "--compare",
        action="store_true",
        help="print the runs' evaluation rows (the evaluation stage's) side by side, one column per run directory",
    )
    p.add_argument(
        "--plot",
        type=Path,
        help="PNG to write (default: RUN_DIR/report.png for one run directory, "
        "LOG_DIR/LOG_report.png beside a bare log, else ./report.png); the MLPerf and telemetry plots go beside it, "
        "named after it (PLOT_mlperf.png, PLOT_telemetry.png)",
    )
    bare = p.add_argument_group("for log files without a run directory")
    bare.add_argument("--plan", help="a plan.json to take the sizes from")
    bare.add_argument("--gbs", type=int, help="global batch size")
    bare.add_argument("--seq", type=int, help="sequence length")
    bare.add_argument("--gpus", type=int, help="number of GPUs")
    bare.add_argument("--model", help="training config for FLOPs per sample, e.g. llama31/70b")
    bare.add_argument("--gpu", default="h100", help="GPU type for the MFU peak (default h100)")
    bare.add_argument(
        "--peak",
        choices=("bf16", "fp8"),
        default="bf16",
        help="which peak MFU divides by (default bf16; compare FP8 runs in tokens/s/GPU)",
    )
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    window = None
    if args.window:
        try:
            a, b = args.window.split(":")
            window = (int(a), int(b))
        except ValueError:
            print(f"error: --window {args.window!r}: use START:END, e.g. 35:45", file=sys.stderr)
            return 2
    if args.compare:
        return compare(args.paths)
    reports, mlperf_runs, evaluated = [], [], []
    try:
        for path in args.paths:
            runs = mlperf.load_runs(path)
            mlperf_runs += runs
            rows = evaluation.rows_of(path)
            if rows:
                evaluated.append((path, rows))
            try:
                info, steps = load(path, args)
                reports.append(summarize(info, steps, window))
            except ValueError as err:
                # An MLPerf log without step timings (mllog.txt) still has its score; an evaluated run (a Hugging
                # Face directory's evaluation, say) its evaluation.
                if not (runs or rows):
                    raise
                print(f"note: no throughput for {path}: {err}")
    except (ValueError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    out = args.plot or default_plot_path(args.paths)
    if reports:
        print(format_table(reports))
        peaks = sorted(
            {
                f"{r.info.peak_label} = {r.info.peak_flops / 1e12:.0f} TFLOP/s per GPU"
                for r in reports
                if r.info.peak_flops
            }
        )
        print(
            "step s: mean over the steps shown; MFU = GBS x model FLOPs per sample / step time / GPUs / peak"
            + (f" ({'; '.join(peaks)})" if peaks else "")
        )
        for line in mfu_warnings(reports):
            print(line)
        if args.rank:
            from launcher.report.ranking import format_ranking  # the step-time model: only --rank needs it

            print(format_ranking(reports, [path if path.is_dir() else None for path in args.paths]))
    if mlperf_runs:
        print("\n" + mlperf.format_section(mlperf_runs))
    for path, rows in evaluated:
        print("\n" + evaluation.format_rows(path, rows))
    try:
        if reports:
            print(f"plot: {plot(reports, out)}")
        if mlperf_runs:
            print(f"plot: {mlperf.plot(mlperf_runs, out.with_name(out.stem + '_mlperf.png'))}")
    except ImportError:  # a training image without matplotlib still gets the table
        print("plot: skipped, matplotlib is not installed")
    run_dirs = [path for path in args.paths if path.is_dir()]
    for path in run_dirs:  # GPU telemetry, restarts and slow GPUs of each run directory that has them
        # With --plot every PNG goes beside it, named after it (as the MLPerf plot does), none into the run.
        beside = f"{out.stem}_{path.name}_telemetry.png" if len(run_dirs) > 1 else f"{out.stem}_telemetry.png"
        telemetry.report(path, png=out.with_name(beside) if args.plot else None)
        resilience.report(path)
    return 0


def compare(paths: Sequence[Path]) -> int:
    """--compare: the evaluation rows of two or more run directories side by side."""
    if len(paths) < 2:
        print("error: --compare needs two or more run directories", file=sys.stderr)
        return 2
    runs = [evaluation.rows_of(path) for path in paths]
    bare = [str(path) for path, rows in zip(paths, runs) if not rows]
    if bare:
        print(
            f"error: --compare: {', '.join(bare)} holds no evaluation rows (evaluation/tasks.jsonl, "
            "evaluation/blends.jsonl): run the evaluation stage there first",
            file=sys.stderr,
        )
        return 2
    print(evaluation.format_compare(list(paths), runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
