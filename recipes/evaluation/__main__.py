"""python -m recipes.evaluation: the evaluation stage's command line.

    python -m recipes.evaluation fetch --tasks lambada_openai,boolq --data-dir DIR [--dry-run]
        the tasks' data into DIR, on a machine with internet (a login node)
    python -m recipes.evaluation harness --run-dir RUN_DIR
        lm-eval on the run's Hugging Face model (the evaluation job, one node)
    python -m recipes.evaluation loss --run-dir RUN_DIR
        every rank of the training job's shape: the loss of evaluation.blends from the newest checkpoint
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    fetch_p = sub.add_parser("fetch", help="download the tasks' data into a directory (needs internet)")
    fetch_p.add_argument("--tasks", required=True, help="comma-separated lm-eval task names")
    fetch_p.add_argument("--data-dir", required=True, help="where to put it (then evaluation.data_dir=DIR)")
    fetch_p.add_argument("--include-path", help="a directory of your own task YAMLs")
    fetch_p.add_argument("--dry-run", action="store_true", help="print what would be fetched; write nothing")
    fetch_p.add_argument("--force", action="store_true", help="fetch tasks already recorded again")
    for name, text in (("harness", "lm-eval on the run's Hugging Face model"), ("loss", "the loss of blends")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--run-dir", required=True, help="run directory holding config.yaml and plan.json")
        if name == "harness":
            p.add_argument("--device", help="lm-eval's device (default: the GPUs)")
    args = parser.parse_args(argv)

    if args.command == "fetch":
        from recipes.evaluation.fetch import FetchError, fetch

        tasks = [t for t in args.tasks.split(",") if t]
        try:
            fetch(tasks, args.data_dir, args.include_path, dry_run=args.dry_run, force=args.force)
        except FetchError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        return 0

    run_dir = os.path.abspath(args.run_dir)
    if args.command == "harness":
        from common.run import load_run_or_exit
        from recipes.evaluation.harness import run_harness
        from recipes.evaluation.tasks import HeldoutError

        try:
            run_harness(load_run_or_exit(run_dir).config, run_dir, device=args.device)
        except HeldoutError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        return 0

    from common import stack
    from recipes.runtime import ranks

    ranks.die_with_torchrun()
    # Before megatron is imported, which the stack check does: megatron looks for apex's kernel at import.
    with contextlib.suppress(ImportError):  # no torch: the check names it
        from recipes.trainer import wgrad_fallback

        wgrad_fallback.install()
    info = ranks.rank_info()
    stack.check_run(run_dir, info.rank, info.local_rank)  # exits 2 with one line when the stack does not match
    from recipes.evaluation.loss import run_loss

    return run_loss(run_dir)


if __name__ == "__main__":  # dist_checkpointing starts a multiprocessing manager: the guard is required
    sys.exit(main())
