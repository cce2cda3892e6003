"""The plan's record: every size the job needs, as the launcher derived it (launcher/plan/build.py) and wrote it
to the run directory's plan.json."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Plan:
    model: str
    dtype: str
    num_gpus: int
    num_nodes: int
    gpus_per_node: int
    tp: int
    pp: int
    cp: int
    vp: int | None
    dp: int
    sequence_parallel: bool
    micro_batch_size: int
    global_batch_size: int
    num_microbatches: int
    seq_length: int
    layers_per_pipeline_stage: list[int]
    asymmetric_pipeline: bool
    fp8: str | None
    fp8_param_gather: bool
    tp_comm_overlap: bool
    model_flops_per_sample: float
    est_memory_gib_per_gpu: float
    padded_vocab_size: int
    num_parameters: int
    gpu_type: str | None
    peak_flops_per_gpu: float | None
    peak_flops_kind: str  # which peak MFU divides by: "bf16" or "fp8"
    env: dict[str, str] = field(default_factory=dict)
    command: str = ""
    # Why this plan will not train here (e.g. cluster=local on a machine with no GPU); None when it can.
    cannot_train_reason: str | None = None

    def to_json_dict(self) -> dict[str, Any]:
        return asdict(self)
