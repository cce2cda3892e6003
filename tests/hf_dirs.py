"""Hugging Face model directories for tests that plan without weights: a config.json and one model.safetensors whose
header holds every tensor of a model, as a sparse file of the full size (the plan reads headers and sizes only)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from common import hf_config, safetensors_io
from common.config import ModelConfig


def write_hf_dir(directory: Path, config: dict, model: ModelConfig) -> Path:
    """`config` as config.json, and the tensors of `model` (training.model's shapes) in model.safetensors."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    shapes = hf_config.hf_shapes(model)
    header = safetensors_io.encode_header(list(shapes), shapes, "bfloat16", 2)
    with open(directory / "model.safetensors", "wb") as f:
        f.write(header)
        f.truncate(len(header) + 2 * sum(math.prod(shape) for shape in shapes.values()))
    return directory
