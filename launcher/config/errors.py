"""Hydra's and OmegaConf's composition errors as the project's one-line messages: the key, the value given, what the
schema expects and how to write it. Nothing is planned or written when composing fails."""

from __future__ import annotations

import dataclasses
import difflib
import enum
import re
import typing
from pathlib import Path
from typing import Any, Sequence

import yaml
from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from omegaconf.errors import (
    ConfigAttributeError,
    ConfigKeyError,
    InterpolationResolutionError,
    MissingMandatoryValue,
    OmegaConfBaseException,
    ValidationError,
)

from common import config as schema
from launcher.config.compose import CONF_DIR, compose, search_path
from launcher.usage import group_options


def error_lines(exc: BaseException, config_dirs: Sequence[Path] = ()) -> list[str]:
    """One line per problem (without the `error: ` prefix), for any exception raised while composing a config;
    `config_dirs` are the directories --config-dir added (a site's own options), where a file is looked up."""
    in_file = _in_option_file(exc, config_dirs)
    if in_file:
        return [in_file]
    if isinstance(exc, MissingConfigException):
        return [_missing_option(exc, config_dirs)]
    if isinstance(exc, yaml.YAMLError):
        return [yaml_line(exc)]
    if isinstance(exc, OverrideParseException):
        return [
            f"{exc.override}: not a valid override ({_first_line(exc)}); write key=value, lists as "
            "'key=[a,b]' in quotes"
        ]
    cause = exc.__cause__ if isinstance(exc.__cause__, OmegaConfBaseException) else exc
    if isinstance(cause, OmegaConfBaseException):
        return [_omegaconf_line(cause, _override_text(exc))]
    return [_first_line(exc)]


def every_error_line(
    exc: BaseException, overrides: list[str], limit: int = 20, config_dirs: Sequence[Path] = ()
) -> list[str]:
    """Hydra stops at the first override that does not fit the schema; compose again without each offending
    override in turn, so one run of main.py names every bad value, not just the first."""
    lines, remaining = error_lines(exc, config_dirs), list(overrides)
    for _ in range(limit):
        offending = _offending_override(exc, remaining)
        if offending is None:
            break
        remaining.remove(offending)
        try:
            compose([*remaining, *search_path(config_dirs)])
            break
        except (HydraException, OmegaConfBaseException, yaml.YAMLError) as err:
            exc = err
            lines += [line for line in error_lines(err, config_dirs) if line not in lines]
    return lines


def yaml_line(err: yaml.YAMLError) -> str:
    """A YAML file that does not parse: the file, the line and what is wrong there."""
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or _first_line(err)
    context = getattr(err, "context", None)
    context_mark = getattr(err, "context_mark", None)
    if context and context_mark is not None:
        problem += f" ({context} from line {context_mark.line + 1})"
    where = f"{mark.name}, line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "a config file"
    return f"{where}: not valid YAML: {problem}; fix the YAML there"


def _in_option_file(exc: BaseException, config_dirs: Sequence[Path]) -> str | None:
    """A problem inside an option's YAML file (`In 'cluster/mysite': ...`, as Hydra reports a wrong key, value or
    default there): the file, then the problem as for a command-line value."""
    match = re.match(r"In '([^']+)': (.*)", str(exc), re.S)
    if not match or match.group(1) == "config":  # the primary config: its options come from the command line
        return None
    file = _option_file(match.group(1), config_dirs)
    body = match.group(2)
    missing = re.match(r"Could not (?:load|find) '([^']+)'", body)
    if missing:
        group, _, option = missing.group(1).partition("/")
        return f"{file}: its defaults name {group}={option}, {_no_such_option(group, option, config_dirs)}"
    key = re.search(r"full_key: (\S+)", body)
    text = next((line.strip() for line in body.splitlines()[1:] if line.strip()), body.strip())
    if isinstance(exc.__cause__, OmegaConfBaseException):
        return f"{file}: {_omegaconf_line(exc.__cause__, None)}"
    unknown = re.match(r"Key '([^']+)' not in '([^']+)'", text)
    if unknown and key:
        owner = next((kind for kind in _schema_classes() if kind.__name__ == unknown.group(2)), None)
        return f"{file}: {_unknown_key(key.group(1), owner)}"
    kind = _field_type(key.group(1)) if key else None
    if key and kind is not None:
        value = re.search(r"[Vv]alue '([^']*)'", text)
        given = f"{key.group(1)}={value.group(1)}" if value else key.group(1)
        return f"{file}: {given}: {key.group(1)} must be {describe(kind)} ({_doc(key.group(1))})"
    return f"{file}: {text}"


def _option_file(option: str, config_dirs: Sequence[Path]) -> str:
    """Where an option's YAML lives: the first --config-dir that has it, else conf/."""
    for root in [*config_dirs, CONF_DIR]:
        path = root / f"{option}.yaml"
        if path.is_file():
            return str(path)
    return f"{option}.yaml"


def _schema_classes() -> list[type]:
    return [kind for kind in vars(schema).values() if isinstance(kind, type) and dataclasses.is_dataclass(kind)]


def _offending_override(exc: BaseException, overrides: list[str]) -> str | None:
    """The command-line override an error is about: the one its message quotes, or for an unknown option
    (`Could not find 'dtype/fp16'`) the one that chose it."""
    text = str(exc)
    missing = re.search(r"Could not find '([^']+)'", text)
    for override in overrides:
        key, _, value = override.lstrip("+~").partition("=")
        if override in text or (missing and missing.group(1) == f"{key}/{value}"):
            return override
    return None


def _first_line(exc: BaseException) -> str:
    return next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)


def _override_text(exc: BaseException) -> str | None:
    """The override as the user typed it, where Hydra's message quotes it."""
    match = re.search(r"Error merging override (.+)", str(exc))
    return match.group(1).strip() if match else None


def _omegaconf_line(err: Any, typed: str | None) -> str:
    full_key = re.sub(r"\[\d+\]$", "", str(getattr(err, "full_key", "") or ""))
    given = typed or f"{full_key}={getattr(err, 'value', None)!r}"
    if isinstance(err, (ConfigKeyError, ConfigAttributeError)) and "not in" in str(err):
        return _unknown_key(full_key, getattr(err, "object_type", None))
    if isinstance(err, MissingMandatoryValue):
        return f"{full_key} has no value: set it ({_doc(full_key)})"
    if isinstance(err, ValidationError):
        bad = re.match(r"Invalid value '(.*)', expected one of \[(.*)\]", _first_line(err))
        if bad and full_key == "stages":
            return f"{given}: {bad.group(1)!r} is not a stage; use one of {bad.group(2)}"
        if bad:
            return f"{given}: {full_key} must be one of {bad.group(2)} ({_doc(full_key)})"
        field_type = _field_type(full_key)
        if field_type is None:
            return f"{given}: {_first_line(err)}"
        return f"{given}: {full_key} must be {describe(field_type)} ({_doc(full_key)}){_whole(given, field_type)}"
    if isinstance(err, InterpolationResolutionError):
        return f"{full_key}: cannot resolve its interpolation ({_first_line(err)})"
    return f"{given}: {_first_line(err)}"


# --------------------------------------------------------------------------- the schema, by dotted key
def _candidates(kind: Any, part: str) -> list[type]:
    """The dataclasses a section may be: the declared one, and for cluster/data_preparation every option's class."""
    if part == "cluster":
        return list(schema.CLUSTERS.values())
    if part == "data_preparation":
        return list(schema.DATA_SOURCES.values())
    return [kind]


def _lookup(dotted: str) -> list[tuple[type, dataclasses.Field]]:
    """Every (schema class, field) the dotted key can name: several where a section differs by option (cluster,
    data_preparation); a mapping's own keys (step_time.gpus.<gpu>) are stepped over."""
    parts = dotted.split(".")
    sections: list[Any] = [schema.Config]
    index = 0
    while index < len(parts):
        found = [
            (owner, f)
            for owner in sections
            if isinstance(owner, type) and dataclasses.is_dataclass(owner)
            for f in dataclasses.fields(owner)
            if f.name == parts[index]
        ]
        if index == len(parts) - 1 or not found:
            return found
        step, sections = 1, []
        for owner, f in found:
            inner = _unwrap_optional(_hint(owner, f))
            if typing.get_origin(inner) is dict:
                inner, step = typing.get_args(inner)[1], 2
            sections += _candidates(inner, parts[index])
        index += step
    return []


def _hint(owner: type, f: dataclasses.Field) -> Any:
    return typing.get_type_hints(owner)[f.name]


def _unwrap_optional(kind: Any) -> Any:
    if typing.get_origin(kind) is typing.Union:
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        return args[0] if len(args) == 1 else kind
    return kind


def _field_type(dotted: str) -> Any:
    found = _lookup(dotted)
    return _hint(*found[0]) if found else None


def _doc(dotted: str) -> str:
    found = _lookup(dotted)
    return found[0][1].metadata.get("doc", "") if found else ""


def _whole(given: str, kind: Any) -> str:
    """`train_steps=1e3` is a float to the parser: say how to write the integer it means."""
    key, _, text = given.partition("=")
    try:
        value = float(text)
    except ValueError:
        return ""
    if _unwrap_optional(kind) is int and value.is_integer():
        return f"; write {key}={int(value)}"
    return ""


def describe(kind: Any) -> str:
    """What a value of this schema type looks like, in words."""
    optional = typing.get_origin(kind) is typing.Union and type(None) in typing.get_args(kind)
    inner = _unwrap_optional(kind)
    origin = typing.get_origin(inner)
    if origin in (list, typing.List):
        (item,) = typing.get_args(inner) or (Any,)
        if isinstance(item, type) and issubclass(item, enum.Enum):
            items = " of " + ", ".join(member.name for member in item)
        else:
            items = "" if item is Any else f" of {_plural(item)}"
        text = f"a list{items} (write 'key=[a,b]' in quotes)"
    elif origin in (dict, typing.Dict):
        text = "a mapping (write 'key={a: 1}' in quotes)"
    elif isinstance(inner, type) and issubclass(inner, enum.Enum):
        text = "one of " + ", ".join(member.name for member in inner)
    elif dataclasses.is_dataclass(inner):
        text = "a section of keys (set them one by one: key.name=value)"
    else:
        text = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(inner, "a value")
    return text + (" or null" if optional else "")


def _plural(item: Any) -> str:
    text = describe(item)
    for single, plural in (
        ("an integer", "integers"),
        ("a number", "numbers"),
        ("a string", "strings"),
        ("true or false", "true/false values"),
    ):
        text = text.replace(single, plural)
    return text


def _unknown_key(full_key: str, owner: Any) -> str:
    section, _, name = full_key.rpartition(".")
    known = [f.name for f in dataclasses.fields(owner)] if dataclasses.is_dataclass(owner) else []
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"; did you mean {section + '.' if section else ''}{close[0]}?" if close else ""
    where = f" of {section}" if section else ""
    if section == "cluster" and owner is not None:
        where = f" of cluster on platform {_platform_of(owner)}"
    return f"{full_key} is not a key{where}{hint} (docs/configuration-reference.md lists the keys)"


def _platform_of(owner: type) -> str:
    return next((name for name, kind in schema.CLUSTERS.items() if kind is owner), owner.__name__)


def _missing_option(exc: Any, config_dirs: Sequence[Path] = ()) -> str:
    """`training=llama31/9b`: the group, the option given, and the options there are."""
    match = re.search(r"Could not (?:find|load) '([^']+)'", str(exc))
    path = match.group(1) if match else str(getattr(exc, "missing_cfg_file", ""))
    # Options may lie in sub-folders of their group (training=llama31/8b): the group is the first folder.
    group, _, option = path.partition("/")
    if not group_options(group, config_dirs):
        return _first_line(exc)
    return f"{group}={option}: {_no_such_option(group, option, config_dirs)}"


def _no_such_option(group: str, option: str, config_dirs: Sequence[Path]) -> str:
    return f"no such option; choose one of {', '.join(group_options(group, config_dirs))}"
