"""The safetensors file format, as the import reads it and the export writes it: an 8-byte little-endian header
length, a JSON header (each tensor's dtype, shape and [begin, end) byte offsets into the data that follows), then
the data; a directory of several files names which file holds each tensor in its index file.

Plain Python (no torch): the plan reads an init_from_hf directory's headers on the host, in milliseconds, and the
ranks read them again before importing (recipes/hf/importer.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path
import struct
from typing import Any, Mapping

INDEX_FILE = "model.safetensors.index.json"
# torch dtype name -> the header's dtype code.
DTYPE_CODES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}
METADATA_KEY = "__metadata__"
READABLE_DTYPES = ("BF16", "F16", "F32")  # what the import reads
MAX_HEADER_BYTES = 100 * 2**20  # safetensors' own limit: a larger length is a damaged file, not a header


class SafetensorsFileError(ValueError):
    """A .safetensors file that cannot be read; str() is one line naming the file and the fix."""


def read_header(path: Path) -> dict[str, Any]:
    """The JSON header of a .safetensors file, after checking that the file holds every byte it declares."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise SafetensorsFileError(f"{path} is truncated (no header): download it again")
            (length,) = struct.unpack("<Q", head)
            if length > MAX_HEADER_BYTES:
                raise SafetensorsFileError(f"{path} is not a safetensors file (unreadable header): download it again")
            raw = f.read(length)
    except FileNotFoundError:
        raise SafetensorsFileError(f"{path} is missing: download the checkpoint again") from None
    if len(raw) < length:
        raise SafetensorsFileError(f"{path} is truncated (header cut short): download it again")
    try:
        header = json.loads(raw)
        data_end = max((_data_offsets(entry)[1] for name, entry in header.items() if name != METADATA_KEY), default=0)
    except (ValueError, AttributeError, TypeError, KeyError):
        raise SafetensorsFileError(f"{path} is not a safetensors file (unreadable header): download it again") from None
    size, expected = path.stat().st_size, 8 + length + data_end
    if size < expected:
        raise SafetensorsFileError(
            f"{path} is truncated: {size:,} bytes, its header declares {expected:,}; download it again"
        )
    return header


def _data_offsets(entry: Mapping[str, Any]) -> tuple[int, int]:
    begin, end = entry["data_offsets"]
    if not (isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end):
        raise ValueError(entry)
    return begin, end


class SafetensorsFiles:
    """A Hugging Face model directory's safetensors files: which file holds each tensor, and each tensor's dtype
    and shape from the headers (no tensor data is read). Errors are SafetensorsFileError, one line each."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        self._headers: dict[str, dict[str, Any]] = {}
        self.weight_map = self._weight_map()

    def _weight_map(self) -> dict[str, str]:
        index = self.directory / INDEX_FILE
        files = sorted(p.name for p in self.directory.glob("*.safetensors"))
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (ValueError, KeyError, TypeError):
                raise SafetensorsFileError(
                    f"{index} is not a safetensors index (no weight_map); download it again"
                ) from None
            missing = sorted({f for f in weight_map.values() if not (self.directory / f).is_file()})
            if missing:
                raise SafetensorsFileError(
                    f"{self.directory}: {INDEX_FILE} names {', '.join(missing)}, which "
                    f"{'is' if len(missing) == 1 else 'are'} missing; download the checkpoint again"
                )
            return dict(weight_map)
        if len(files) == 1:
            names = self.header(files[0])
            return {name: files[0] for name in names if name != METADATA_KEY}
        if not files:
            raise SafetensorsFileError(
                f"{self.directory} has no *.safetensors files (only safetensors checkpoints are read; convert "
                ".bin/.pth weights with transformers' save_pretrained first)"
            )
        raise SafetensorsFileError(
            f"{self.directory} has {len(files)} *.safetensors files but no {INDEX_FILE}: download the index too"
        )

    def header(self, file: str) -> dict[str, Any]:
        if file not in self._headers:
            self._headers[file] = read_header(self.directory / file)
        return self._headers[file]

    def entry(self, name: str) -> dict[str, Any]:
        if name not in self.weight_map:
            raise SafetensorsFileError(f"{self.directory} has no tensor {name}; is it a Llama checkpoint of this size?")
        file = self.weight_map[name]
        header = self.header(file)
        if name not in header:
            raise SafetensorsFileError(
                f"{self.directory / file} has no tensor {name} although {INDEX_FILE} says so; download it again"
            )
        return header[name]

    def check(self, expected: Mapping[str, tuple[int, ...]]) -> None:
        """Every tensor the model needs is there, complete, with its shape and a dtype the import reads (one
        line naming the first that is not)."""
        for name, shape in expected.items():
            entry = self.entry(name)
            found = tuple(entry["shape"])
            if found != tuple(shape):
                raise SafetensorsFileError(
                    f"{self.directory}: {name} has shape {list(found)}, training.model needs {list(shape)}"
                )
            if entry["dtype"] not in READABLE_DTYPES:
                raise SafetensorsFileError(
                    f"{self.directory}: {name} is {entry['dtype']}; only {', '.join(READABLE_DTYPES)} weights are "
                    "read (convert the checkpoint with transformers first)"
                )


def encode_header(names: list[str], shapes: Mapping[str, tuple[int, ...]], dtype: str, itemsize: int) -> bytes:
    """The header of a safetensors file holding `names` in this order (contiguous, no gaps), length included."""
    header: dict[str, Any] = {METADATA_KEY: {"format": "pt"}}
    offset = 0
    for name in names:
        end = offset + itemsize * math.prod(shapes[name])
        header[name] = {"dtype": DTYPE_CODES[dtype], "shape": list(shapes[name]), "data_offsets": [offset, end]}
        offset = end
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned
    return struct.pack("<Q", len(raw)) + raw
