"""What `python main.py --help` prints, and main.py's one line when the interpreter lacks the project's packages.
Standard library only: both answer before Hydra is imported (its own --help composes every config group)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
HELP_FLAGS = {"-h", "--help"}
# The config groups a user picks options of (the others are chosen by these: userbuffers by the layouts).
GROUPS = ("training", "dtype", "parallelism", "cluster", "data_preparation", "resilience")

USAGE = """\
usage: python main.py [-m] [--config-dir DIR] [group=option ...] [key=value ...]

Composes the typed config, checks it and derives the plan, writes the run directory
(results/<run>/: config.yaml, plan.json, the stages' jobs), then runs the jobs on this machine
(cluster=local) or submits them (dry_run=true: writes only). Nothing is written when a value is wrong.

config groups (group=option):
{groups}

examples:
  python main.py                                                   the tiny model on this machine's GPU
  python main.py training=llama31/8b cluster=bcm dry_run=true      an sbatch script, not submitted
  python main.py -m training=llama31/8b cluster=bcm training.global_batch_size=64,128 dry_run=true   a sweep
  python main.py --config-dir site cluster=mysite                  a site's own option, site/cluster/mysite.yaml

Every key with its type, range and default: docs/configuration-reference.md. Hydra's own options: --hydra-help."""


def usage(config_dirs: Sequence[Path] = ()) -> str:
    width = max(len(group) for group in GROUPS)
    lines = [f"  {group:<{width}}  {', '.join(group_options(group, config_dirs))}" for group in GROUPS]
    return USAGE.format(groups="\n".join(lines))


def group_options(group: str, config_dirs: Sequence[Path] = ()) -> list[str]:
    """A group's selectable options in conf/ and the --config-dir directories (not _private.yaml files)."""
    found = set()
    for root in [CONF_DIR, *config_dirs]:
        for path in (Path(root) / group).rglob("*.yaml"):
            relative = path.relative_to(Path(root) / group)
            if not any(part.startswith("_") for part in relative.parts):
                found.add(relative.with_suffix("").as_posix())
    return sorted(found)


def config_dirs_of(argv: Sequence[str]) -> list[Path]:
    """The directories `--config-dir DIR` (`-cd DIR`, `--config-dir=DIR`) adds to the config search path."""
    dirs = []
    for index, arg in enumerate(argv):
        if arg in ("--config-dir", "-cd") and index + 1 < len(argv):
            dirs.append(argv[index + 1])
        elif arg.startswith("--config-dir="):
            dirs.append(arg.partition("=")[2])
    return [Path(d).expanduser().absolute() for d in dirs]


def missing_packages_line(err: ImportError, python: str) -> str:
    """An interpreter without the project's packages (a system python3 outside .venv): what to run instead."""
    return (
        f"error: {python} cannot import {err.name or err}, which main.py needs: run it in the project's "
        "environment, bash dev.sh python main.py ... (or .venv/bin/python main.py ... once dev.sh prepared .venv)"
    )
