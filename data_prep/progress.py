"""tqdm bars that suit both a terminal and a Slurm log file."""

from __future__ import annotations

import sys

from tqdm import tqdm

# tqdm's monitor thread only tunes redraw frequency; without it the process stays single-threaded, which keeps
# forking tokenizer workers safe.
tqdm.monitor_interval = 0


def progress_bar(**kwargs) -> tqdm:
    """A tqdm bar on stderr. In a log file (not a terminal) it writes a line a minute instead of redrawing
    several times a second, so Slurm logs stay readable."""
    interactive = sys.stderr.isatty()
    kwargs.setdefault("mininterval", 0.5 if interactive else 60.0)
    kwargs.setdefault("maxinterval", 10.0 if interactive else 120.0)
    kwargs.setdefault("dynamic_ncols", interactive)
    kwargs.setdefault("file", sys.stderr)
    return tqdm(**kwargs)


def human(n: float) -> str:
    """12345678 -> '12.3M'."""
    for unit in ("", "k", "M", "G", "T"):
        if abs(n) < 1000 or unit == "T":
            return f"{n:.0f}{unit}" if unit == "" else f"{n:.1f}{unit}"
        n /= 1000.0
    return f"{n:.1f}T"
