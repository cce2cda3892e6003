"""Sweeps (`python main.py -m a=1,2 b=x,y`): a unique run name per point, and every point checked before the
first one is submitted."""

from __future__ import annotations

import hashlib
import re
from typing import TYPE_CHECKING, Iterable, Sequence

if TYPE_CHECKING:  # Hydra's parser loads when first used: is_sweep answers without it
    from hydra.core.override_parser.types import Override

# Hydra's own flags that take a value in the next argument.
_FLAGS_WITH_VALUE = {
    "-cp",
    "--config-path",
    "-cn",
    "--config-name",
    "-cd",
    "--config-dir",
    "--experimental-rerun",
    "-p",
    "--package",
    "-i",
    "--info",
}
MAX_SUFFIX = 80
# Hydra's flags that print something instead of running: with -m too, Hydra itself answers them.
_HYDRA_ONLY = {
    "--cfg",
    "-c",
    "--help",
    "-h",
    "--hydra-help",
    "--info",
    "-i",
    "--shell-completion",
    "-sc",
    "--resolve",
    "-cp",
    "--config-path",
    "-cn",
    "--config-name",
    "-cd",
    "--config-dir",
}


def is_sweep(argv: Sequence[str]) -> bool:
    """`python main.py -m ...`, which main.py plans and runs itself (launcher.cli.run_sweep)."""
    return any(arg in ("-m", "--multirun") for arg in argv) and not any(arg in _HYDRA_ONLY for arg in argv)


def uses_hydra_flags(argv: Sequence[str]) -> bool:
    """A command line with any of Hydra's own flags, which Hydra's app handles; overrides alone main.py composes
    itself."""
    return any(arg.startswith("-") for arg in argv)


def cli_overrides(argv: Sequence[str]) -> list[str]:
    """The override arguments of a main.py command line (no flags)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg.startswith("-"):
            skip = arg in _FLAGS_WITH_VALUE
        else:
            out.append(arg)
    return out


def parse(overrides: Sequence[str]) -> list[Override]:
    """The overrides as Hydra's command-line parser reads them."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create().parse_overrides(list(overrides))


def swept_keys(overrides: Sequence[str]) -> list[str]:
    """Keys given several values (`dtype=bf16,fp8`): the ones that tell sweep points apart. The auto-configurator's
    own keys (parallelism.auto.pick=0,1,2) are not among them: they pick layouts, whose names are in the run name."""
    keys = [o.get_key_element() for o in parse(overrides) if o.is_sweep_override()]
    return [k for k in keys if not k.lstrip("+~").startswith("parallelism.auto.")]


def sweep_points(overrides: Sequence[str]) -> list[list[str]]:
    """Every point of the sweep as its own override list, in the order Hydra's basic sweeper runs them."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    batches = BasicSweeper.split_arguments(parse(overrides), None)
    return [point for batch in batches for point in batch]


def _key(override: str) -> str:
    return override.split("=", 1)[0]


def swept_items(point: Iterable[str], keys: Iterable[str]) -> list[str]:
    """The overrides of this point whose key is swept."""
    keys = set(keys)
    return [o for o in point if _key(o) in keys]


def run_name_suffix(point: Iterable[str], keys: Iterable[str]) -> str:
    """`__key=value` for each swept key of this point, path-safe; a short hash when that gets long."""
    items = swept_items(point, keys)
    if not items:
        return ""
    text = "__".join(re.sub(r"[^A-Za-z0-9._=+-]", "-", o.lstrip("+~")) for o in items)
    if len(text) > MAX_SUFFIX:
        text = "sweep-" + hashlib.sha1("\n".join(items).encode()).hexdigest()[:10]
    return "__" + text
