"""The loss of evaluation.blends from a run's newest complete checkpoint, run on every rank of the training job's
shape: `python -m recipes.evaluate --run-dir RUN_DIR` (the evaluation stage's eval_loss job).

Reads RUN_DIR/config.yaml and RUN_DIR/plan.json, builds the model at the run's layout, loads the checkpoint's
weights, evaluates each blend as the trainer validates (recipes/trainer/heldout.py), and writes
RUN_DIR/evaluation/blends.jsonl."""

from __future__ import annotations

import sys

from recipes.entry import checked_run_dir


def main(argv: list[str] | None = None) -> int:
    run_dir = checked_run_dir(__doc__, argv)
    from recipes.trainer.heldout import run_loss

    return run_loss(run_dir)


if __name__ == "__main__":  # dist_checkpointing starts a multiprocessing manager: the guard is required
    sys.exit(main())
