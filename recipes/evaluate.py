"""The loss of evaluation.blends from a run's newest complete checkpoint, run on every rank of the training job's
shape: `python -m recipes.evaluate --run-dir RUN_DIR` (the evaluation stage's eval_loss job).

Reads RUN_DIR/config.yaml and RUN_DIR/plan.json, builds the model at the run's layout, loads the checkpoint's
weights, evaluates each blend as the trainer validates (recipes/trainer/heldout.py), and writes
RUN_DIR/evaluation/blends.jsonl."""

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
    from recipes.trainer.heldout import run_loss

    return run_loss(run_dir)


if __name__ == "__main__":  # dist_checkpointing starts a multiprocessing manager: the guard is required
    sys.exit(main())
