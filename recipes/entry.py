"""What every rank of a GPU-side entry (recipes.train, recipes.evaluate) does before it imports torch's heavy
users: read --run-dir, die with torchrun, install the weight-gradient fallback, check the stack."""

from __future__ import annotations

import argparse
import contextlib
import os

from common import stack
from recipes.runtime import ranks


def checked_run_dir(description: str | None, argv: list[str] | None) -> str:
    """The run directory of `--run-dir`, absolute, once this rank's stack matched the run's (else exits 2 with
    one line)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", required=True, help="run directory holding config.yaml and plan.json")
    run_dir = os.path.abspath(parser.parse_args(argv).run_dir)
    ranks.die_with_torchrun()
    # Before megatron is imported, which the stack check does: megatron looks for apex's kernel at import.
    with contextlib.suppress(ImportError):  # no torch: the check names it
        from recipes.trainer import wgrad_fallback

        wgrad_fallback.install()
    info = ranks.rank_info()
    stack.check_run(run_dir, info.rank, info.local_rank)
    return run_dir
