#!/usr/bin/env bash
# Train llama31_tiny (bf16) on 1 GPU of this machine
# Written by main.py for llama31_tiny_bf16_tp1_1gpu; run it again with: bash <TMP>/results/llama31_tiny_bf16_tp1_1gpu/launch.sh
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
python -m recipes.stack check --run-dir <TMP>/results/llama31_tiny_bf16_tp1_1gpu --versions-only 2>&1 | keep_log -a <TMP>/results/llama31_tiny_bf16_tp1_1gpu/logs/training.log
python -m recipes.resilience.ft_launch --standalone --nnodes 1 --nproc-per-node 1 \
    --max-restarts 2 \
    --ft-rank-section-timeouts setup:1800,step:60,checkpointing:1800 \
    --ft-rank-out-of-section-timeout 60 \
    --ft-checkpoint-iteration-file <TMP>/results/llama31_tiny_bf16_tp1_1gpu/checkpoints/latest_checkpointed_iteration.txt \
    --ft-max-no-progress-cycles 2 \
    -m recipes.train --run-dir <TMP>/results/llama31_tiny_bf16_tp1_1gpu 2>&1 | keep_log -a <TMP>/results/llama31_tiny_bf16_tp1_1gpu/logs/training.log
# The throughput / MFU table and the loss and step-time plot of this run.
python -m launcher.report <TMP>/results/llama31_tiny_bf16_tp1_1gpu 2>&1 | keep_log <TMP>/results/llama31_tiny_bf16_tp1_1gpu/logs/report.txt || echo 'report: nothing to report (see above)'
