#!/usr/bin/env bash
# Network preflight: all-reduce bandwidth over the 2 GPUs of the training job
# Written by main.py for llama31_tiny_bf16_tp1_2gpu; run it again with: bash <TMP>/results/llama31_tiny_bf16_tp1_2gpu/preflight.sh
set -euo pipefail
keep_log() { trap '' INT TERM; exec tee "$@"; }
cd <REPO>
export PYTHONPATH=<REPO>${PYTHONPATH:+:$PYTHONPATH}
export PATH=<PYTHON_BIN>:$PATH
export TORCH_NCCL_AVOID_RECORD_STREAMS=1
export NCCL_NVLS_ENABLE=0
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
export PYTHONUNBUFFERED=1

python -m torch.distributed.run --standalone --nproc-per-node 2 -m recipes.preflight --run-dir <TMP>/results/llama31_tiny_bf16_tp1_2gpu 2>&1 | keep_log -a <TMP>/results/llama31_tiny_bf16_tp1_2gpu/logs/preflight.log
