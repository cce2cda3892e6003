"""Process groups: torch.distributed over NCCL and megatron-core's model-parallel groups, from the plan's layout."""

from __future__ import annotations

from datetime import timedelta

from megatron.core import parallel_state as ps
from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed
import torch

from common.plan import Plan
from recipes.runtime.ranks import RankInfo, rank_info


def initialize(plan: Plan, seed: int) -> RankInfo:
    info = rank_info()
    if info.world_size != plan.num_gpus:
        raise SystemExit(
            f"plan.json expects {plan.num_gpus} ranks but this job started {info.world_size}; "
            "launch with the command in plan.json"
        )
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU is visible to this process; the training recipe needs one GPU per rank")
    torch.cuda.set_device(info.local_rank)
    torch.distributed.init_process_group(
        backend="nccl",
        init_method=f"tcp://{info.master_addr}:{info.master_port}",
        rank=info.rank,
        world_size=info.world_size,
        timeout=timedelta(minutes=30),
        device_id=torch.device("cuda", info.local_rank),
    )
    initialize_model_parallel(plan)
    graphs = plan.cuda_graphs != "none"
    # CUDA graphs need graph-safe RNG states (registered with every captured graph), as Megatron-LM seeds them.
    model_parallel_cuda_manual_seed(seed, te_rng_tracker=graphs, use_cudagraphable_rng=graphs)
    if plan.cuda_graphs == "per_layer":
        # Work on the legacy default stream synchronises with every other stream, which a capture in progress
        # forbids; Megatron-LM moves the process off it before Transformer Engine captures its graphs.
        torch.cuda.set_stream(torch.cuda.Stream())
    return info


def model_parallel_kwargs(plan: Plan) -> dict:
    """megatron-core's initialize_model_parallel arguments for the plan's layout and rank order."""
    return dict(
        tensor_model_parallel_size=plan.tp,
        pipeline_model_parallel_size=plan.pp,
        virtual_pipeline_model_parallel_size=plan.vp,
        context_parallel_size=plan.cp,
        order=plan.rank_order,
    )


def initialize_model_parallel(plan: Plan) -> None:
    ps.initialize_model_parallel(**model_parallel_kwargs(plan))


def shutdown() -> None:
    if torch.distributed.is_initialized():
        ps.destroy_model_parallel()
        torch.distributed.destroy_process_group()
