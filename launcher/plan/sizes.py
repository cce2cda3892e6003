"""The sizes the checks and the plan share (data-parallel size, microbatches, nodes, the GPU), derived once. Where an
input a size needs is out of range the size is None: the check that owns that input reports it, and the checks
that need the size skip, so one bad value never hides another problem or ends in a division by zero."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from common.config import BatchCluster, ClusterConfig, Config
from launcher.plan.hardware import GpuSpec, LocalGpus, gpu_spec


@dataclass(frozen=True)
class Sizes:
    num_gpus: int | None
    tp: int | None
    pp: int | None
    cp: int | None
    vp: int | None  # None: no interleaving (vp null or 1)
    dp: int | None
    micro_batch_size: int | None
    global_batch_size: int | None
    num_microbatches: int | None
    gpus_per_node: int | None  # ranks per node of this job
    num_nodes: int | None
    gpu_type: str | None
    spec: GpuSpec | None  # None: unknown GPU type (or none known here)
    local_gpus: int | None  # cluster=local: the GPUs this machine has
    cannot_train_reason: str | None


def _positive(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def _node_shape(cluster: ClusterConfig, num_gpus: int | None) -> tuple[int | None, int | None]:
    """(ranks per node, nodes) of the job; None where cluster.gpus_per_node / ntasks_per_node do not allow it."""
    if num_gpus is None:
        return None, None
    if cluster.runs_here:
        return num_gpus, 1
    ntasks_per_node = cluster.ntasks_per_node if isinstance(cluster, BatchCluster) else None
    tasks = _positive(ntasks_per_node) or _positive(cluster.gpus_per_node)
    if tasks is None:
        return None, None
    per_node = min(tasks, num_gpus)
    return per_node, max(1, num_gpus // per_node)


def _gpu(cluster: ClusterConfig, local: LocalGpus) -> tuple[str | None, GpuSpec | None]:
    gpu_type = cluster.gpu_type
    if cluster.runs_here:
        gpu_type = gpu_type or local.gpu_type
    try:
        return gpu_type, gpu_spec(gpu_type) if gpu_type else None
    except KeyError:
        return gpu_type, None


def _data_parallel(num_gpus: int | None, tp: int | None, pp: int | None, cp: int | None) -> int | None:
    if num_gpus is None or tp is None or pp is None or cp is None or num_gpus % (tp * pp * cp):
        return None
    return num_gpus // (tp * pp * cp)


def _microbatches(gbs: int | None, mbs: int | None, dp: int | None) -> int | None:
    if gbs is None or mbs is None or dp is None or gbs % (mbs * dp):
        return None
    return gbs // (mbs * dp)


def sizes_of(cfg: Config, local_gpus: LocalGpus | None = None) -> Sizes:
    par, train, cluster = cfg.parallelism, cfg.training, cfg.cluster
    tp, pp, cp, num_gpus = (_positive(size) for size in (par.tp, par.pp, par.cp, par.num_gpus))
    vp = _positive(par.vp)
    vp = vp if vp and vp > 1 and pp and pp > 1 else None
    dp = _data_parallel(num_gpus, tp, pp, cp)
    mbs, gbs = _positive(train.micro_batch_size), _positive(train.global_batch_size)
    local = local_gpus or LocalGpus(0, None, ())
    per_node, nodes = _node_shape(cluster, num_gpus)
    gpu_type, spec = _gpu(cluster, local)
    reason = None
    if cluster.runs_here and local.count == 0:
        reason = "no NVIDIA GPU is visible on this machine (nvidia-smi found none), so cluster=local cannot train here"
    return Sizes(
        num_gpus=num_gpus,
        tp=tp,
        pp=pp,
        cp=cp,
        vp=vp,
        dp=dp,
        micro_batch_size=mbs,
        global_batch_size=gbs,
        num_microbatches=_microbatches(gbs, mbs, dp),
        gpus_per_node=per_node,
        num_nodes=nodes,
        gpu_type=gpu_type,
        spec=spec,
        local_gpus=local.count if cluster.runs_here else None,
        cannot_train_reason=reason,
    )
