"""Read a config file for `python -m data_prep` into the typed config (common/config.py), and check the
data_preparation settings its types leave open.

`--config` takes the resolved config.yaml the launcher writes into the run directory (or a file holding just the
data_preparation section). `key=value` overrides change the file's values before they are typed, so a value of
the wrong type is refused the same way from either. Standard library and yaml only: no OmegaConf.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
import os
from typing import Any, Optional, Sequence

import yaml

from common.config import (
    DATA_SOURCES,
    SftJsonlData,
    VARIANTS,
    Config,
    DataPreparationConfig,
    DownloadConfig,
    TokenizerConfig,
    load_config,
)
from common.typed import TypedConfigError, from_plain
from data_prep.shards import ConfigError, Shard, is_url, list_shards
from data_prep.tokenizer import tokenizer_problem

SECTION = "data_preparation"


@dataclass(frozen=True)
class ConfigFile:
    """What `--config` holds: the data_preparation section and the run's whole config, None for a file with just
    the section (the stack check then reads conf/stack.yaml)."""

    section: DataPreparationConfig
    run: Optional[Config]


def load_config_file(path: str, overrides: Sequence[str] = ()) -> ConfigFile:
    """`path` typed, after `key=value` overrides (dotted paths from the file's top level, e.g.
    data_preparation.workers=8); ConfigError (one line) for anything that does not fit."""
    plain = _read(path)
    if SECTION not in plain and str(plain.get("name")) in DATA_SOURCES:
        plain = {SECTION: plain}  # a bare section: overrides still use full paths
    plain = with_overrides(plain, overrides)
    if SECTION not in plain:
        raise ConfigError(f"config {path} has no data_preparation section (pass the run directory's config.yaml)")
    _refuse_interpolations(path, plain[SECTION], SECTION)
    try:
        if set(plain) == {SECTION}:
            return ConfigFile(from_plain(DataPreparationConfig, plain[SECTION], VARIANTS, SECTION), None)
        run = load_config(plain)
    except TypedConfigError as err:
        raise ConfigError(str(err)) from None
    return ConfigFile(run.data_preparation, run)


def _read(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            plain = yaml.safe_load(f)
    except FileNotFoundError:
        raise ConfigError(f"config {path} does not exist") from None
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"cannot read config {path}: {' '.join(str(e).split())}") from None
    return plain if isinstance(plain, dict) else {}


def with_overrides(plain: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """A copy of `plain` with each `dotted.key=value` set; the value is read as YAML (8, true, [a, b], null)."""
    bad = [o for o in overrides if "=" not in o]
    if bad:
        raise ConfigError(f"override {bad[0]!r} is not key=value")
    result = copy.deepcopy(plain)
    for override in overrides:
        key, _, text = override.partition("=")
        try:
            _set(result, key, yaml.safe_load(text))
        except (ValueError, yaml.YAMLError) as e:
            raise ConfigError(f"cannot apply overrides {list(overrides)}: {' '.join(str(e).split())}") from None
    return result


def _set(plain: dict[str, Any], key: str, value: Any) -> None:
    *parents, last = key.split(".")
    if not all(key.split(".")):
        raise ValueError(f"{key!r} is not a dotted key")
    section = plain
    for depth, name in enumerate(parents):
        section = section.setdefault(name, {})
        if not isinstance(section, dict):
            raise ValueError(f"{'.'.join(parents[: depth + 1])} is a value, not a section: {key} cannot be set")
    section[last] = value


def _refuse_interpolations(path: str, value: Any, key: str) -> None:
    """A `${...}` left in the file: only Hydra resolves those, and the launcher writes config.yaml resolved."""
    if isinstance(value, dict):
        for name, inner in value.items():
            _refuse_interpolations(path, inner, f"{key}.{name}")
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            _refuse_interpolations(path, inner, f"{key}[{index}]")
    elif isinstance(value, str) and "${" in value:
        raise ConfigError(
            f"config {path}: cannot resolve data_preparation ({key}={value} is an interpolation); pass the "
            "resolved config.yaml the launcher writes into the run directory"
        )


# -- settings ----------------------------------------------------------------------------------------------

# Each chunk is one round trip to a worker process: below a page, handing chunks around costs more than
# tokenizing them (the reader works in 1 MiB blocks anyway).
MIN_CHUNK_BYTES = 4096
# Up to 2 x workers + 2 chunks are in memory at once: beyond this, memory grows with no gain in speed.
MAX_CHUNK_BYTES = 1 << 30


def settings_problems(dp: DataPreparationConfig) -> list[str]:
    """Every problem with the settings the pipeline reads that their types leave open (not the shard layout:
    data_prep.shards checks that), one line each naming the key and the fix; empty when they are sound. Standard
    library only: the launcher runs it while planning."""
    problems = [
        _text_key_problem(dp.text_key),
        workers_problem(dp.workers),
        chunk_bytes_problem(dp.chunk_bytes),
        _checksums_problem(dp.checksums_file),
    ]
    return (
        [p for p in problems if p]
        + _download_problems(dp.download)
        + _tokenizer_problems(dp.tokenizer)
        + sft_settings_problems(dp)
    )


def settings_and_shards(dp: DataPreparationConfig) -> tuple[list[str], list[Shard]]:
    """The settings' problems, then the shard layout's (which stops at its first), and the shards (none when
    the layout has a problem): what `python -m data_prep run` checks before it starts."""
    problems = settings_problems(dp)
    try:
        shards = list_shards(dp)
    except ConfigError as e:
        return list(dict.fromkeys(problems + str(e).splitlines())), []
    return problems, shards


def _text_key_problem(value: str) -> Optional[str]:
    if value:
        return None
    return f"data_preparation.text_key={value!r}: expected the JSON key holding the text, e.g. text"


def workers_problem(value: Any) -> Optional[str]:
    if value == "auto" or (_is_int(value) and int(value) >= 1):
        return None
    return f"data_preparation.workers={value!r}: expected a positive integer (tokenizer processes) or auto"


def resolve_workers(value: Any) -> int:
    """`auto` -> the CPUs this process may run on (a Slurm allocation restricts them)."""
    problem = workers_problem(value)
    if problem:
        raise ConfigError(problem)
    if value == "auto":
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return int(value)


def chunk_bytes_problem(value: int) -> Optional[str]:
    if MIN_CHUNK_BYTES <= value <= MAX_CHUNK_BYTES:
        return None
    return (
        f"data_preparation.chunk_bytes={value!r}: expected a number of bytes from {MIN_CHUNK_BYTES} to "
        f"{MAX_CHUNK_BYTES} (default 262144; it only tunes speed)"
    )


def _checksums_problem(value: Optional[str]) -> Optional[str]:
    if value is None:
        return None
    if not value:
        return f"data_preparation.checksums_file={value!r}: expected null, a path or a URL"
    if is_url(value) or os.path.isfile(os.path.expanduser(value)):
        return None
    return f"data_preparation.checksums_file={value} does not exist: give a sha256sum list's path or URL, or null"


def _download_problems(download: DownloadConfig) -> list[str]:
    # (key, value, what it is, whether 0 is allowed)
    limits = (
        ("retries", download.retries, "a whole number", True),
        ("backoff_s", download.backoff_s, "seconds", True),
        ("max_backoff_s", download.max_backoff_s, "seconds", True),
        ("timeout_s", download.timeout_s, "seconds", False),
    )
    return [
        f"data_preparation.download.{key}={value:g}: expected {kind}, {'at least 0' if zero else 'above 0'}"
        for key, value, kind, zero in limits
        if value < 0 or (value == 0 and not zero)
    ]


def _tokenizer_problems(tok: TokenizerConfig) -> list[str]:
    if not tok.path:
        return ["data_preparation.tokenizer.path is not set (it defaults to training.tokenizer.path)"]
    problem = tokenizer_problem(str(tok.type), tok.path, "data_preparation.tokenizer")
    return [problem] if problem else []


def sft_settings_problems(dp: DataPreparationConfig) -> list[str]:
    """Settings of a fine-tuning source their types leave open, one line each (standard library only)."""
    if not isinstance(dp, SftJsonlData):
        return []
    problems = [
        f"data_preparation.{name}={value!r}: expected the JSON key holding the {name.split('_')[0]}"
        for name, value in (("prompt_key", dp.prompt_key), ("response_key", dp.response_key))
        if not value
    ]
    if dp.prompt_key and dp.prompt_key == dp.response_key:
        problems.append(f"data_preparation.prompt_key and response_key are both {dp.prompt_key!r}: name two fields")
    if dp.chat_template:
        problem = chat_template_problem(str(dp.tokenizer.type), dp.tokenizer.path)
        if problem:
            problems.append(problem)
    return problems


def chat_template_problem(tokenizer_type: str, path: str) -> Optional[str]:
    """chat_template=true with a tokenizer that has none (tokenizer_config.json beside it, as transformers reads
    it): one line. A hub id is not looked up (the plan never downloads)."""
    fix = "set data_preparation.chat_template=false, or use a tokenizer whose tokenizer_config.json has one"
    if tokenizer_type != "huggingface":
        return f"data_preparation.chat_template=true: a {tokenizer_type} tokenizer has no chat template; {fix}"
    local = os.path.abspath(os.path.expanduser(path))
    if not os.path.exists(local):
        return None  # a hub id: the worker's load of the template says so when it has none
    config = os.path.join(local if os.path.isdir(local) else os.path.dirname(local), "tokenizer_config.json")
    try:
        with open(config, encoding="utf-8") as f:
            template = json.load(f).get("chat_template")
    except (OSError, ValueError, AttributeError):  # no file, not JSON, not an object
        template = None
    if template:
        return None
    return f"data_preparation.chat_template=true: tokenizer {path} has no chat_template in {config}; {fix}"


def _is_int(value: Any) -> bool:
    """An integer, or its digits as a string (as a hand-written override may give it); never a boolean."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, str) and value.strip().lstrip("-").isdigit())
