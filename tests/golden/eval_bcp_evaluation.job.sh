#!/usr/bin/env bash
# Evaluate <TMP>/hf: 7 lm-eval tasks and held-out perplexity on one node
# Runs in the image on the job's first replica (ngc base-command job run --commandline); bcprun starts
# the processes on every replica. Written by main.py for llama31_8b_bf16_tp1_cp2_8gpu
set -euo pipefail
keep_log() { trap '' INT TERM; exec tee "$@"; }
cd <REPO>
export PYTHONPATH=<REPO>${PYTHONPATH:+:$PYTHONPATH}
export HF_DATASETS_OFFLINE=1
export HF_HUB_OFFLINE=1
export HF_DATASETS_CACHE=<TMP>/eval_data/datasets

python -m recipes.evaluation harness --run-dir <TMP>/results/llama31_8b_bf16_tp1_cp2_8gpu 2>&1 | keep_log -a "<TMP>/results/llama31_8b_bf16_tp1_cp2_8gpu/logs/evaluation_$NGC_JOB_ID.log"
