#!/usr/bin/env bash
# Train llama31_8b (bf16) on 8 GPUs: 1 node x 8, bcprun, one process per GPU: submits to NGC Base Command Platform the job that runs training.job.sh
# Written by main.py for llama31_8b_bf16_tp1_cp2_8gpu; submit it again with: bash <TMP>/results/llama31_8b_bf16_tp1_cp2_8gpu/submission.ngc.sh
set -euo pipefail
exec ngc base-command job run \
    --name llama31.training.llama31_8b_bf16_tp1_cp2_8gpu \
    --image nvcr.io/myorg/llm/llama31-recipes:25.09 \
    --instance dgxa100.80g.8.norm \
    --ace nv-us-east-2 \
    --org myorg \
    --team llm \
    --total-runtime 14400s \
    --result /results \
    --workspace llama31-code:<REPO>:RW \
    --workspace llama31-runs:<TMP>:RW \
    --commandline 'bash <TMP>/results/llama31_8b_bf16_tp1_cp2_8gpu/training.job.sh'
