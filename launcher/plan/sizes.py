"""The sizes the checks and the plan share (data-parallel size, microbatches, nodes, the GPU), derived once. Where an
input a size needs is out of range the size is None: the check that owns that input reports it, and the checks
that need the size skip, so one bad value never hides another problem or ends in a division by zero."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

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


def _node_shape(cfg: Mapping[str, Any], num_gpus: int | None, local: LocalGpus) -> tuple[int | None, int | None]:
    """(ranks per node, nodes) of the job; None where cluster.gpus_per_node / ntasks_per_node do not allow it."""
    cluster = cfg["cluster"]
    if num_gpus is None:
        return None, None
    if cluster["platform"] == "local":
        return num_gpus, 1
    tasks = _positive(cluster.get("ntasks_per_node")) or _positive(cluster.get("gpus_per_node"))
    if tasks is None:
        return None, None
    per_node = min(tasks, num_gpus)
    return per_node, max(1, num_gpus // per_node)


def _gpu(cfg: Mapping[str, Any], local: LocalGpus) -> tuple[str | None, GpuSpec | None]:
    gpu_type = cfg["cluster"].get("gpu_type")
    if cfg["cluster"]["platform"] == "local":
        gpu_type = gpu_type or local.gpu_type
    try:
        return gpu_type, gpu_spec(gpu_type) if gpu_type else None
    except KeyError:
        return gpu_type, None


def sizes_of(cfg: Mapping[str, Any], local_gpus: LocalGpus | None = None) -> Sizes:
    par, train = cfg["parallelism"], cfg["training"]
    tp, pp, cp, num_gpus = (_positive(par.get(k)) for k in ("tp", "pp", "cp", "num_gpus"))
    vp = _positive(par.get("vp"))
    vp = vp if vp and vp > 1 and pp and pp > 1 else None
    dp = None
    if None not in (tp, pp, cp, num_gpus) and num_gpus % (tp * pp * cp) == 0:
        dp = num_gpus // (tp * pp * cp)
    mbs, gbs = _positive(train.get("micro_batch_size")), _positive(train.get("global_batch_size"))
    microbatches = gbs // (mbs * dp) if None not in (mbs, gbs, dp) and gbs % (mbs * dp) == 0 else None
    local = local_gpus or LocalGpus(0, None, ())
    per_node, nodes = _node_shape(cfg, num_gpus, local)
    gpu_type, spec = _gpu(cfg, local)
    is_local = cfg["cluster"]["platform"] == "local"
    reason = None
    if is_local and local.count == 0:
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
        num_microbatches=microbatches,
        gpus_per_node=per_node,
        num_nodes=nodes,
        gpu_type=gpu_type,
        spec=spec,
        local_gpus=local.count if is_local else None,
        cannot_train_reason=reason,
    )
