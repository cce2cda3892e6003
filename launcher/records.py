"""Records read from disk (events.jsonl, metrics.jsonl, plan.json, conf/perf/*.yaml) as small dataclasses: parsed
once where they are read, attributes after that."""

from __future__ import annotations

from dataclasses import MISSING, fields
from typing import Any, Mapping, TypeVar

Record = TypeVar("Record")


def from_record(cls: type[Record], record: Mapping[str, Any]) -> Record:
    """An instance of the dataclass `cls` from a JSON or YAML object: each field from the key of its name. A field
    with a default may be absent (older run directories lack it); one without raises KeyError like a read by key.
    Keys the class does not name are left out."""
    values = {
        f.name: record[f.name]
        if f.default is MISSING and f.default_factory is MISSING
        else record.get(f.name, f.default)
        for f in fields(cls)  # type: ignore[arg-type]
    }
    return cls(**values)
