"""Training throughput on this machine's GPUs: each case is a `python main.py ... cluster=local` run on mock data;
one table row per case with the step time (mean over the last steps), tokens/s/GPU, MFU against the bf16 and the
fp8 peak, the ratio to NVIDIA's published H100 row for the model and dtype (conf/perf/nvidia_h100.yaml, its MFU
recomputed with the same FLOPs formula), and peak memory.

    python bench/bench_train.py --model llama31/8b --gpus 2 --gbs 32 --steps 12 --window 6 \\
        --case dp2-bf16 "parallelism=tp1 dtype=bf16" --case dp2-fp8 "parallelism=tp1 dtype=fp8"
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
import shlex
import signal
import subprocess
import sys
import tempfile

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from common.plan import Plan  # noqa: E402
from launcher.autoconf.perfdata import Reference, nvidia_reference, training_model  # noqa: E402
from launcher.plan.hardware import gpu_spec  # noqa: E402
from launcher.plan.table import layout  # noqa: E402
from launcher.report.throughput import RunInfo, read_metrics, summarize  # noqa: E402


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
    report = summarize(info, records, window=(max(0, len(records) - window), len(records)))
    reference = nvidia_reference(plan.model, plan.dtype)
    return {
        "case": name,
        "model": plan.model,
        "layout": f"{layout(plan.tp, plan.pp, plan.cp, plan.vp, plan.dp)} MBS{plan.micro_batch_size}",
        "dtype": plan.dtype,
        "gpus": plan.num_gpus,
        "gbs": plan.global_batch_size,
        "step_time_s": report.step_time_s,
        "tokens_per_s_per_gpu": report.tokens_per_s_per_gpu,
        "mfu_bf16": report.mfu,
        "mfu_fp8": report.mfu * gpu.bf16_peak_flops / gpu.fp8_peak_flops if gpu.fp8_peak_flops else None,
        **_versus(report.mfu, reference),
        "peak_memory_gib": max((r.peak_memory_gib or 0) for r in records),
        "final_loss": records[-1].loss,
        "run_dir": str(run_dir),
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
        f"{'tok/s/GPU':>10} {'MFU(bf16)':>9} {'MFU(fp8)':>8} {'vs NVIDIA':>9} {'mem GiB':>8}"
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
            f"{_pct(r['mfu_fp8']):>8} {versus:>9} {r['peak_memory_gib']:>8.1f}"
        )


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


def main() -> None:
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
    parser.add_argument("--results", default=None, help="where run directories go (default: a temp dir)")
    parser.add_argument("--json", default=None, help="also write the rows to this JSON file")
    args = parser.parse_args()
    results = Path(args.results or tempfile.mkdtemp(prefix="bench_train_"))
    results.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, overrides in args.case:
        rows.append(run_case(name, shlex.split(overrides), args, results))
        print_table(rows[-1:])
    print()
    print_table(rows)
    print_references(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
