#!/usr/bin/env bash
# Evaluate <TMP>/hf: 7 lm-eval tasks and held-out perplexity on one node: submits to NGC Base Command Platform the job that runs evaluation.job.sh
# Written by main.py for llama31_8b_bf16_tp1_cp2_8gpu; submit it again with: bash <TMP>/results/llama31_8b_bf16_tp1_cp2_8gpu/evaluation.ngc.sh
set -euo pipefail
exec ngc base-command job run \
    --name llama31.evaluation.llama31_8b_bf16_tp1_cp2_8gpu \
    --image nvcr.io/myorg/llm/llama31-recipes:25.09 \
    --instance dgxh100.80g.8.norm \
    --ace nv-us-east-2 \
    --org myorg \
    --total-runtime 14400s \
    --result /results \
    --workspace code:<REPO>:RW \
    --workspace runs:<TMP>:RW \
    --commandline 'bash <TMP>/results/llama31_8b_bf16_tp1_cp2_8gpu/evaluation.job.sh'
