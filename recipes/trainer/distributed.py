"""Process-group setup: ranks from whichever launcher started this process (torchrun, srun, mpirun, bcprun)."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
import os
import sys
from typing import Mapping

from common.plan import Plan


@dataclass(frozen=True)
class RankInfo:
    rank: int
    local_rank: int
    world_size: int
    master_addr: str
    master_port: int


# (launcher, rank, local rank, world size), first match wins. torchrun's variables come first: Kubernetes pods
# run torchrun, and bcprun with --array-type PYTORCH sets the same ones; srun tasks on Slurm; mpirun ranks on
# Grid Engine (and bcprun with --array-type MPI) carry Open MPI's, MPICH's or Intel MPI's.
RANK_VARIABLES = (
    ("torchrun", "RANK", "LOCAL_RANK", "WORLD_SIZE"),
    ("srun", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS"),
    ("Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("MPICH / Intel MPI", "PMI_RANK", "MPI_LOCALRANKID", "PMI_SIZE"),
)


def die_with_torchrun(env: Mapping[str, str] = os.environ) -> bool:
    """Under torchrun, have the kernel kill this rank when its torchrun agent dies. torchrun starts each rank in a
    session of its own, so a launcher killed hard (SIGKILL, the OOM killer) would otherwise leave the ranks running
    on the GPUs, stalled on their lost peers or still training, holding memory the next run needs. srun and
    mpirun end their tasks themselves. Returns whether it applies (Linux, under torchrun)."""
    if "TORCHELASTIC_RUN_ID" not in env or not sys.platform.startswith("linux"):
        return False
    import ctypes
    import signal

    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_pdeathsig = 1
    if libc.prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0) != 0:
        return False
    if os.getppid() != parent:  # the agent died before the request took effect
        os.kill(os.getpid(), signal.SIGKILL)
    return True


def rank_info(env: Mapping[str, str] = os.environ) -> RankInfo:
    """This process's rank, local rank and world size, and the rendezvous address: MASTER_ADDR/MASTER_PORT as the
    job script exports them (torchrun and bcprun set them too), else NGC_MASTER_ADDR on Base Command. A plain
    `python -m recipes.train` is a world of one."""
    rank, local, world = 0, 0, 1
    for _, rank_key, local_key, world_key in RANK_VARIABLES:
        if rank_key in env:
            rank, local, world = int(env[rank_key]), int(env.get(local_key, 0)), int(env[world_key])
            break
    addr = env.get("MASTER_ADDR") or env.get("NGC_MASTER_ADDR") or "127.0.0.1"
    return RankInfo(rank, local, world, addr, int(env.get("MASTER_PORT", 29500)))


def initialize(plan: Plan, seed: int) -> RankInfo:
    import torch
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    info = rank_info()
    if info.world_size != plan.num_gpus:
        raise SystemExit(f"plan.json expects {plan.num_gpus} ranks but this job started {info.world_size}; "
                         "launch with the command in plan.json")
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU is visible to this process; the training recipe needs one GPU per rank")
    torch.cuda.set_device(info.local_rank)
    torch.distributed.init_process_group(
        backend="nccl", init_method=f"tcp://{info.master_addr}:{info.master_port}", rank=info.rank,
        world_size=info.world_size, timeout=timedelta(minutes=30),
        device_id=torch.device("cuda", info.local_rank))
    ps.initialize_model_parallel(
        tensor_model_parallel_size=plan.tp,
        pipeline_model_parallel_size=plan.pp,
        virtual_pipeline_model_parallel_size=plan.vp,
        context_parallel_size=plan.cp,
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
