#!/usr/bin/env bash
# Held-out loss of val from the newest checkpoint on the training job's 8 GPUs
# Runs in the image on the job's first replica (ngc base-command job run --commandline); bcprun starts
# the processes on every replica. Written by main.py for llama31_8b_bf16_tp1_cp2_8gpu
set -euo pipefail
keep_log() { trap '' INT TERM; exec tee "$@"; }
cd <REPO>
export PYTHONPATH=<REPO>${PYTHONPATH:+:$PYTHONPATH}
export TORCH_NCCL_AVOID_RECORD_STREAMS=1
export NCCL_NVLS_ENABLE=0
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
export PYTHONUNBUFFERED=1
export CUDA_DEVICE_MAX_CONNECTIONS=1

bcprun --nnodes 1 --npernode 8 \
    --workdir <REPO> \
    --env PYTHONPATH=<REPO> \
    --env TORCH_NCCL_AVOID_RECORD_STREAMS=1 \
    --env NCCL_NVLS_ENABLE=0 \
    --env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
    --env PYTHONUNBUFFERED=1 \
    --env CUDA_DEVICE_MAX_CONNECTIONS=1 \
    --cmd 'python -m recipes.evaluate --run-dir <TMP>/results/llama31_8b_bf16_tp1_cp2_8gpu' 2>&1 | keep_log -a "<TMP>/results/llama31_8b_bf16_tp1_cp2_8gpu/logs/eval_loss_$NGC_JOB_ID.log"
