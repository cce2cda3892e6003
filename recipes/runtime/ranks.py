"""Which rank this process is, from whichever launcher started it (torchrun, srun, mpirun, bcprun): the one place
that reads each platform's variables. No torch: the training entry asks before its stack check."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
import os
import signal
import sys
from typing import Mapping


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
