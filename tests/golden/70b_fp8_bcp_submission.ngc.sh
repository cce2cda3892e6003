#!/usr/bin/env bash
# Train llama31_70b (fp8) on 64 GPUs: 8 nodes x 8, bcprun, one process per GPU: submits to NGC Base Command Platform the job that runs training.job.sh
# Written by main.py for llama31_70b_fp8_tp4_pp8_vp5_64gpu; submit it again with: bash <TMP>/results/llama31_70b_fp8_tp4_pp8_vp5_64gpu/submission.ngc.sh
set -euo pipefail
exec ngc base-command job run \
    --name llama31.training.llama31_70b_fp8_tp4_pp8_vp5_64gpu \
    --image nvcr.io/myorg/llm/llama31-recipes:25.09 \
    --instance dgxh100.80g.8.norm \
    --ace nv-us-east-2 \
    --org myorg \
    --team llm \
    --replicas 8 \
    --array-type PYTORCH \
    --total-runtime 14400s \
    --result /results \
    --workspace llama31-code:<REPO>:RW \
    --workspace llama31-runs:<TMP>:RW \
    --datasetid 1602645:/mnt/tokenizers \
    --preempt RUNONCE \
    --priority HIGH \
    --commandline 'bash <TMP>/results/llama31_70b_fp8_tp4_pp8_vp5_64gpu/training.job.sh'
