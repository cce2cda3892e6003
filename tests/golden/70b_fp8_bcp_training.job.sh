#!/usr/bin/env bash
# Train llama31_70b (fp8) on 64 GPUs: 8 nodes x 8, bcprun, one process per GPU
# Runs in the image on the job's first replica (ngc base-command job run --commandline); bcprun starts
# the processes on every replica. Written by main.py for llama31_70b_fp8_tp4_pp8_vp5_64gpu
set -euo pipefail
keep_log() { trap '' INT TERM; exec tee "$@"; }
cd <REPO>
export PYTHONPATH=<REPO>${PYTHONPATH:+:$PYTHONPATH}
export TORCH_NCCL_AVOID_RECORD_STREAMS=1
export NCCL_NVLS_ENABLE=0
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
export PYTHONUNBUFFERED=1
export CUDA_DEVICE_MAX_CONNECTIONS=1
export NCCL_P2P_NET_CHUNKSIZE=2097152
export NVTE_FWD_LAYERNORM_SM_MARGIN=16
export NVTE_BWD_LAYERNORM_SM_MARGIN=16
export NCCL_IB_SL=1

bcprun --nnodes 8 --npernode 8 \
    --workdir <REPO> \
    --env PYTHONPATH=<REPO> \
    --env TORCH_NCCL_AVOID_RECORD_STREAMS=1 \
    --env NCCL_NVLS_ENABLE=0 \
    --env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
    --env PYTHONUNBUFFERED=1 \
    --env CUDA_DEVICE_MAX_CONNECTIONS=1 \
    --env NCCL_P2P_NET_CHUNKSIZE=2097152 \
    --env NVTE_FWD_LAYERNORM_SM_MARGIN=16 \
    --env NVTE_BWD_LAYERNORM_SM_MARGIN=16 \
    --env NCCL_IB_SL=1 \
    --cmd 'python -m recipes.train --run-dir <TMP>/results/llama31_70b_fp8_tp4_pp8_vp5_64gpu' 2>&1 | keep_log -a "<TMP>/results/llama31_70b_fp8_tp4_pp8_vp5_64gpu/logs/training_$NGC_JOB_ID.log"
# The throughput / MFU table and the loss and step-time plot of this run.
python -m launcher.report <TMP>/results/llama31_70b_fp8_tp4_pp8_vp5_64gpu 2>&1 | keep_log <TMP>/results/llama31_70b_fp8_tp4_pp8_vp5_64gpu/logs/report.txt || echo 'report: nothing to report (see above)'
