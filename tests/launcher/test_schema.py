"""The typed schema: every option of every config group composes, and every resolved value has the type the schema
declares (interpolations included); the configuration reference page (docs/) is the one the schema generates."""

from __future__ import annotations

import dataclasses
import enum
import typing
from typing import Any

import pytest

from launcher.config import reference as config_reference, schema
from launcher.config.compose import compose

from launcher_helpers import REPO

CONF = REPO / "conf"


def options(group: str) -> list[str]:
    """Every selectable option of a group (files under conf/<group>/, without the private _*.yaml and the
    default/ pointers, which the named layouts cover)."""
    root = CONF / group
    found = []
    for path in sorted(root.rglob("*.yaml")):
        rel = path.relative_to(root).with_suffix("").as_posix()
        if not any(part.startswith("_") for part in rel.split("/")) and not rel.startswith("default/"):
            found.append(rel)
    return found


def type_problems(value: Any, kind: Any, where: str) -> list[str]:
    """Where the resolved value does not have the declared type."""
    if typing.get_origin(kind) is typing.Union:
        if value is None and type(None) in typing.get_args(kind):
            return []
        (kind,) = [a for a in typing.get_args(kind) if a is not type(None)]
    if kind is Any:
        return []
    if value is None:
        return [f"{where} is null but {kind} is not optional"]
    origin = typing.get_origin(kind)
    if origin is list:
        if not isinstance(value, list):
            return [f"{where}={value!r} is not a list"]
        (item,) = typing.get_args(kind)
        return [p for i, v in enumerate(value) for p in type_problems(v, item, f"{where}[{i}]")]
    if origin is dict:
        if not isinstance(value, dict):
            return [f"{where}={value!r} is not a mapping"]
        _, item = typing.get_args(kind)
        return [p for k, v in value.items() for p in type_problems(v, item, f"{where}.{k}")]
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return [] if value in kind.__members__ else [f"{where}={value!r} is not one of {list(kind.__members__)}"]
    if dataclasses.is_dataclass(kind):
        return section_problems(value, kind, where)
    if kind is float:
        ok = isinstance(value, float) or (isinstance(value, int) and not isinstance(value, bool))
    else:
        ok = type(value) is kind
    return [] if ok else [f"{where}={value!r} is {type(value).__name__}, not {kind.__name__}"]


def section_problems(values: Any, kind: type, where: str) -> list[str]:
    if not isinstance(values, dict):
        return [f"{where}={values!r} is not a section"]
    if where == "cluster":
        kind = schema.CLUSTERS[values["platform"]]
    elif where == "data_preparation":
        kind = next(k for name, k in schema.DATA_SOURCES.items() if _source_of(values) == name)
    hints = typing.get_type_hints(kind)
    declared = {f.name for f in dataclasses.fields(kind)}
    problems = [f"{where}.{k} is not in the schema ({kind.__name__})" for k in values if k not in declared]
    for name in declared:
        if name not in values:
            problems.append(f"{where}.{name} is missing")
        else:
            problems += type_problems(values[name], hints[name], f"{where}.{name}" if where else name)
    return problems


def _source_of(values: dict) -> str:
    if "inputs" in values:
        return "files"
    return "c4" if "train" in values else "pile"


COMPOSITIONS = (
    [[f"training={t}"] for t in options("training")]
    + [[f"dtype={d}"] for d in options("dtype")]
    + [[f"parallelism={p}", "training=llama31/405b"] for p in options("parallelism")]
    + [[f"cluster={c}"] for c in options("cluster")]
    + [[f"data_preparation={d}"] for d in options("data_preparation")]
    + [["training=mlperf/llama31_405b", "cluster=bcm", "cluster.gpus_per_node=4"]]
)


def test_every_group_has_options():
    for group in ("training", "dtype", "parallelism", "cluster", "data_preparation"):
        assert len(options(group)) >= 2, group


@pytest.mark.parametrize("overrides", COMPOSITIONS, ids=lambda o: " ".join(o))
def test_every_option_composes_to_the_declared_types(overrides):
    cfg = compose([*overrides, "results_dir=/tmp/results"])
    assert section_problems(cfg, schema.Config, "") == []


def test_the_checker_sees_a_wrong_type():
    cfg = compose(["results_dir=/tmp/results"])
    cfg["training"]["seq_length"] = "2048"
    cfg["cluster"]["gpus_per_node"] = True
    cfg["stages"] = ["training", "trianing"]
    problems = section_problems(cfg, schema.Config, "")
    assert len(problems) == 3, problems


def test_every_schema_key_has_a_one_line_doc():
    for kind in [v for v in vars(schema).values() if isinstance(v, type) and dataclasses.is_dataclass(v)]:
        for f in dataclasses.fields(kind):
            doc = f.metadata.get("doc", "")
            assert doc and "\n" not in doc, f"{kind.__name__}.{f.name}"


def test_the_docs_reference_is_the_generated_one():
    page = REPO / config_reference.PAGE
    assert page.read_text() == config_reference.page(), (
        f"{config_reference.PAGE} differs from the schema: python -m launcher.config.reference --write "
        f"{config_reference.PAGE}"
    )
