"""Training entry, run on every rank: `python -m recipes.train --run-dir RUN_DIR`.

Reads RUN_DIR/config.yaml and RUN_DIR/plan.json (written by the launcher), trains, and writes
RUN_DIR/metrics.jsonl and RUN_DIR/checkpoints/. Resumes from the newest complete checkpoint; checkpoints and
exits cleanly on SIGTERM/SIGUSR1 (Slurm's warning before the time limit)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

from common import stack
from recipes.runtime import ranks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", required=True, help="run directory holding config.yaml and plan.json")
    args = parser.parse_args(argv)
    run_dir = os.path.abspath(args.run_dir)
    ranks.die_with_torchrun()
    # Before megatron is imported, which the stack check does: megatron looks for apex's kernel at import.
    with contextlib.suppress(ImportError):  # no torch: the check names it
        from recipes.trainer import wgrad_fallback

        wgrad_fallback.install()
    info = ranks.rank_info()
    stack.check_run(run_dir, info.rank, info.local_rank)  # exits 2 with one line when the stack does not match
    # The trainer's modules import torch and megatron-core (and through it Transformer Engine) at their top: only
    # once the check accepted them, so that a mismatch is its one line rather than an import error.
    from recipes.trainer import build

    return build.run(run_dir)


if __name__ == "__main__":  # dist_checkpointing starts a multiprocessing manager: the guard is required
    sys.exit(main())
