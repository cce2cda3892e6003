"""Checks the launcher makes while planning a run (dry runs included, on every platform): the data_preparation
settings before any job is written, and prepared .bin/.idx pairs before training is submitted.

Both return one line per problem, naming the config key, the value and the fix, and raise nothing. They are
fast: a few stat calls and a few header bytes per prefix, never a whole file. Standard library only at import
(the launcher has no torch); a tokenizer is loaded only to compare it with the one data was made with, and
only when the two are not plainly the same setting.
"""

from __future__ import annotations

import gzip
import json
import os
import struct
import sys
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence, Union

from common.config import DataPreparationConfig, SftJsonlData, TokenizerConfig
from data_prep.config import settings_and_shards
from data_prep.shards import MARKER_SUFFIX, Shard, inputs_setting
from data_prep.tokenizer import TOKENIZER_TYPES, TokenizerError, is_hub_id, load_tokenizer

# megatron-core's .idx layout (megatron/core/datasets/indexed_dataset.py, _IndexWriter): magic, version
# (<Q, 1), dtype code (<B), sequence count (<Q), document count (<Q), then int32 sequence lengths, int64
# sequence pointers (byte offsets into the .bin), int64 document indices, and for multimodal data one int8
# mode per sequence.
INDEX_MAGIC = b"MMIDIDX\x00\x00"
INDEX_HEADER = struct.Struct("<9sQBQQ")
# megatron-core's DType codes -> (numpy name, bytes per token).
INDEX_DTYPES = {
    1: ("uint8", 1),
    2: ("int8", 1),
    3: ("int16", 2),
    4: ("int32", 4),
    5: ("int64", 8),
    6: ("float64", 8),
    7: ("float32", 4),
    8: ("uint16", 2),
}
_REDO = "prepare it again (the data_preparation stage; python -m data_prep run --force if it says already done)"
_Ids = Optional[tuple[int, int]]  # a tokenizer's (vocab size, eod id), None where it cannot be loaded here


@dataclass(frozen=True)
class IndexHeader:
    dtype: str
    itemsize: int
    sequences: int
    documents: int  # entries of the document index: documents + 1


# -- the data_preparation section ----------------------------------------------------------------------------


def preparation_problems(dp: DataPreparationConfig) -> list[str]:
    """Every problem with a data_preparation section that would stop its jobs: settings (tokenizer, workers,
    chunk_bytes, ...), the shard layout (inputs, file numbers, paths) and local inputs that are not there."""
    problems, shards = settings_and_shards(dp)
    return _unique(problems + _missing_sources(dp, shards) + _first_samples_problems(dp, shards))


def _missing_sources(dp: DataPreparationConfig, shards: Sequence[Shard]) -> list[str]:
    """Local inputs (a mirror under base_url, files) of shards not finished yet that do not exist."""
    missing, total = [], 0
    for shard in shards:
        if os.path.exists(shard.output_prefix + MARKER_SUFFIX):
            continue  # finished: its inputs are not read again
        for src in shard.sources:
            if not src.remote:
                total += 1
                if not os.path.isfile(src.local_path):
                    missing.append(src.local_path)
    if not missing:
        return []
    key, value = inputs_setting(dp)
    return [
        f"data_preparation.{key}={value}: {len(missing)} of the {total} local input files do not exist "
        f"(first: {missing[0]}); fix data_preparation.{key} or put the files there"
    ]


# The plan looks at the samples in the first 64 KiB of each input: a wrong prompt_key or response_key shows in the
# first sample, and the whole file is checked while it is prepared (data_prep.sft).
FIRST_SAMPLES_BYTES = 1 << 16


def _first_samples_problems(dp: DataPreparationConfig, shards: Sequence[Shard]) -> list[str]:
    """sft_jsonl: the first problem among the first samples of local inputs not prepared yet (the same wrong key
    would be reported for every file). zstd inputs are left to the run: the standard library cannot read them."""
    if not isinstance(dp, SftJsonlData):
        return []
    for shard in shards:
        if os.path.exists(shard.output_prefix + MARKER_SUFFIX):
            continue
        for src in shard.sources:
            if src.remote or src.compression == "zstd" or not os.path.isfile(src.local_path):
                continue
            problem = _first_samples_problem(dp, src.local_path, src.compression == "gzip")
            if problem:
                return [problem]
    return []


def _first_samples_problem(dp: SftJsonlData, path: str, gzipped: bool) -> Optional[str]:
    try:
        with gzip.open(path, "rb") if gzipped else open(path, "rb") as f:
            head = f.read(FIRST_SAMPLES_BYTES)
    except (OSError, EOFError):
        return None  # the run names an unreadable input
    lines = head.split(b"\n")
    if len(head) == FIRST_SAMPLES_BYTES:
        lines = lines[:-1]  # cut at the limit
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        where = f"{path}:{number}: sample {number - 1}"
        try:
            sample = json.loads(raw)
        except ValueError:
            sample = None
        if not isinstance(sample, dict):
            return f"data_preparation.inputs: {where} is not a JSON object"
        for setting, key in (("prompt_key", dp.prompt_key), ("response_key", dp.response_key)):
            if key not in sample:
                return (
                    f"data_preparation.{setting}={key}: {where} has no {key!r} field (its fields: "
                    f"{', '.join(sorted(sample)) or 'none'}); set data_preparation.{setting} to the field that holds it"
                )
        response = sample[dp.response_key]
        if isinstance(response, str) and not response.strip():
            return (
                f"data_preparation.inputs: {where} has an empty response ({dp.response_key!r}): nothing to train on; "
                "remove it or fix the field"
            )
    return None


def _unique(lines: list[str]) -> list[str]:
    return list(dict.fromkeys(lines))  # a value two checks look at is reported once


# -- prepared data -----------------------------------------------------------------------------------------


def prepared_data_problems(key: str, prefixes: Sequence[str], tokenizer: TokenizerConfig) -> list[str]:
    """One line per prefix (of `key`, e.g. training.data.blend) whose .bin/.idx pair training could not use:
    missing, empty or damaged files, an index that does not match its data, or data made with a tokenizer of
    another vocabulary size or EOD id than `tokenizer` (training.tokenizer)."""
    problems: list[str] = []
    cache: dict[str, Union[_Ids, str]] = {}  # the training tokenizer, loaded at most once
    for prefix in prefixes:
        problem = pair_problem(prefix)
        if problem:
            problems.append(f"{key}: {problem}")
            continue
        problem = _tokenizer_mismatch(key, prefix, tokenizer, cache)
        if problem:
            problems.append(problem)
    return _unique(problems)


def pair_problem(prefix: str) -> Optional[str]:
    """What is wrong with `<prefix>.bin/.idx` (without the config key), or None when the sizes agree."""
    sizes = {ext: os.path.getsize(prefix + ext) for ext in (".idx", ".bin") if os.path.isfile(prefix + ext)}
    if len(sizes) < 2:
        missing = "/".join(e for e in (".bin", ".idx") if e not in sizes)
        return (
            f"no {prefix}{missing}; run the data_preparation stage first (stages=[data_preparation,training]) "
            "or fix the prefix"
        )
    try:
        with open(prefix + ".idx", "rb") as f:
            header = read_index_header(f, sizes[".idx"])
            needed = _data_bytes(f, header)
    except IndexFormatError as e:
        return f"{prefix}.idx {e}; {_REDO}"
    except OSError as e:
        return f"{prefix}.idx cannot be read ({e.strerror})"
    if sizes[".bin"] != needed:
        state = "is empty" if sizes[".bin"] == 0 else f"has {sizes['.bin']:,} bytes"
        return (
            f"{prefix}.bin {state}, its .idx says {needed:,} (truncated, or the two come from different runs); {_REDO}"
        )
    return None


def sample_lengths(prefix: str) -> list[int]:
    """The tokens of every sequence (for fine-tuning data: every sample) of `<prefix>.idx`, in order: 4 bytes a
    sample, read whole (a million samples are 4 MB). IndexFormatError or OSError for an unreadable index."""
    import array

    size = os.path.getsize(prefix + ".idx")
    with open(prefix + ".idx", "rb") as f:
        header = read_index_header(f, size)
        lengths = array.array("i")
        lengths.frombytes(f.read(4 * header.sequences))
    if sys.byteorder != "little":
        lengths.byteswap()
    return lengths.tolist()


def longer_samples_problem(key: str, prefixes: Sequence[str], seq_length: int) -> Optional[str]:
    """training.data.truncate=false: one line naming the first sample longer than seq_length (its prefix and
    index), None when every sample fits. Only a sample's own length says it, so this reads every index whole."""
    for prefix in prefixes:
        try:
            lengths = sample_lengths(prefix)
        except (IndexFormatError, OSError):
            continue  # pair_problem reports it
        for index, length in enumerate(lengths):
            if length > seq_length:
                return (
                    f"{key}: sample {index} of {prefix} has {length:,} tokens, more than training.seq_length="
                    f"{seq_length}, and training.data.truncate=false; set training.data.truncate=true to cut such "
                    "samples, or prepare the data with data_preparation.max_length (and truncate)"
                )
    return None


class IndexFormatError(ValueError):
    """An .idx file that is not what megatron-core writes; the message says how it differs."""


def read_index_header(f, size: int) -> IndexHeader:
    """The header of an open .idx file of `size` bytes, checked against its own size."""
    if size == 0:
        raise IndexFormatError("is empty (0 bytes)")
    raw = f.read(INDEX_HEADER.size)
    if len(raw) < INDEX_HEADER.size or not raw.startswith(INDEX_MAGIC):
        raise IndexFormatError(f"is not a megatron index (it starts with {raw[:9]!r}, not {INDEX_MAGIC!r})")
    _, version, code, sequences, documents = INDEX_HEADER.unpack(raw)
    if version != 1:
        raise IndexFormatError(f"has index version {version}; megatron-core reads version 1")
    if code not in INDEX_DTYPES:
        raise IndexFormatError(f"has an unknown dtype code {code} (megatron-core's are 1-8)")
    # The sequence modes (one byte per sequence) follow only in multimodal indexes; both layouts are megatron's.
    plain = INDEX_HEADER.size + 12 * sequences + 8 * documents
    if size not in (plain, plain + sequences):
        raise IndexFormatError(
            f"has {size:,} bytes, its header ({sequences:,} sequences, {documents:,} document "
            f"entries) needs {plain:,} (truncated or damaged)"
        )
    if sequences == 0 or documents < 2:
        raise IndexFormatError("holds no documents (prepared from empty inputs?)")
    return IndexHeader(INDEX_DTYPES[code][0], INDEX_DTYPES[code][1], sequences, documents)


def _data_bytes(f, h: IndexHeader) -> int:
    """The .bin size the index describes: the last sequence's pointer plus its length in tokens. Reads four
    numbers at known offsets, never the arrays."""
    lengths = INDEX_HEADER.size
    pointers = lengths + 4 * h.sequences
    docs = pointers + 8 * h.sequences
    last_length = _read(f, lengths + 4 * (h.sequences - 1), "<i")
    last_pointer = _read(f, pointers + 8 * (h.sequences - 1), "<q")
    first_doc, last_doc = _read(f, docs, "<q"), _read(f, docs + 8 * (h.documents - 1), "<q")
    if first_doc != 0 or last_doc != h.sequences:
        raise IndexFormatError(f"has document indices {first_doc}..{last_doc}, not 0..{h.sequences} (damaged)")
    if last_length < 0 or last_pointer < 0 or last_pointer % h.itemsize:
        raise IndexFormatError(f"has a damaged last entry (pointer {last_pointer}, length {last_length})")
    return last_pointer + last_length * h.itemsize


def _read(f, offset: int, fmt: str) -> int:
    f.seek(offset)
    return struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]


# -- the tokenizer the data was made with ------------------------------------------------------------------


def _tokenizer_mismatch(key: str, prefix: str, tokenizer: TokenizerConfig, cache: dict) -> Optional[str]:
    """A line when `<prefix>.done.json` records a tokenizer whose vocabulary size or EOD id differ from the
    training tokenizer's. Data without a marker (made elsewhere) is not compared."""
    made = _recorded_tokenizer(prefix)
    if made is None or _same_setting(made, tokenizer):
        return None
    if "ids" not in cache:
        cache["ids"] = _training_ids(tokenizer)
    ids = cache["ids"]
    if ids is None or isinstance(ids, str):
        return ids  # cannot be loaded here (skipped), or one line about training.tokenizer itself
    if ids == (made["vocab_size"], made["eod"]):
        return None
    return (
        f"{key}: {prefix} was tokenized with another tokenizer: {made['type']}:{made['path']} (vocab "
        f"{made['vocab_size']}, eod {made['eod']}), training.tokenizer is {tokenizer.type}:"
        f"{tokenizer.path} (vocab {ids[0]}, eod {ids[1]}); prepare the data with training's tokenizer "
        "or set training.tokenizer to the one the data was made with"
    )


def _recorded_tokenizer(prefix: str) -> Optional[dict]:
    try:
        with open(prefix + MARKER_SUFFIX, encoding="utf-8") as f:
            made = json.load(f).get("tokenizer")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(made, dict) or not all(k in made for k in ("type", "path", "vocab_size", "eod")):
        return None
    return made


def _same_setting(made: Mapping[str, Any], tokenizer: TokenizerConfig) -> bool:
    """The same type and the same path (a hub id, or one local file or directory): no need to load it."""
    return made["type"] == tokenizer.type and _where(made["path"]) == _where(tokenizer.path)


def _where(path: Any) -> str:
    local = os.path.expanduser(str(path))
    return os.path.realpath(local) if os.path.exists(local) else str(path)


def _training_ids(tokenizer: TokenizerConfig) -> Union[_Ids, str]:
    """(vocab size, eod) of the training tokenizer; None where it cannot be had here without a download (a hub
    id outside the local cache, a missing library); a line when the tokenizer itself is unusable."""
    kind, path = str(tokenizer.type), tokenizer.path
    if kind not in TOKENIZER_TYPES or not path:
        return None  # the plan reports training.tokenizer's own problems
    local = os.path.expanduser(path)
    if not os.path.exists(local):
        cached = _cached_hub_file(path, kind) if is_hub_id(path) else None
        if cached is None:
            return None
        local = cached
    try:
        tok = load_tokenizer(kind, local, key="training.tokenizer")
    except ImportError:
        return None
    except TokenizerError as e:
        return f"training.tokenizer: cannot be loaded to compare it with the data's tokenizer: {e}"
    return tok.vocab_size, tok.eod


def _cached_hub_file(repo_id: str, kind: str) -> Optional[str]:
    """The tokenizer file of a hub id in the local Hugging Face cache, or None; never asks the network."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    found = try_to_load_from_cache(repo_id, "tokenizer.json" if kind == "huggingface" else "tokenizer.model")
    return found if isinstance(found, str) else None
