#!/usr/bin/env bash
# Evaluate <TMP>/hf: 7 lm-eval tasks and held-out perplexity on one node
# Written by main.py for llama31_tiny_bf16_tp1_1gpu; run it again with: bash <TMP>/results/llama31_tiny_bf16_tp1_1gpu/evaluation.sh
set -euo pipefail
keep_log() { trap '' INT TERM; exec tee "$@"; }
cd <REPO>
export PYTHONPATH=<REPO>${PYTHONPATH:+:$PYTHONPATH}
export PATH=<PYTHON_BIN>:$PATH
export HF_DATASETS_OFFLINE=1
export HF_HUB_OFFLINE=1
export HF_DATASETS_CACHE=<TMP>/eval_data/datasets

python -m recipes.evaluation harness --run-dir <TMP>/results/llama31_tiny_bf16_tp1_1gpu 2>&1 | keep_log -a <TMP>/results/llama31_tiny_bf16_tp1_1gpu/logs/evaluation.log
