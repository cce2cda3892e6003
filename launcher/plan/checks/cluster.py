"""cluster: GPUs per node and ranks per node against the job, this machine's GPUs (cluster=local), the GPU type,
the container, and the environment the ranks get."""

from __future__ import annotations

import re

from common.config import BatchCluster, ClusterConfig, Config, ContainerCluster, ContainerRuntime
from launcher.plan.findings import Findings
from launcher.plan.hardware import GPUS
from launcher.plan.sizes import Sizes

# megatron-core picks the attention backend from training.model.attention_backend and sets these itself.
ATTENTION_VARIABLES = ("NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "NVTE_UNFUSED_ATTN")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # POSIX shells' names


def check(cfg: Config, sizes: Sizes, found: Findings) -> None:
    cluster = cfg.cluster
    if cluster.runs_here:
        _this_machine(cluster, sizes, found)
    elif isinstance(cluster, BatchCluster):
        _nodes(cluster, sizes, found)
    if sizes.gpu_type and sizes.spec is None:
        found.problem(f"unknown cluster.gpu_type={sizes.gpu_type!r}; known: {', '.join(GPUS)}")
    # Slurm and Grid Engine jobs may run in a container; local jobs never do, bcp and k8s always do.
    if (
        isinstance(cluster, ContainerCluster)
        and not cluster.container
        and cluster.container_runtime != ContainerRuntime.none
    ):
        found.problem(
            f"cluster.container=null gives cluster.container_runtime={cluster.container_runtime} no "
            "image: set cluster.container, or cluster.container_runtime=none to run bare metal"
        )
    _environment(cluster.env, found)
    conflicting = sorted(k for k in ATTENTION_VARIABLES if k in cluster.env)
    if conflicting:
        found.problem(
            f"cluster.env sets {', '.join(conflicting)}: choose the attention backend with "
            "training.model.attention_backend instead (megatron-core sets these itself)"
        )


def _environment(env: dict[str, str], found: Findings) -> None:
    """Names every shell can export (the job scripts export them): `export BAD-NAME=1` kills the job after its
    queue wait."""
    for name in env:
        if not ENV_NAME.fullmatch(str(name)):
            fixed = re.sub(r"\W", "_", str(name))
            fixed = fixed if ENV_NAME.fullmatch(fixed) else f"_{fixed}"
            found.problem(
                f"cluster.env.{name} is not an environment variable name (letters, digits and _, not starting "
                f"with a digit): the job's `export` would fail; rename it, e.g. +cluster.env.{fixed}=..."
            )


def _this_machine(cluster: ClusterConfig, sizes: Sizes, found: Findings) -> None:
    asked, here = cluster.gpus_per_node, sizes.local_gpus or 0
    if asked and asked > here:
        found.problem(
            f"cluster.gpus_per_node={asked} but this machine has {here} GPUs; set "
            "cluster.gpus_per_node=null to use what nvidia-smi finds"
        )
    elif here and sizes.num_gpus and sizes.num_gpus > (asked or here):
        available = asked or here
        found.problem(
            f"parallelism.num_gpus={sizes.num_gpus} but this machine has {available} GPUs; set "
            f"parallelism.num_gpus={available} (and a layout that fits) or use cluster=bcm"
        )


def _nodes(cluster: BatchCluster, sizes: Sizes, found: Findings) -> None:
    gpus, tasks = cluster.gpus_per_node, cluster.ntasks_per_node
    if gpus is None and tasks is None:
        found.problem("cluster.gpus_per_node is null (no GRES): set cluster.ntasks_per_node to the GPUs per node")
        return
    if sizes.gpus_per_node is None or sizes.num_gpus is None:
        return
    if gpus and tasks and tasks > gpus:
        found.problem(
            f"cluster.ntasks_per_node={tasks} asks for more GPUs per node than the nodes have "
            f"(cluster.gpus_per_node={gpus}); set cluster.ntasks_per_node=null (one task per GPU)"
        )
    if sizes.num_gpus % sizes.gpus_per_node:
        found.problem(
            f"parallelism.num_gpus={sizes.num_gpus} is not a whole number of nodes of "
            f"{sizes.gpus_per_node} GPUs (cluster.gpus_per_node); use a multiple of {sizes.gpus_per_node}"
        )
    if sizes.tp and sizes.tp > sizes.gpus_per_node:
        found.problem(
            f"parallelism.tp={sizes.tp} spans nodes (cluster.gpus_per_node={sizes.gpus_per_node}); keep "
            "TP within a node"
        )
