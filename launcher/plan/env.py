"""The training job's environment variables the plan records."""

from __future__ import annotations

from common.config import ClusterConfig, CudaGraphs, ParallelismConfig, TrainingConfig


def training_env(
    parallel: ParallelismConfig, cluster: ClusterConfig, training: TrainingConfig | None = None
) -> dict[str, str]:
    """The environment NVIDIA's reference recipes set, only where it applies, then the cluster's own."""
    tp, pp, cp, vp = parallel.tp, parallel.pp, parallel.cp, parallel.vp
    env = {
        "TORCH_NCCL_AVOID_RECORD_STREAMS": "1",
        "NCCL_NVLS_ENABLE": "0",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "PYTHONUNBUFFERED": "1",
    }
    if tp > 1 or cp > 1:
        # Kernels must start in issue order so TP/CP communication overlaps the GEMMs it feeds.
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
    if parallel.tp_comm_overlap and not cluster.nvlink_multicast:
        # Userbuffers fall back to CUDA IPC where NVLink multicast is missing (PCIe, many single nodes).
        env["UB_SKIPMC"] = "1"
    if pp > 1:
        env["NCCL_P2P_NET_CHUNKSIZE"] = "2097152"
        if vp:
            # Leave SMs for the pipeline's P2P kernels while LayerNorm kernels run.
            env["NVTE_FWD_LAYERNORM_SM_MARGIN"] = "16"
            env["NVTE_BWD_LAYERNORM_SM_MARGIN"] = "16"
    if training is not None and training.cuda_graphs != CudaGraphs.none:
        # NCCL's registration of graph-captured buffers breaks with expandable segments (illegal memory access);
        # megatron-core refuses Transformer Engine graphs unless it is off.
        env["NCCL_GRAPH_REGISTER"] = "0"
    for key, value in cluster.env.items():
        env[str(key)] = str(value)
    return env
