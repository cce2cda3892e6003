"""training.cuda_graphs: the combinations megatron-core refuses to capture, and what a capture needs."""

from __future__ import annotations

from common.config import Config, CudaGraphs, Recompute
from launcher.plan.findings import Findings
from launcher.plan.sizes import Sizes


def check(cfg: Config, sizes: Sizes, found: Findings) -> None:
    train, par = cfg.training, cfg.parallelism
    mode, warmup = train.cuda_graphs, train.cuda_graph_warmup_steps
    if mode == CudaGraphs.none:
        return
    if warmup == 0:
        # The trainer's first step runs without the parameter all-gather hooks (a bad load then fails loudly
        # rather than spreading); a graph captured in it would replay every later step without them.
        found.problem(
            f"training.cuda_graph_warmup_steps=0 with training.cuda_graphs={mode}: the first step runs "
            "without the parameter all-gather hooks, which a graph captured in it would lack; set "
            "training.cuda_graph_warmup_steps=1 or more"
        )
    if mode == CudaGraphs.per_layer and par.recompute_granularity == Recompute.full:
        found.problem(
            "training.cuda_graphs=per_layer with parallelism.recompute_granularity=full: megatron-core "
            "graphs full recomputation only inside a full-iteration graph; use "
            "training.cuda_graphs=full_iteration or parallelism.recompute_granularity=selective"
        )
    register = cfg.cluster.env.get("NCCL_GRAPH_REGISTER")
    if register is not None and str(register) != "0":
        found.problem(
            f"cluster.env.NCCL_GRAPH_REGISTER={register} with training.cuda_graphs={mode}: graphs with "
            "the expandable-segments allocator need NCCL_GRAPH_REGISTER=0 (megatron-core refuses them "
            "otherwise), which the plan sets; remove it from cluster.env"
        )
