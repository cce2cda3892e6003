"""The plan's memory estimate against the GPU: rough, but a layout far beyond the GPU's memory is a
misconfiguration, not a tuning question, so it fails here rather than after the queue wait. memory_check=false
accepts the risk. It runs on the derived plan, once every other check has passed."""

from __future__ import annotations

from common.config import Config
from common.plan import Plan
from launcher.plan.findings import Findings
from launcher.plan.sizes import Sizes


def check(cfg: Config, sizes: Sizes, plan: Plan, found: Findings) -> None:
    spec = sizes.spec
    if spec is None or not cfg.memory_check or plan.est_memory_gib_per_gpu <= spec.memory_gib:
        return
    found.problem(
        f"estimated {plan.est_memory_gib_per_gpu} GiB per GPU exceeds the {spec.memory_gib} GiB of "
        f"cluster.gpu_type={spec.name} with parallelism.tp={plan.tp} pp={plan.pp} cp={plan.cp} on "
        f"{plan.num_gpus} GPUs: use more model parallelism (parallelism=<layout>, parallelism.num_gpus), "
        "parallelism.recompute_granularity=full, or memory_check=false"
    )
