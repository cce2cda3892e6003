"""Which shards a data-preparation config describes: their inputs and output prefixes.

Standard library only, on purpose: the launcher imports this module (without torch, megatron or tokenizer
libraries) to size the Slurm array, one task per shard.
"""

from __future__ import annotations

import functools
import glob
import os
import re
from dataclasses import dataclass
from typing import Any, Optional, Sequence
from urllib.parse import unquote, urlparse

from common.config import C4Data, DataPreparationConfig, FilesData, GovReportData, PileData, SftJsonlData

# megatron's preprocess_data names outputs <prefix>_<json key>_<level>; training configs expect this suffix.
OUTPUT_SUFFIX = "_text_document"
# Fine-tuning samples (sft_jsonl, govreport_mlperf): a name apart, so a blend cannot mistake them for a token stream.
SFT_SUFFIX = "_sft_document"
# <prefix>.loss_mask.{bin,idx}: fine-tuning samples' loss mask beside their tokens <prefix>.{bin,idx} (data_prep.sft)
LOSS_MASK = ".loss_mask"
# <prefix>.done.json: written last, once a shard's .bin/.idx are complete (data_prep.pipeline).
MARKER_SUFFIX = ".done.json"
_COMPRESSIONS = {".zst": "zstd", ".zstd": "zstd", ".gz": "gzip"}
_JSON_EXTS = (".jsonl", ".json", ".ndjson")
_TEXT_EXTS = (".txt", ".text", "")
# Tables of rows (the hub's datasets); read a row batch at a time and handed on as JSON lines (data_prep.readers).
_PARQUET_EXTS = (".parquet",)


class ConfigError(ValueError):
    """A data_preparation setting that cannot work; the message names the key and the fix."""


@dataclass(frozen=True)
class Source:
    """One input file of a shard."""

    uri: str  # as configured: an http(s) URL or a local path
    local_path: str  # where it is read from: the download target for URLs, the file itself otherwise
    compression: str  # zstd | gzip | none
    kind: str  # jsonl | text | parquet

    @property
    def remote(self) -> bool:
        return is_url(self.uri)

    @property
    def file_name(self) -> str:
        return os.path.basename(self.local_path)


@dataclass(frozen=True)
class Shard:
    """One output pair `<output_prefix>.bin/.idx`, made from `sources` read in order."""

    index: int
    name: str
    output_prefix: str  # absolute, without .bin/.idx
    sources: tuple[Source, ...]
    # Keep only the first N input lines (as `head -n`); None keeps everything.
    max_documents: Optional[int] = None


def list_shards(dp: DataPreparationConfig) -> list[Shard]:
    """The shards of a `data_preparation` config section, in array-task order (index 0..N-1)."""
    shards = source_shards(dp)
    prefixes = [s.output_prefix for s in shards]
    dupes = sorted({p for p in prefixes if prefixes.count(p) > 1})
    if dupes:
        raise ConfigError(
            f"data_preparation: several inputs would write {dupes[0]}.bin; rename the inputs or "
            "set data_preparation.merge=true"
        )
    return shards


def output_prefixes(dp: DataPreparationConfig) -> list[str]:
    """The output prefixes (what training's data blend lists), in shard order."""
    return [s.output_prefix for s in list_shards(dp)]


def parse_numbers(value: Any, key: str) -> list[int]:
    """'0-1' / '0,3,5-7' / 4 / [0, 1] -> sorted unique ints."""
    if isinstance(value, bool):
        raise ConfigError(f"data_preparation.{key}={value!r}: expected numbers like '0-1', '0,3,5-7' or 4")
    if isinstance(value, int):
        return [value]
    items: list[Any]
    if isinstance(value, str):
        items = [p for p in re.split(r"[,\s]+", value.strip()) if p]
    elif isinstance(value, Sequence):
        items = list(value)
    else:
        raise ConfigError(f"data_preparation.{key}={value!r}: expected numbers like '0-1', '0,3,5-7' or 4")
    numbers: set[int] = set()
    for item in items:
        if isinstance(item, int) and not isinstance(item, bool):
            numbers.add(item)
            continue
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", str(item).strip())
        if not m:
            raise ConfigError(f"data_preparation.{key}: cannot read {item!r}; use numbers and ranges like '0,3,5-7'")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo:
            raise ConfigError(f"data_preparation.{key}: range {item!r} is empty (write low-high)")
        numbers.update(range(lo, hi + 1))
    if not numbers:
        raise ConfigError(f"data_preparation.{key} selects nothing")
    return sorted(numbers)


def detect_format(path: str, fmt: str = "auto") -> tuple[str, str]:
    """(compression, kind) from a file name; `fmt` (jsonl|text) overrides the kind."""
    name = os.path.basename(urlparse(path).path if "://" in path else path).lower()
    stem, ext = os.path.splitext(name)
    compression = _COMPRESSIONS.get(ext, "none")
    if compression != "none":
        stem, ext = os.path.splitext(stem)
    if ext in _PARQUET_EXTS:
        return compression, "parquet"
    if fmt in ("jsonl", "text"):
        return compression, fmt
    if fmt != "auto":
        raise ConfigError(f"data_preparation.format={fmt!r} is not one of auto, jsonl, text")
    if ext in _JSON_EXTS:
        return compression, "jsonl"
    if ext in _TEXT_EXTS:
        return compression, "text"
    raise ConfigError(f"cannot tell the format of {path} from its name: set data_preparation.format=jsonl or text")


def strip_extensions(name: str) -> str:
    """'00.jsonl.zst' -> '00', 'book.txt' -> 'book', 'notes.v2' -> 'notes.v2'."""
    stem, ext = os.path.splitext(name)
    if ext.lower() in _COMPRESSIONS:
        stem, ext = os.path.splitext(stem)
    return stem if ext.lower() in _JSON_EXTS + _TEXT_EXTS + _PARQUET_EXTS else stem + ext


# -- per source: each data source of common/config.py's DATA_SOURCES registers how it splits into shards -----


@functools.singledispatch
def source_shards(dp: DataPreparationConfig) -> list[Shard]:
    """The shards of one source, by the class of its section."""
    raise ConfigError(f"data_preparation.name={dp.name!r}: data_prep/shards.py has no shard layout for this source")


@functools.singledispatch
def inputs_setting(dp: DataPreparationConfig) -> tuple[str, Any]:
    """The key (and its value) that says where a source's inputs are, for messages about missing ones."""
    raise ConfigError(f"data_preparation.name={dp.name!r}: data_prep/shards.py has no shard layout for this source")


@source_shards.register
def _pile_shards(dp: PileData) -> list[Shard]:
    numbers = parse_numbers(dp.file_numbers, "file_numbers")
    bad = [n for n in numbers if not 0 <= n < dp.num_files]
    if bad:
        raise ConfigError(
            f"data_preparation.file_numbers: {bad} outside 0-{dp.num_files - 1} (the source has {dp.num_files} shards)"
        )
    out_dir = _output_dir(dp)
    return [
        Shard(
            index=i,
            name=_fmt(dp.output_template, n, "output_template"),
            output_prefix=os.path.join(out_dir, _fmt(dp.output_template, n, "output_template") + OUTPUT_SUFFIX),
            sources=(_source_at(dp, dp.base_url, _fmt(dp.file_template, n, "file_template")),),
        )
        for i, n in enumerate(numbers)
    ]


@source_shards.register
def _c4_shards(dp: C4Data) -> list[Shard]:
    train, val = dp.train, dp.validation
    out_dir = _output_dir(dp)
    num_files, merged = train.num_files, train.merged_files
    if merged <= 0 or num_files % merged:
        raise ConfigError(f"data_preparation.train.merged_files={merged} must divide train.num_files={num_files}")
    per = num_files // merged
    shards: list[Shard] = []
    for k in parse_numbers(train.tokenize, "train.tokenize"):
        if k >= merged:
            raise ConfigError(
                f"data_preparation.train.tokenize: merged file {k} does not exist "
                f"(there are {merged}, numbered 0-{merged - 1})"
            )
        name = _fmt(train.output_template, k, "train.output_template")
        sources = tuple(
            _source_at(dp, dp.base_url, _fmt(train.file_template, i, "train.file_template"))
            for i in range(k * per, (k + 1) * per)
        )
        shards.append(Shard(len(shards), name, os.path.join(out_dir, name + OUTPUT_SUFFIX), sources))
    if val.enabled:
        sources = tuple(
            _source_at(dp, dp.base_url, _fmt(val.file_template, i, "validation.file_template"))
            for i in range(val.num_files)
        )
        if val.max_documents <= 0:
            raise ConfigError(
                f"data_preparation.validation.max_documents={val.max_documents!r}: expected a positive integer or null"
            )
        shards.append(
            Shard(
                len(shards),
                val.output_name,
                os.path.join(out_dir, val.output_name + OUTPUT_SUFFIX),
                sources,
                val.max_documents,
            )
        )
    if not shards:
        raise ConfigError("data_preparation: nothing to do (train.tokenize selects no file and validation is disabled)")
    return shards


@source_shards.register
def _files_shards(dp: FilesData) -> list[Shard]:
    return _input_shards(dp, dp.inputs, dp.merge, dp.output_name, OUTPUT_SUFFIX)


@source_shards.register
def _sft_jsonl_shards(dp: SftJsonlData) -> list[Shard]:
    return _input_shards(dp, dp.inputs, dp.merge, dp.output_name, SFT_SUFFIX)


@source_shards.register
def _govreport_shards(dp: GovReportData) -> list[Shard]:
    """Two shards, train and validation, each from its files under base_url in order."""
    out_dir = _output_dir(dp)
    shards: list[Shard] = []
    for split, files in (("train", dp.train_files), ("validation", dp.validation_files)):
        if not files:
            raise ConfigError(f"data_preparation.{split}_files is empty: list the {split} files under base_url")
        name = f"govreport_{split}"
        sources = tuple(_source_at(dp, dp.base_url, str(f)) for f in files)
        shards.append(Shard(len(shards), name, os.path.join(out_dir, name + SFT_SUFFIX), sources))
    return shards


def _input_shards(dp: DataPreparationConfig, inputs: list[str], merge: bool, output_name: str, suffix: str):
    """One shard per input file, or all of them merged into `output_name`."""
    if not inputs:
        raise ConfigError(
            "data_preparation.inputs is empty: list files, globs or URLs, e.g. "
            "'data_preparation.inputs=[/data/corpus/*.jsonl.zst]'"
        )
    uris: list[str] = []
    unmatched: list[str] = []  # all of them in one line: fixing one at a time would take a run each
    for entry in inputs:
        entry = str(entry)
        if is_url(entry):
            matches = [entry]
        else:
            path = _local_path(entry, "inputs")
            matches = sorted(glob.glob(path)) if glob.has_magic(path) else [path]
            matches = [m for m in matches if not os.path.isdir(m)]
            if not matches or not all(os.path.exists(m) for m in matches):
                unmatched.append(entry)
                continue
        uris.extend(m for m in matches if m not in uris)
    if unmatched:
        raise ConfigError(f"data_preparation.inputs: nothing matches {', '.join(unmatched)}")
    sources = [_source(dp, uri) for uri in uris]
    out_dir = _output_dir(dp)
    if merge:
        return [Shard(0, output_name, os.path.join(out_dir, output_name + suffix), tuple(sources))]
    shards = []
    for i, src in enumerate(sources):
        name = strip_extensions(src.file_name)
        shards.append(Shard(i, name, os.path.join(out_dir, name + suffix), (src,)))
    return shards


@inputs_setting.register(PileData)
@inputs_setting.register(C4Data)
@inputs_setting.register(GovReportData)
def _base_url(dp: PileData | C4Data | GovReportData) -> tuple[str, Any]:
    return "base_url", dp.base_url


@inputs_setting.register(FilesData)
@inputs_setting.register(SftJsonlData)
def _files_inputs(dp: FilesData | SftJsonlData) -> tuple[str, Any]:
    return "inputs", dp.inputs


# -- helpers -----------------------------------------------------------------------------------------------


def is_url(uri: str) -> bool:
    """An input to download; anything else is a local path."""
    return uri.startswith(("http://", "https://"))


def _fmt(template: str, n: int, key: str) -> str:
    try:
        return str(template).format(n)
    except (IndexError, KeyError, ValueError) as e:
        raise ConfigError(f"data_preparation.{key}={template!r}: not a format string taking one number ({e})") from None


def _local_path(path: str, key: str) -> str:
    """An absolute path. Relative ones are refused: the launcher plans in one directory and the jobs run in
    another, where the same relative path would name other files."""
    if path.startswith("file://"):
        path = unquote(urlparse(path).path)
    path = os.path.expanduser(path)
    if not os.path.isabs(path):
        raise ConfigError(
            f"data_preparation.{key}: {path!r} is relative; give an absolute path (jobs do not run "
            "in the directory you launch from)"
        )
    return os.path.normpath(path)


def _output_dir(dp: DataPreparationConfig) -> str:
    return _local_path(dp.output_dir, "output_dir")


def _source_at(dp: DataPreparationConfig, base_url: str, file_name: str) -> Source:
    return _source(dp, f"{base_url.rstrip('/')}/{file_name}", "base_url")


def _source(dp: DataPreparationConfig, uri: str, key: str = "inputs") -> Source:
    compression, kind = detect_format(uri, str(dp.format))
    if is_url(uri):
        name = os.path.basename(unquote(urlparse(uri).path))
        if not name:
            raise ConfigError(f"data_preparation: cannot name a download for {uri} (the URL has no file name)")
        local = os.path.join(_local_path(dp.download_dir, "download_dir"), name)
    else:
        uri = local = _local_path(uri, key)
    return Source(uri=uri, local_path=local, compression=compression, kind=kind)
