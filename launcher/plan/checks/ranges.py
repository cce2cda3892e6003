"""Every numeric value against the range its key declares in the schema (common/config.py: `within=`).
Run before every other check: the values out of range are reported together and alone, so the checks of
combinations that follow may divide by sizes and count steps without guarding each one again."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Iterator, Mapping

from common import config as schema

# (dotted key, the value out of range, the schema field that declares the range, the field's type)
Found = Iterator[tuple[str, Any, dataclasses.Field, Any]]


def problems(cfg: schema.Config) -> list[str]:
    """One line per value out of its declared range, naming the key, the range and the key's meaning."""
    return [_line(key, value, f, hint) for key, value, f, hint in _section(cfg, "")]


def _line(key: str, value: Any, f: dataclasses.Field, hint: Any) -> str:
    bounds = schema.range_of(f)
    assert bounds is not None
    why = f" ({bounds.why})" if bounds.why else ""
    nullable = " (or null)" if type(None) in typing.get_args(hint) else ""
    return f"{key}={value} must be {bounds.words()}{why}{nullable}: {f.metadata['doc']}"


def _section(section: object, prefix: str) -> Found:
    """A section's own class (the cluster's platform, the data preparation's source) declares its keys' ranges."""
    for f, hint in _fields(type(section)):
        yield from _values(getattr(section, f.name), hint, f, hint, f"{prefix}{f.name}")


def _values(value: Any, kind: Any, f: dataclasses.Field, hint: Any, key: str) -> Found:
    """The numbers out of range in a value of type `kind`: a number, a list or mapping of them, or a section."""
    kind = _unwrap_optional(kind)
    origin = typing.get_origin(kind)
    if value is None:
        return
    if origin is list and isinstance(value, list):
        for index, item in enumerate(value):
            yield from _values(item, typing.get_args(kind)[0], f, hint, f"{key}[{index}]")
    elif origin is dict and isinstance(value, Mapping):
        for name, item in value.items():
            yield from _values(item, typing.get_args(kind)[1], f, hint, f"{key}.{name}")
    elif dataclasses.is_dataclass(kind):
        yield from _section(value, f"{key}.")
    elif kind in (int, float) and isinstance(value, (int, float)) and not isinstance(value, bool):
        bounds = schema.range_of(f)
        if bounds is not None and not bounds.holds(value):
            yield key, value, f, hint


def _unwrap_optional(kind: Any) -> Any:
    if typing.get_origin(kind) is typing.Union:
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        return args[0] if len(args) == 1 else kind
    return kind


_FIELDS: dict[type, tuple[tuple[dataclasses.Field, Any], ...]] = {}


def _fields(kind: type) -> tuple[tuple[dataclasses.Field, Any], ...]:
    """A schema class's fields with their resolved types (resolved once: typing.get_type_hints is slow)."""
    if kind not in _FIELDS:
        hints = typing.get_type_hints(kind)
        _FIELDS[kind] = tuple((f, hints[f.name]) for f in dataclasses.fields(kind))
    return _FIELDS[kind]
