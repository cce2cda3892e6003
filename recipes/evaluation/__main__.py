"""python -m recipes.evaluation: the evaluation stage's command line.

    python -m recipes.evaluation fetch --tasks lambada_openai,boolq --data-dir DIR [--dry-run]
        the tasks' data into DIR, on a machine with internet (a login node)
    python -m recipes.evaluation harness --run-dir RUN_DIR
        lm-eval on the run's Hugging Face model (the evaluation job, one node)
(The loss of evaluation.blends, on every rank of the training job's shape, is python -m recipes.evaluate.)
"""

from __future__ import annotations

import argparse
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
    harness_p = sub.add_parser("harness", help="lm-eval on the run's Hugging Face model")
    harness_p.add_argument("--run-dir", required=True, help="run directory holding config.yaml")
    harness_p.add_argument("--device", help="lm-eval's device (default: the GPUs)")
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

    if args.command == "harness":
        run_dir = os.path.abspath(args.run_dir)
        from common.run import load_run_or_exit
        from recipes.evaluation.harness import run_harness
        from recipes.evaluation.tasks import HeldoutError

        try:
            run_harness(load_run_or_exit(run_dir).config, run_dir, device=args.device)
        except HeldoutError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        return 0

    raise AssertionError(args.command)  # argparse accepts no other


if __name__ == "__main__":
    sys.exit(main())
