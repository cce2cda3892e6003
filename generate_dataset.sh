#!/usr/bin/env bash
# Tokenized training data in one command: `python main.py stages=[data_preparation]` with the settings below
# taken from the environment. Hydra overrides pass through unchanged, e.g.
#   bash generate_dataset.sh                                      # The Pile shards 00-01 -> ./data/pile
#   STAGE_PATH=/lustre/me bash generate_dataset.sh cluster=bcm    # a Slurm array, one task per shard
#   DATASET=c4 TOKENIZER_TYPE=sentencepiece TOKENIZER_PATH=/models/mixtral/tokenizer.model bash generate_dataset.sh
#   DATASET=files bash generate_dataset.sh 'data_preparation.inputs=[/data/corpus/*.jsonl.zst]'
# Environment (each one optional; unset means the default in conf/data_preparation/<dataset>.yaml):
#   DATASET          pile | c4 | files                   -> data_preparation=<DATASET> (default: pile)
#   STAGE_PATH       base directory; data goes to $STAGE_PATH/data/<dataset> -> data_preparation.output_dir
#   TOKENIZER_PATH   hub id, tokenizer directory or .model file -> data_preparation.tokenizer.path
#   TOKENIZER_TYPE   huggingface | sentencepiece           -> data_preparation.tokenizer.type
#   FILE_NUMBERS     Pile shards, e.g. 0-1 or 0-29         -> data_preparation.file_numbers
#   WORKERS          tokenizer processes per shard, or auto -> data_preparation.workers
#   HF_TOKEN         Hugging Face token for gated tokenizers (the Llama 3 one) and datasets
#   PYTHON           interpreter that runs main.py (default: python3)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# Values go to Hydra single-quoted, so paths with commas or spaces and ranges like 0-1 stay plain strings.
quote() { printf "'%s'" "${1//\'/\\\'}"; }

overrides=("stages=[data_preparation]")
if [ -n "${DATASET:-}" ]; then overrides+=("data_preparation=${DATASET}"); fi
if [ -n "${STAGE_PATH:-}" ]; then
    overrides+=("data_preparation.output_dir=$(quote "${STAGE_PATH%/}/data/${DATASET:-pile}")")
fi
if [ -n "${TOKENIZER_PATH:-}" ]; then overrides+=("data_preparation.tokenizer.path=$(quote "$TOKENIZER_PATH")"); fi
if [ -n "${TOKENIZER_TYPE:-}" ]; then overrides+=("data_preparation.tokenizer.type=${TOKENIZER_TYPE}"); fi
if [ -n "${FILE_NUMBERS:-}" ]; then overrides+=("data_preparation.file_numbers=$(quote "$FILE_NUMBERS")"); fi
if [ -n "${WORKERS:-}" ]; then overrides+=("data_preparation.workers=${WORKERS}"); fi

exec "${PYTHON:-python3}" "$repo/main.py" "${overrides[@]}" "$@"
