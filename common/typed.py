"""Plain data (a resolved config.yaml, JSON) into the schema's dataclasses and back, with no Hydra or OmegaConf: what
both sides use to read a run directory's config (common/run.py) and what the launcher uses right after Hydra
composed the config. Every value is checked against its declared type on the way in; a wrong one is one line
naming its key.

A field whose type is a base class with subclasses per option (the cluster, one class per platform; data
preparation, one per source) is built as the subclass its discriminating key names (`Config.variants`)."""

from __future__ import annotations

import dataclasses
from dataclasses import MISSING, fields, is_dataclass
from enum import Enum
import functools
import types
import typing
from typing import Any, Mapping, TypeVar, Union

T = TypeVar("T")


class TypedConfigError(ValueError):
    """A value that does not fit the schema: the message names the key."""


class StrEnum(str, Enum):
    """A closed set of strings that also compares, formats and serialises as its value (Python 3.10 has no
    enum.StrEnum)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)

    def __repr__(self) -> str:  # messages quote a value as the user typed it: 'pyxis'
        return repr(self.value)


# A base class -> (the key that names the option, {option: subclass}); filled by the schema module.
Variants = dict[type, tuple[str, dict[str, type]]]


def from_plain(cls: type[T], data: Any, variants: Variants | None = None, path: str = "") -> T:
    """`data` (dicts, lists, strings, numbers) as an instance of the dataclass `cls`."""
    return _build(cls, data, variants or {}, path)


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _build(kind: Any, value: Any, variants: Variants, path: str) -> Any:
    origin = typing.get_origin(kind)
    if kind is Any:
        return value
    if origin in (Union, types.UnionType):
        options = [a for a in typing.get_args(kind) if a is not type(None)]
        if value is None:
            return None
        return _build(options[0] if len(options) == 1 else Any, value, variants, path)
    if value is None:
        raise TypedConfigError(f"{path or 'the config'} is null but must be given ({_name(kind)})")
    if origin in (list, typing.List):
        (item,) = typing.get_args(kind) or (Any,)
        _expect(isinstance(value, (list, tuple)), value, "a list", path)
        return [_build(item, v, variants, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin in (dict, typing.Dict):
        _, item = typing.get_args(kind) or (str, Any)
        _expect(isinstance(value, Mapping), value, "a mapping", path)
        return {k: _build(item, v, variants, f"{path}.{k}") for k, v in value.items()}
    if isinstance(kind, type) and is_dataclass(kind):
        return _dataclass(_variant(kind, value, variants, path), value, variants, path)
    if isinstance(kind, type) and issubclass(kind, Enum):
        return _enum(kind, value, path)
    return _scalar(kind, value, path)


def _required(f: dataclasses.Field) -> bool:
    """No default, or OmegaConf's mark of a value that must be given ("???"), which the schema's keys carry."""
    return (f.default is MISSING and f.default_factory is MISSING) or f.default == "???"


def _variant(kind: type, value: Any, variants: Variants, path: str) -> type:
    if kind not in variants:
        return kind
    key, options = variants[kind]
    chosen = value.get(key) if isinstance(value, Mapping) else None
    if chosen not in options:
        raise TypedConfigError(f"{path}.{key}={chosen!r} is none of {', '.join(options)}")
    return options[chosen]


def _dataclass(kind: type, value: Any, variants: Variants, path: str) -> Any:
    _expect(isinstance(value, Mapping), value, "a mapping", path)
    hints = _hints(kind)
    known = {f.name for f in fields(kind)}
    unknown = sorted(set(value) - known)
    if unknown:
        raise TypedConfigError(f"{_join(path, unknown[0])} is not a config key: remove it")
    args = {}
    for f in fields(kind):
        key = _join(path, f.name)
        if f.name in value:
            args[f.name] = _build(hints[f.name], value[f.name], variants, key)
        elif _required(f):
            raise TypedConfigError(f"{key} is missing")
    return kind(**args)


def _enum(kind: type[Enum], value: Any, path: str) -> Enum:
    if isinstance(value, kind):
        return value
    for member in kind:
        if value in (member.value, member.name):
            return member
    raise TypedConfigError(f"{path}={value!r} is none of {', '.join(str(m.value) for m in kind)}")


def _scalar(kind: Any, value: Any, path: str) -> Any:
    if kind is bool:
        _expect(isinstance(value, bool), value, "true or false", path)
    elif kind is int:
        _expect(isinstance(value, int) and not isinstance(value, bool), value, "an integer", path)
    elif kind is float:
        _expect(isinstance(value, (int, float)) and not isinstance(value, bool), value, "a number", path)
        return float(value)
    elif kind is str:
        _expect(isinstance(value, str), value, "a string", path)
    return value


def _expect(ok: bool, value: Any, what: str, path: str) -> None:
    if not ok:
        raise TypedConfigError(f"{path}={value!r} must be {what}")


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path and key else path or key


def _name(kind: Any) -> str:
    return getattr(kind, "__name__", str(kind))


def to_plain(obj: Any) -> Any:
    """A dataclass instance (and what it holds) as dicts, lists, strings and numbers, enum members as their values,
    keys in declaration order: what config.yaml holds."""
    if is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_plain(getattr(obj, f.name)) for f in fields(obj)}
    if isinstance(obj, Enum):
        return obj.value
    if isinstance(obj, Mapping):
        return {k: to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    return obj


def changed(obj: T, changes: Mapping[str, Any]) -> T:
    """A copy of a config dataclass with some keys set, by dotted path (`{"parallelism.num_gpus": 8}`); the sections
    on those paths are copied, the rest shared."""
    own: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    for path, value in changes.items():
        head, _, rest = path.partition(".")
        if rest:
            nested.setdefault(head, {})[rest] = value
        else:
            own[head] = value
    for head, inner in nested.items():
        own[head] = changed(own.get(head, getattr(obj, head)), inner)
    return dataclasses.replace(obj, **own)  # type: ignore[type-var]
