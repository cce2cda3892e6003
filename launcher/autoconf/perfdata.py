"""Measured and published training throughput (conf/perf/): the rows the step-time model is fit to and the tests
hold the memory estimate to (measured.yaml), and NVIDIA's published H100 results the benchmark compares with
(nvidia_h100.yaml)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from common.config import ModelConfig
from common.plan import Plan
from launcher.config.compose import CONF_DIR
from launcher.plan.formulas import model_flops_per_sample
from launcher.plan.hardware import gpu_spec

PERF_DIR = CONF_DIR / "perf"
MEASURED = PERF_DIR / "measured.yaml"
NVIDIA_H100 = PERF_DIR / "nvidia_h100.yaml"
# A measured row's `split`: the step-time constants are fit to the `fit` rows only, so the `held_out` ones measure
# how the model does on runs it was not fit to.
SPLITS = ("fit", "held_out")


def measured_rows(path: Path = MEASURED) -> list[dict[str, Any]]:
    """The runs with a measurement: the rows the step-time model is fit to and the tests hold it to."""
    return yaml.safe_load(path.read_text())["rows"]


def pending_rows(path: Path = MEASURED) -> list[dict[str, Any]]:
    """Cases planned for measurement whose numbers are not in yet (measured.yaml's `pending`): predicted only."""
    return yaml.safe_load(path.read_text()).get("pending") or []


def rows_from_files(paths: Sequence[Path | str]) -> list[dict[str, Any]]:
    """Measured rows from files of them: bench/autoconf_cases.py's measured_rows.yaml / .json (a list of rows) or a
    measured.yaml (its `rows`); entries without a measurement (pending ones) are left out. A file of anything else is
    a ValueError naming it."""
    rows: list[dict[str, Any]] = []
    for path in paths:
        try:
            data = yaml.safe_load(Path(path).read_text())  # JSON is YAML too
        except (OSError, yaml.YAMLError) as err:
            raise ValueError(f"{path}: not a file of measured rows ({err})") from None
        data = data.get("rows") if isinstance(data, dict) else data
        if not isinstance(data, list) or not all(isinstance(r, dict) and "name" in r for r in data):
            raise ValueError(f"{path}: not a file of measured rows (a list of rows, or measured.yaml's `rows`)")
        rows += [r for r in data if is_measured(r)]
    return rows


def row_split(row: Mapping[str, Any]) -> str:
    """The row's split; a row without one (or with another word) is an error naming it, so a row pasted into
    measured.yaml cannot silently join either side."""
    split = row.get("split")
    if split not in SPLITS:
        raise ValueError(f"{MEASURED.name} row {row.get('name')!r}: split={split!r} must be one of {', '.join(SPLITS)}")
    return str(split)


def is_measured(row: Mapping[str, Any]) -> bool:
    return any(row.get(k) for k in ("tokens_per_s_per_gpu", "step_time_s", "mfu_bf16"))


def row_overrides(row: Mapping[str, Any]) -> list[str]:
    """main.py overrides that plan a measured row as it ran (the GPU type and node size of that machine)."""
    return [
        *row["overrides"],
        "cluster=bcm",
        f"cluster.gpu_type={row['gpu']}",
        f"cluster.gpus_per_node={row['gpus_per_node']}",
        f"training.global_batch_size={row['global_batch_size']}",
        "memory_check=false",
    ]


def measured_tokens_per_s_per_gpu(row: Mapping[str, Any], plan: Plan) -> float:
    """The row's throughput; rows recorded as a step time or as MFU (bf16 peak) are converted with the plan's batch
    and FLOPs per sample."""
    if row.get("tokens_per_s_per_gpu"):
        return float(row["tokens_per_s_per_gpu"])
    if row.get("step_time_s"):
        return plan.global_batch_size * plan.seq_length / float(row["step_time_s"]) / plan.num_gpus
    peak = gpu_spec(row["gpu"]).bf16_peak_flops  # the GPU it was measured on, the plan's gpu_type
    return row["mfu_bf16"] * peak * plan.seq_length / plan.model_flops_per_sample


@dataclass(frozen=True)
class Reference:
    """One of NVIDIA's published rows."""

    model: str
    dtype: str
    gpus: int
    layout: str
    tokens_per_s_per_gpu: float
    source: str
    gpu: str
    seq_length: int

    def mfu(self, model_cfg: ModelConfig, peak: str = "bf16") -> float:
        """MFU of the published throughput with the plan's FLOPs formula (model_cfg: the full model's
        architecture), against the bf16 or fp8 peak of the GPU it ran on."""
        spec = gpu_spec(self.gpu)
        flops = self.tokens_per_s_per_gpu / self.seq_length * model_flops_per_sample(model_cfg, self.seq_length)
        peak_flops = spec.fp8_peak_flops if peak == "fp8" else spec.bf16_peak_flops
        if peak_flops is None:
            raise ValueError(f"{self.gpu} has no {peak} peak")
        return flops / peak_flops


def training_model(model: str) -> ModelConfig:
    """The architecture of a training config by plan.json's name (llama31_70b -> conf/training/llama31/70b.yaml):
    the full model, also for a run that overrode its layer count."""
    from launcher.config.compose import compose

    family, _, size = model.partition("_")
    return compose([f"training={family}/{size}"]).training.model


def nvidia_reference(model: str, dtype: str, path: Path = NVIDIA_H100) -> Reference | None:
    """NVIDIA's row for this model (plan.json's `model`, e.g. llama31_70b) and dtype; None when there is none."""
    published = yaml.safe_load(path.read_text())
    for row in published["rows"]:
        if row["model"] == model and row["dtype"] == dtype:
            return Reference(
                row["model"],
                row["dtype"],
                row["gpus"],
                row["layout"],
                float(row["tokens_per_s_per_gpu"]),
                row["source"],
                published["gpu"],
                published["seq_length"],
            )
    return None
