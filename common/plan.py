"""The plan's record: every size the job needs, as the launcher derived it (launcher/plan/build.py) and wrote it
to the run directory's plan.json; the training side reads it back with load_plan."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
import json
import os
from typing import Any

PLAN_FILE = "plan.json"


class PlanFileError(ValueError):
    """A plan.json this version cannot read; str() is one line naming the file and the fix."""


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
    fp8_dot_product_attention: bool
    tp_comm_overlap: bool
    model_flops_per_sample: float
    est_memory_gib_per_gpu: float
    padded_vocab_size: int
    num_parameters: int
    gpu_type: str | None
    peak_flops_per_gpu: float | None
    peak_flops_kind: str  # which peak MFU divides by: "bf16", "fp8" or "fp4"
    # megatron-core's initialize_model_parallel(order=...) (parallelism.rank_order).
    rank_order: str = "tp-cp-ep-dp-pp"
    # training.cuda_graphs: none, per_layer or full_iteration (the environment and the seeds depend on it).
    cuda_graphs: str = "none"
    # The loss kernel training.model.cross_entropy_fusion resolves to: native, te or none.
    cross_entropy_fusion: str = "native"
    env: dict[str, str] = field(default_factory=dict)
    command: str = ""
    # Why this plan will not train here (e.g. cluster=local on a machine with no GPU); None when it can.
    cannot_train_reason: str | None = None

    def to_json_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json_dict(cls, data: Any, source: str = PLAN_FILE) -> "Plan":
        """The Plan that to_json_dict gave. Every key must be there and no other: a plan.json with others was
        written by another version of the launcher, and a size read wrongly would train something else."""
        if not isinstance(data, dict):
            raise PlanFileError(
                f"{source} does not hold a plan (a JSON object); write the run directory again with python main.py"
            )
        names = [f.name for f in fields(cls)]
        missing = [n for n in names if n not in data]
        unknown = sorted(k for k in data if k not in names)
        if missing or unknown:
            found = ([f"missing {', '.join(missing)}"] if missing else []) + (
                [f"unknown {', '.join(unknown)}"] if unknown else []
            )
            raise PlanFileError(
                f"{source} was written by another version of the launcher ({'; '.join(found)}); "
                "write the run directory again with this version's python main.py"
            )
        return cls(**data)


def load_plan(run_dir: str | os.PathLike) -> Plan:
    """RUN_DIR/plan.json as a Plan; PlanFileError when it is missing, not JSON, or not this version's."""
    path = os.path.join(run_dir, PLAN_FILE)
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        raise PlanFileError(f"{path} does not exist: is {run_dir} a run directory written by python main.py?") from None
    except json.JSONDecodeError as err:
        raise PlanFileError(f"{path} is not JSON ({err}); write the run directory again with python main.py") from None
    return Plan.from_json_dict(data, source=path)
