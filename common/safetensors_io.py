"""The safetensors file format, as the import reads it and the export writes it: an 8-byte little-endian header
length, a JSON header (each tensor's dtype, shape and [begin, end) byte offsets into the data that follows), then
the data; a directory of several files names which file holds each tensor in its index file."""

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
            raw = f.read(length)
    except FileNotFoundError:
        raise SafetensorsFileError(f"{path} is missing: download the checkpoint again") from None
    if len(raw) < length:
        raise SafetensorsFileError(f"{path} is truncated (header cut short): download it again")
    try:
        header = json.loads(raw)
    except json.JSONDecodeError:
        raise SafetensorsFileError(f"{path} is not a safetensors file (unreadable header)") from None
    data_end = max((entry["data_offsets"][1] for name, entry in header.items() if name != METADATA_KEY), default=0)
    size, expected = path.stat().st_size, 8 + length + data_end
    if size < expected:
        raise SafetensorsFileError(
            f"{path} is truncated: {size:,} bytes, its header declares {expected:,}; download it again"
        )
    return header


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
