"""Training entry, run on every rank: `python -m recipes.train --run-dir RUN_DIR`.

Reads RUN_DIR/config.yaml and RUN_DIR/plan.json (written by the launcher), trains, and writes
RUN_DIR/metrics.jsonl and RUN_DIR/checkpoints/. Resumes from the newest complete checkpoint; checkpoints and
exits cleanly on SIGTERM/SIGUSR1 (Slurm's warning before the time limit)."""

from __future__ import annotations

import sys
import time

from recipes.entry import checked_run_dir


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()  # before the stack check's imports: the start-up line's first phase
    run_dir = checked_run_dir(__doc__, argv)
    # The trainer's modules import torch and megatron-core (and through it Transformer Engine) at their top: only
    # once the check accepted them, so that a mismatch is its one line rather than an import error.
    from recipes.trainer import build

    return build.run(run_dir, started)


if __name__ == "__main__":  # dist_checkpointing starts a multiprocessing manager: the guard is required
    sys.exit(main())
