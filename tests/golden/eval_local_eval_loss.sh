#!/usr/bin/env bash
# Held-out loss of val from the newest checkpoint on the training job's 1 GPU
# Written by main.py for llama31_tiny_bf16_tp1_1gpu; run it again with: bash <TMP>/results/llama31_tiny_bf16_tp1_1gpu/eval_loss.sh
set -euo pipefail
keep_log() { trap '' INT TERM; exec tee "$@"; }
cd <REPO>
export PYTHONPATH=<REPO>${PYTHONPATH:+:$PYTHONPATH}
export PATH=<PYTHON_BIN>:$PATH
export TORCH_NCCL_AVOID_RECORD_STREAMS=1
export NCCL_NVLS_ENABLE=0
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
export PYTHONUNBUFFERED=1

# The training stack (conf/stack.yaml) first: one line and exit status 2 on a mismatch.
python -m recipes.stack check --run-dir <TMP>/results/llama31_tiny_bf16_tp1_1gpu --versions-only 2>&1 | keep_log -a <TMP>/results/llama31_tiny_bf16_tp1_1gpu/logs/eval_loss.log
python -m torch.distributed.run --standalone --nproc-per-node 1 -m recipes.evaluate --run-dir <TMP>/results/llama31_tiny_bf16_tp1_1gpu 2>&1 | keep_log -a <TMP>/results/llama31_tiny_bf16_tp1_1gpu/logs/eval_loss.log
