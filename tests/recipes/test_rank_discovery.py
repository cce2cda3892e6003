"""Rank discovery on every platform: the variables each launcher sets, as a rank sees them, give the rank, the
local rank, the world size and the rendezvous address (recipes.runtime.ranks.rank_info, the one place)."""

from __future__ import annotations

from dataclasses import astuple

from recipes.runtime.ranks import rank_info


def test_grid_engine_ranks_come_from_open_mpi():
    """cluster=sge: `mpirun -np 16 -npernode 8 -x MASTER_ADDR -x MASTER_PORT ...` on two nodes, rank 11."""
    env = {
        "JOB_ID": "4242",
        "PE_HOSTFILE": "/var/spool/sge/pe_hostfile",
        "SGE_TASK_ID": "undefined",
        "OMPI_COMM_WORLD_RANK": "11",
        "OMPI_COMM_WORLD_LOCAL_RANK": "3",
        "OMPI_COMM_WORLD_SIZE": "16",
        "OMPI_COMM_WORLD_NODE_RANK": "1",
        "MASTER_ADDR": "r7i4n2",
        "MASTER_PORT": "24242",
    }
    assert astuple(rank_info(env)) == (11, 3, 16, "r7i4n2", 24242)


def test_grid_engine_ranks_from_mpich_or_intel_mpi():
    env = {"PMI_RANK": "5", "MPI_LOCALRANKID": "1", "PMI_SIZE": "8", "MASTER_ADDR": "r1", "MASTER_PORT": "20001"}
    assert astuple(rank_info(env)) == (5, 1, 8, "r1", 20001)


def test_base_command_bcprun_pytorch_array():
    """cluster=bcp: bcprun with --array-type PYTORCH starts each process with torchrun's variables; the replica's
    own NGC_* variables are there too and must not win."""
    env = {
        "NGC_ARRAY_INDEX": "1",
        "NGC_ARRAY_SIZE": "2",
        "NGC_MASTER_ADDR": "launcher-svc-0",
        "NGC_JOB_ID": "77",
        "RANK": "9",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "16",
        "MASTER_ADDR": "launcher-svc-0",
        "MASTER_PORT": "29500",
    }
    assert astuple(rank_info(env)) == (9, 1, 16, "launcher-svc-0", 29500)


def test_base_command_bcprun_mpi_array_uses_the_ngc_master():
    """bcprun with --array-type MPI starts ranks through mpirun: Open MPI's variables, NGC_MASTER_ADDR."""
    env = {
        "NGC_ARRAY_INDEX": "1",
        "NGC_ARRAY_SIZE": "2",
        "NGC_MASTER_ADDR": "launcher-svc-0",
        "OMPI_COMM_WORLD_RANK": "12",
        "OMPI_COMM_WORLD_LOCAL_RANK": "4",
        "OMPI_COMM_WORLD_SIZE": "16",
    }
    assert astuple(rank_info(env)) == (12, 4, 16, "launcher-svc-0", 29500)


def test_kubernetes_pod_ranks_come_from_torchrun():
    """cluster=k8s: pod JOB_COMPLETION_INDEX=2 is torchrun's --node-rank; torchrun gives each process its rank."""
    env = {
        "JOB_COMPLETION_INDEX": "2",
        "HOSTNAME": "llama31-train-x-2",
        "RANK": "21",
        "LOCAL_RANK": "5",
        "WORLD_SIZE": "32",
        "GROUP_RANK": "2",
        "MASTER_ADDR": "llama31-train-x-0.llama31-train-x",
        "MASTER_PORT": "29500",
    }
    assert astuple(rank_info(env)) == (21, 5, 32, "llama31-train-x-0.llama31-train-x", 29500)


def test_torchrun_wins_over_the_scheduler_that_started_it():
    """torchrun inside a Slurm allocation: its own variables describe the ranks it started."""
    env = {
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NTASKS": "1",
        "RANK": "6",
        "LOCAL_RANK": "6",
        "WORLD_SIZE": "8",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29400",
    }
    assert astuple(rank_info(env))[:3] == (6, 6, 8)
