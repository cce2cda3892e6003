#!/usr/bin/env bash
# Train llama31_405b (bf16) on 1024 GPUs: 128 nodes x 8, bcprun, one process per GPU: submits to NGC Base Command Platform the job that runs training.job.sh
# Written by main.py for llama31_405b_bf16_tp8_pp8_cp2_vp8_asym_1024gpu; submit it again with: bash <TMP>/results/llama31_405b_bf16_tp8_pp8_cp2_vp8_asym_1024gpu/submission.ngc.sh
set -euo pipefail
exec ngc base-command job run \
    --name llama31.training.llama31_405b_bf16_tp8_pp8_cp2_vp8_asym_1024gpu \
    --image nvcr.io/myorg/llm/llama31-recipes:25.09 \
    --instance dgxh100.80g.8.norm \
    --ace nv-us-east-2 \
    --org myorg \
    --team llm \
    --replicas 128 \
    --array-type PYTORCH \
    --total-runtime 14400s \
    --result /results \
    --workspace llama31-code:<REPO>:RW \
    --workspace llama31-runs:<TMP>:RW \
    --commandline 'bash <TMP>/results/llama31_405b_bf16_tp8_pp8_cp2_vp8_asym_1024gpu/training.job.sh'
