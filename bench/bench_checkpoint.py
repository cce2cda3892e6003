"""What a checkpoint save holds training for, synchronous against asynchronous
(training.checkpoint.async_save): each mode is a `python main.py ... cluster=local` run on mock data that saves
every --interval steps; the trainer records every save in RUN/events.jsonl (blocking_s: the time the training
loop waited in the save; complete_s: from the save's start until the checkpoint was complete, renamed from its
partial name). One row per save, then each mode's mean over the saves after the first (the first includes
one-time set-up: the async writer's process, the file system's first directories).

    python bench/bench_checkpoint.py                      # the 8B 16-layer proxy on one GPU
    python bench/bench_checkpoint.py --extra "training.seq_length=4096"

The default case is the issue's proxy: training=llama31/8b training.model.num_layers=16 parallelism=tp1
parallelism.num_gpus=1 (GBS lowered to 8 so that steps are short: a save's cost does not depend on it).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
import shlex
import statistics
import subprocess
import sys
import tempfile

REPO = Path(__file__).resolve().parent.parent
PROXY = ["training=llama31/8b", "training.model.num_layers=16", "parallelism=tp1", "parallelism.num_gpus=1"]


def run_mode(mode: str, args, results: Path) -> list[dict]:
    cmd = [
        sys.executable,
        str(REPO / "main.py"),
        *PROXY,
        "cluster=local",
        f"training.global_batch_size={args.gbs}",
        f"training.train_steps={args.steps}",
        "training.val_interval=0",
        f"training.checkpoint.interval={args.interval}",
        "training.checkpoint.save_at_end=false",
        "training.checkpoint.keep_last=2",
        "training.data.mock=true",
        "telemetry.enabled=false",
        "logging.tensorboard=false",
        f"training.checkpoint.async_save={mode == 'async'}",
        f"results_dir={results}",
        f"run_name=ckpt_{mode}",
        *shlex.split(args.extra),
    ]
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--interval", type=int, default=4)
    parser.add_argument("--gbs", type=int, default=8)
    parser.add_argument("--extra", default="", help="more overrides for both runs")
    parser.add_argument("--keep", type=Path, help="keep the run directories here (default: a temporary directory)")
    args = parser.parse_args()
    results = args.keep or Path(tempfile.mkdtemp(prefix="bench_checkpoint_"))
    rows = {mode: run_mode(mode, args, results) for mode in ("sync", "async")}
    size = sum(f.stat().st_size for f in (results / "ckpt_sync" / "checkpoints").rglob("*") if f.is_file())
    print(
        f"\ncheckpoint saves of the 8B 16-layer proxy on 1 GPU ({' '.join(shlex.split(args.extra)) or 'defaults'}); "
        f"{len(list((results / 'ckpt_sync' / 'checkpoints').glob('iter_*')))} checkpoints kept, "
        f"{size / 2**30:.1f} GiB on disk"
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
