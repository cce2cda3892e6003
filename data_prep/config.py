"""Read the `data_preparation` section out of a config file, and check its settings.

The launcher writes the fully resolved config into the run directory; `--config` takes that file (or a file
holding just the data_preparation section). Interpolations still present are resolved, so a hand-written
section may use `${.output_dir}` and alike.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Optional, Sequence

from data_prep.shards import DATASETS, ConfigError, Shard, is_url, list_shards
from data_prep.tokenizer import tokenizer_problem


def load_section(path: str, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """The data_preparation section of `path` as plain containers, after `key=value` overrides (dotted paths
    from the file's top level, e.g. data_preparation.workers=8)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        cfg = OmegaConf.load(path)
    except FileNotFoundError:
        raise ConfigError(f"config {path} does not exist") from None
    except Exception as e:
        raise ConfigError(f"cannot read config {path}: {e}") from None
    if "data_preparation" not in cfg and cfg.get("name") in DATASETS:
        cfg = OmegaConf.create({"data_preparation": cfg})  # a bare section: overrides still use full paths
    if overrides:
        bad = [o for o in overrides if "=" not in o]
        if bad:
            raise ConfigError(f"override {bad[0]!r} is not key=value")
        try:
            cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(list(overrides)))
        except OmegaConfBaseException as e:
            raise ConfigError(f"cannot apply overrides {list(overrides)}: {e}") from None
    if "data_preparation" in cfg:
        section = cfg.data_preparation
    else:
        raise ConfigError(f"config {path} has no data_preparation section (pass the run directory's config.yaml)")
    try:
        return OmegaConf.to_container(section, resolve=True, enum_to_str=True)
    except OmegaConfBaseException as e:
        msg = str(e).splitlines()[0]
        raise ConfigError(
            f"config {path}: cannot resolve data_preparation ({msg}); pass the resolved config.yaml "
            "the launcher writes into the run directory"
        ) from None


# -- settings ----------------------------------------------------------------------------------------------

# Each chunk is one round trip to a worker process: below a page, handing chunks around costs more than
# tokenizing them (the reader works in 1 MiB blocks anyway).
MIN_CHUNK_BYTES = 4096
# Up to 2 x workers + 2 chunks are in memory at once: beyond this, memory grows with no gain in speed.
MAX_CHUNK_BYTES = 1 << 30
_CHOICES = {"format": ("auto", "jsonl", "text"), "text_document": ("line", "file")}
_BOOLEANS = ("append_eod", "keep_downloads")


def settings_problems(dp: Mapping[str, Any]) -> list[str]:
    """Every problem with the settings the pipeline reads (not the shard layout: data_prep.shards checks that),
    one line each naming the key and the fix; empty when they are sound. Standard library only: the launcher
    runs it while planning."""
    problems: list[str] = []
    for key in (
        "text_key",
        *_CHOICES,
        *_BOOLEANS,
        "workers",
        "chunk_bytes",
        "checksums_file",
        "download_dir",
        "download",
        "tokenizer",
    ):
        if key not in dp:
            problems.append(
                f"data_preparation.{key} is missing; every key has its default in conf/data_preparation/<name>.yaml"
            )
            continue
        problem = _setting_problem(key, dp[key])
        if problem:
            problems.append(problem)
    if isinstance(dp.get("download"), Mapping):
        problems += _download_problems(dp["download"])
    if isinstance(dp.get("tokenizer"), Mapping):
        problems += _tokenizer_problems(dp["tokenizer"])
    return problems


def settings_and_shards(dp: Mapping[str, Any]) -> tuple[list[str], list[Shard]]:
    """The settings' problems, then the shard layout's (which stops at its first), and the shards (none when
    the layout has a problem): what `python -m data_prep run` checks before it starts."""
    problems = settings_problems(dp)
    try:
        shards = list_shards(dp)
    except ConfigError as e:
        return list(dict.fromkeys(problems + str(e).splitlines())), []  # format is checked by both
    return problems, shards


def _setting_problem(key: str, value: Any) -> Optional[str]:
    if key == "text_key" and (not isinstance(value, str) or not value):
        return f"data_preparation.text_key={value!r}: expected the JSON key holding the text, e.g. text"
    if key in _CHOICES and value not in _CHOICES[key]:
        return f"data_preparation.{key}={value!r} is not one of {', '.join(_CHOICES[key])}"
    if key in _BOOLEANS and not isinstance(value, bool):
        return f"data_preparation.{key}={value!r}: expected true or false"
    if key == "workers":
        return workers_problem(value)
    if key == "chunk_bytes":
        return chunk_bytes_problem(value)
    if key == "checksums_file" and value is not None:
        return _checksums_problem(value)
    if key in ("download", "tokenizer") and not isinstance(value, Mapping):
        return f"data_preparation.{key}={value!r}: expected a section; see conf/data_preparation/<name>.yaml"
    return None


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


def chunk_bytes_problem(value: Any) -> Optional[str]:
    if _is_int(value) and MIN_CHUNK_BYTES <= int(value) <= MAX_CHUNK_BYTES:
        return None
    return (
        f"data_preparation.chunk_bytes={value!r}: expected a number of bytes from {MIN_CHUNK_BYTES} to "
        f"{MAX_CHUNK_BYTES} (default 262144; it only tunes speed)"
    )


def _checksums_problem(value: Any) -> Optional[str]:
    if not isinstance(value, str) or not value:
        return f"data_preparation.checksums_file={value!r}: expected null, a path or a URL"
    if is_url(value) or os.path.isfile(os.path.expanduser(value)):
        return None
    return f"data_preparation.checksums_file={value} does not exist: give a sha256sum list's path or URL, or null"


def _download_problems(download: Mapping[str, Any]) -> list[str]:
    problems = []
    for key, least, kind in (
        ("retries", 0, "a whole number"),
        ("backoff_s", 0, "seconds"),
        ("max_backoff_s", 0, "seconds"),
        ("timeout_s", 1e-9, "seconds"),
    ):
        value = download.get(key)
        number = _is_int(value) if kind == "a whole number" else _is_number(value)
        if not number or float(value) < least:
            bound = "at least 0" if least == 0 else "above 0"
            problems.append(f"data_preparation.download.{key}={value!r}: expected {kind}, {bound}")
    return problems


def _tokenizer_problems(tok: Mapping[str, Any]) -> list[str]:
    unset = [k for k in ("type", "path") if tok.get(k) in (None, "")]
    if unset:
        return [f"data_preparation.tokenizer.{k} is not set (it defaults to training.tokenizer.{k})" for k in unset]
    problem = tokenizer_problem(str(tok["type"]), str(tok["path"]), "data_preparation.tokenizer")
    return [problem] if problem else []


def _is_int(value: Any) -> bool:
    """An integer, or its digits as a string (as a hand-written override may give it); never a boolean."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, str) and value.strip().lstrip("-").isdigit())


def _is_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float))
