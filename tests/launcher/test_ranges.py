"""Every numeric key of the schema declares the values it takes, and the plan refuses a value outside them with one
line naming the key, before any other check (launcher/plan/checks/ranges.py)."""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from typing import Any

import pytest

from common import config as schema
from common.typed import changed, to_plain
from launcher.config.compose import compose
from launcher.plan.checks import ranges
from launcher.plan.errors import PlanError
from launcher.plan.validate import validate

# The compositions that hold every section: each platform's cluster keys, each source's data_preparation keys,
# parallelism=auto's search, MLPerf's rules.
BASES = {
    "default": [],
    "slurm": ["cluster=bcm"],
    "sge": ["cluster=sge"],
    "bcp": ["cluster=bcp"],
    "k8s": ["cluster=k8s"],
    "c4": ["data_preparation=c4"],
    "files": ["data_preparation=files"],
    "sft_jsonl": ["data_preparation=sft_jsonl"],
    "govreport_mlperf": ["data_preparation=govreport_mlperf"],
    "auto": ["training=llama31/8b", "parallelism=auto", "cluster=bcm"],
    "mlperf": ["training=mlperf/llama31_8b"],
    # A list of sections is empty by default: one entry to put the value in.
    "blends": ["evaluation.blends=[{name: val, prefixes: [/data/val_text_document], samples: 8}]"],
}
ROOTS = [
    (schema.Config, "", "default"),
    *[(kind, "cluster.", "default" if name == "local" else name) for name, kind in schema.CLUSTERS.items()],
    *[(kind, "data_preparation.", "default" if name == "pile" else name) for name, kind in schema.DATA_SOURCES.items()],
]


def _unwrap(kind: Any) -> Any:
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    return args[0] if typing.get_origin(kind) is typing.Union and len(args) == 1 else kind


def _leaf(kind: Any) -> Any:
    """The element type under lists and mappings: List[Optional[int]] -> int."""
    kind = _unwrap(kind)
    while typing.get_origin(kind) in (list, dict):
        kind = _unwrap(typing.get_args(kind)[-1])
    return kind


def numeric_keys(kind: type, prefix: str) -> list[tuple[str, dataclasses.Field]]:
    """(path, field) of every numeric key under a schema class; `[0]` stands for a list's first item, `.*` for a
    mapping's first key. The config's cluster and data_preparation sections are walked from each option's class."""
    found = []
    hints = typing.get_type_hints(kind)
    for f in dataclasses.fields(kind):
        if kind is schema.Config and f.name in ("cluster", "data_preparation"):
            continue
        hint, path = _unwrap(hints[f.name]), f"{prefix}{f.name}"
        origin = typing.get_origin(hint)
        path += "[0]" if origin is list else ".*" if origin is dict else ""
        leaf = _leaf(hint)
        if dataclasses.is_dataclass(leaf):
            found += numeric_keys(leaf, f"{path}.")
        elif leaf in (int, float):
            found.append((path, f))
    return found


def base_of(path: str, base: str) -> str:
    """The composition that has the section of `path` (sections that are null by default need their option)."""
    if path.startswith("evaluation.blends"):
        return "blends"
    return "mlperf" if path.startswith("mlperf.") else "auto" if path.startswith("parallelism.auto.") else base


KEYS = {(path, base_of(path, base)): f for kind, prefix, base in ROOTS for path, f in numeric_keys(kind, prefix)}


@functools.lru_cache(maxsize=None)
def composed(base: str) -> schema.Config:
    return compose([*BASES[base], "results_dir=/tmp/results-never-written"])


def outside(bounds: schema.Range, integer: bool) -> float:
    """A value just outside the range, of the key's type (the typed config holds a float key's 0 as 0.0)."""
    step = 1 if integer else 0.5
    if bounds.low is not None:
        value = bounds.low if bounds.low_open else bounds.low - step
    else:
        assert bounds.high is not None
        value = bounds.high if bounds.high_open else bounds.high + step
    return value if integer else float(value)


def set_path(cfg: dict, path: str, value: Any) -> str:
    """Put `value` at `path` of a plain config (`[0]` and `.*` as numeric_keys writes them; a null or empty list or
    mapping of numbers becomes one holding the value); returns the key as the plan's message names it."""
    parts = path.replace("[0]", ".[0]").split(".")
    node: Any = cfg
    key = ""
    for index, part in enumerate(parts):
        last = index == len(parts) - 1
        if part in ("[0]", "*") and not node:  # only leaf lists and mappings are empty or null by default
            return _replace_container(cfg, key, part, value)
        name: Any = 0 if part == "[0]" else next(iter(node)) if part == "*" else part
        key += "[0]" if part == "[0]" else f".{name}" if key else name
        if last:
            node[name] = value
        else:
            node = node[name]
    return key


def _replace_container(cfg: dict, key: str, part: str, value: Any) -> str:
    *outer, name = key.split(".")
    node = cfg
    for step in outer:
        node = node[step]
    node[name] = [value] if part == "[0]" else {"h100": value}
    return f"{key}[0]" if part == "[0]" else f"{key}.h100"


def _is_integer(f: dataclasses.Field) -> bool:
    return "int" in str(f.type) and "float" not in str(f.type)


def test_every_numeric_key_declares_its_range():
    undeclared = sorted({path for (path, _), f in KEYS.items() if schema.range_of(f) is None})
    assert not undeclared, undeclared
    assert len(KEYS) > 120  # every section is walked


def test_every_default_is_inside_its_range():
    for base in BASES:
        assert ranges.problems(composed(base)) == [], base


@pytest.mark.parametrize("path,base", sorted(KEYS), ids=lambda v: v if "." in v else "")
def test_a_value_outside_the_range_is_refused_by_name(tmp_path, path, base):
    f = KEYS[(path, base)]
    bounds = schema.range_of(f)
    value = outside(bounds, _is_integer(f))
    plain = to_plain(changed(composed(base), {"results_dir": str(tmp_path / "results")}))
    key = set_path(plain, path, value)
    with pytest.raises(PlanError) as err:
        validate(schema.load_config(plain))
    (line,) = err.value.problems
    assert line.startswith(f"{key}={value} must be {bounds.words()}"), line
    assert line.endswith(f": {f.metadata['doc']}"), line
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_not_a_number_and_infinity_are_refused(value):
    cfg = changed(composed("default"), {"training.optimizer.lr": value})
    (line,) = ranges.problems(cfg)
    assert line.startswith(f"training.optimizer.lr={value} must be positive"), line
