"""Process-group setup: ranks from torchrun or, when it did not start us, from Slurm's task variables."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
import os
from typing import Mapping


@dataclass(frozen=True)
class RankInfo:
    rank: int
    local_rank: int
    world_size: int
    master_addr: str
    master_port: int


def rank_info(env: Mapping[str, str] = os.environ) -> RankInfo:
    """torchrun sets RANK/LOCAL_RANK/WORLD_SIZE; srun sets SLURM_PROCID/SLURM_LOCALID/SLURM_NTASKS and the job
    script exports MASTER_ADDR/MASTER_PORT. A plain `python -m recipes.train` is a world of one."""
    if "RANK" in env:
        rank, local, world = int(env["RANK"]), int(env.get("LOCAL_RANK", 0)), int(env["WORLD_SIZE"])
    elif "SLURM_PROCID" in env:
        rank, local, world = int(env["SLURM_PROCID"]), int(env.get("SLURM_LOCALID", 0)), int(env["SLURM_NTASKS"])
    else:
        rank, local, world = 0, 0, 1
    return RankInfo(rank, local, world, env.get("MASTER_ADDR", "127.0.0.1"), int(env.get("MASTER_PORT", 29500)))


def initialize(plan: Mapping, seed: int) -> RankInfo:
    import torch
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    info = rank_info()
    if info.world_size != plan["num_gpus"]:
        raise SystemExit(f"plan.json expects {plan['num_gpus']} ranks but this job started {info.world_size}; "
                         "launch with the command in plan.json")
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU is visible to this process; the training recipe needs one GPU per rank")
    torch.cuda.set_device(info.local_rank)
    torch.distributed.init_process_group(
        backend="nccl", init_method=f"tcp://{info.master_addr}:{info.master_port}", rank=info.rank,
        world_size=info.world_size, timeout=timedelta(minutes=30),
        device_id=torch.device("cuda", info.local_rank))
    ps.initialize_model_parallel(
        tensor_model_parallel_size=plan["tp"],
        pipeline_model_parallel_size=plan["pp"],
        virtual_pipeline_model_parallel_size=plan["vp"],
        context_parallel_size=plan["cp"],
    )
    model_parallel_cuda_manual_seed(seed)
    return info


def any_rank(flag: bool) -> bool:
    """True on every rank when `flag` is true on at least one: how ranks agree to stop together."""
    import torch

    tensor = torch.tensor([int(flag)], dtype=torch.int32, device="cuda")
    torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX)
    return bool(tensor.item())


def shutdown() -> None:
    import torch
    from megatron.core import parallel_state as ps

    if torch.distributed.is_initialized():
        ps.destroy_model_parallel()
        torch.distributed.destroy_process_group()
