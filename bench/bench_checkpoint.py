"""What a checkpoint save holds training for, synchronous against asynchronous
(training.checkpoint.async_save): each mode is a `python main.py ... cluster=local` run on mock data that saves
every --interval steps; the trainer records every save in RUN/events.jsonl (blocking_s: the time the training
loop waited in the save; complete_s: from the save's start until the checkpoint was complete, renamed from its
partial name). One row per save, then each mode's mean over the saves after the first (the first includes
one-time set-up: the async writer's process, the file system's first directories).

    python bench/bench_checkpoint.py                      # the 8B 16-layer proxy on one GPU
    python bench/bench_checkpoint.py --extra "training.seq_length=4096"

The default case is the issue's proxy: training=llama31/8b training.model.num_layers=16 parallelism=tp1
parallelism.num_gpus=1 (GBS lowered to 8 so that steps are short: a save's cost does not depend on it). One of
its checkpoints is ~59 GiB and two are on disk at once; the script says so before training where they do not fit.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile

REPO = Path(__file__).resolve().parent.parent
PROXY = ["training=llama31/8b", "parallelism=tp1", "parallelism.num_gpus=1"]
# What a checkpoint holds per parameter: bf16 weights, and the optimizer's fp32 main weights and two Adam moments.
CHECKPOINT_BYTES_PER_PARAMETER = 2 + 3 * 4


def run_mode(mode: str, args, results: Path) -> list[dict]:
    cmd = [sys.executable, str(REPO / "main.py"), *overrides(args, mode, results)]
    print("$", " ".join(shlex.quote(c) for c in cmd), flush=True)
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    (results / f"ckpt_{mode}.out").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise SystemExit(
            f"{mode}: main.py failed ({proc.returncode}); its output: {results / f'ckpt_{mode}.out'}\n"
            + (proc.stdout + proc.stderr)[-3000:]
        )
    events = results / f"ckpt_{mode}" / "events.jsonl"
    return [e for e in map(json.loads, events.read_text().splitlines()) if e["event"] == "checkpoint"]


def overrides(args, mode: str, results: Path) -> list[str]:
    return [
        *PROXY,
        f"training.model.num_layers={args.layers}",
        "cluster=local",
        f"training.global_batch_size={args.gbs}",
        f"training.train_steps={args.steps}",
        "training.val_interval=0",
        f"training.checkpoint.interval={args.interval}",
        "training.checkpoint.save_at_end=false",
        "training.checkpoint.keep_last=1",  # on disk at once: the last one and the one being written
        "training.data.mock=true",
        "telemetry.enabled=false",
        "logging.tensorboard=false",
        f"training.checkpoint.async_save={mode == 'async'}",
        f"results_dir={results}",
        f"run_name=ckpt_{mode}",
        *shlex.split(args.extra),
    ]


def checkpoint_bytes(args, results: Path) -> int:
    """One checkpoint's size, from the plan's parameter count (a dry run)."""
    cmd = [sys.executable, str(REPO / "main.py"), *overrides(args, "plan", results), "dry_run=true"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"the plan refused the proxy:\n{(proc.stdout + proc.stderr)[-3000:]}")
    plan = json.loads((results / "ckpt_plan" / "plan.json").read_text())
    return plan["num_parameters"] * CHECKPOINT_BYTES_PER_PARAMETER


def check_free_space(args, results: Path) -> int:
    """Two checkpoints are on disk at once (keep_last=1 and the save being written): fail in one line before any
    training when the file system cannot hold them."""
    size = checkpoint_bytes(args, results)
    free = shutil.disk_usage(results).free
    if free < 2 * size:
        raise SystemExit(
            f"error: {results} has {free / 2**30:.0f} GiB free; two checkpoints of the {args.layers}-layer proxy "
            f"need {2 * size / 2**30:.0f} GiB (pass --results DIR on a larger file system, or fewer --layers)"
        )
    return size


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=16, help="layers of the 8B model (default: the 16 of the proxy)")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--interval", type=int, default=4)
    parser.add_argument("--gbs", type=int, default=8)
    parser.add_argument("--extra", default="", help="more overrides for both runs")
    parser.add_argument(
        "--results",
        type=Path,
        help="where the runs write (default: a temporary directory); each mode's checkpoints are removed after it",
    )
    args = parser.parse_args()
    results = args.results or Path(tempfile.mkdtemp(prefix="bench_checkpoint_"))
    results.mkdir(parents=True, exist_ok=True)
    size = check_free_space(args, results)
    rows = {}
    for mode in ("sync", "async"):
        rows[mode] = run_mode(mode, args, results)
        shutil.rmtree(results / f"ckpt_{mode}" / "checkpoints")  # room for the next mode's
    print(
        f"\ncheckpoint saves of the 8B {args.layers}-layer proxy on 1 GPU "
        f"({' '.join(shlex.split(args.extra)) or 'defaults'}); one checkpoint ~{size / 2**30:.1f} GiB"
    )
    print(f"{'mode':<6} {'step':>5} {'blocking s':>11} {'complete s':>11}")
    for mode, saves in rows.items():
        for save in saves:
            print(f"{mode:<6} {save['step']:>5} {save['blocking_s']:>11.2f} {save['complete_s']:>11.2f}")
    print(f"\n{'mode':<6} {'saves':>5} {'mean blocking s':>16} {'mean complete s':>16}   (saves after the first)")
    for mode, saves in rows.items():
        later = saves[1:] or saves
        print(
            f"{mode:<6} {len(saves):>5} {statistics.mean(s['blocking_s'] for s in later):>16.2f} "
            f"{statistics.mean(s['complete_s'] for s in later):>16.2f}"
        )
    print(f"run directories and logs: {results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
