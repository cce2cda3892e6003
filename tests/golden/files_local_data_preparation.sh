#!/usr/bin/env bash
# Data preparation (files, 2 shards) on this machine, then a check of every shard
# Written by main.py for llama31_tiny_bf16_tp1_1gpu; run it again with: bash <TMP>/results/llama31_tiny_bf16_tp1_1gpu/data_preparation.sh
set -euo pipefail
keep_log() { trap '' INT TERM; exec tee "$@"; }
cd <REPO>
export PYTHONPATH=<REPO>${PYTHONPATH:+:$PYTHONPATH}
export PATH=<PYTHON_BIN>:$PATH

python -m data_prep run --config <TMP>/results/llama31_tiny_bf16_tp1_1gpu/config.yaml 2>&1 | keep_log -a <TMP>/results/llama31_tiny_bf16_tp1_1gpu/logs/data_preparation.log
python -m data_prep verify --config <TMP>/results/llama31_tiny_bf16_tp1_1gpu/config.yaml --shard all 2>&1 | keep_log -a <TMP>/results/llama31_tiny_bf16_tp1_1gpu/logs/data_preparation.log
