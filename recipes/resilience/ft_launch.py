"""`python -m recipes.resilience.ft_launch ARGS`: nvidia-resiliency-ext's ft_launcher (torchrun's arguments plus
its --ft-* ones), as the job scripts start it with resilience.in_job_restarts.

One difference: Slurm's and Grid Engine's warning before the time limit (SIGUSR1) reaches every process of the
job, ft_launcher included, and SIGUSR1 ends a Python process that does not handle it; the ranks would die with
their launcher before saving. Here it becomes SIGTERM, on which ft_launcher already does the right thing: it
passes SIGTERM to every rank (which checkpoints and exits) and waits for them."""

from __future__ import annotations

import os
import signal
import sys

try:
    from nvidia_resiliency_ext.fault_tolerance import launcher
except ImportError:  # named in one line below; the image or environment lacks the package
    launcher = None

MISSING = (
    "error: resilience.in_job_restarts runs the ranks under nvidia-resiliency-ext's ft_launcher, which this "
    "Python cannot import: install it in the image (pip install nvidia-resiliency-ext; the NeMo containers "
    "have it), or set resilience.in_job_restarts=0"
)


def _time_limit_warning(signum, frame) -> None:
    os.kill(os.getpid(), signal.SIGTERM)


def main() -> int:
    if launcher is None:
        print(MISSING, file=sys.stderr, flush=True)
        return 2
    signal.signal(signal.SIGUSR1, _time_limit_warning)
    sys.argv[0] = "ft_launcher"
    launcher.main()  # exits with its status
    return 0


if __name__ == "__main__":
    sys.exit(main())
