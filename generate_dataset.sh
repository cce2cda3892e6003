#!/usr/bin/env bash
# usage: bash generate_dataset.sh [HYDRA_OVERRIDE ...]
#
# Tokenized training data in one command: `python main.py stages=[data_preparation]` with the settings below
# taken from the environment. Hydra overrides pass through unchanged, e.g.
#   bash generate_dataset.sh                                      # The Pile shards 00-01 -> ./data/pile
#   STAGE_PATH=/lustre/me bash generate_dataset.sh cluster=bcm    # a Slurm array, one task per shard
#   DATASET=c4 TOKENIZER_TYPE=sentencepiece TOKENIZER_PATH=/models/mixtral/tokenizer.model bash generate_dataset.sh
#   DATASET=files bash generate_dataset.sh 'data_preparation.inputs=[/data/corpus/*.jsonl.zst]'
#   bash generate_dataset.sh dry_run=true                         # write the jobs, run nothing
# Environment (each one optional; unset means the default in conf/data_preparation/<dataset>.yaml):
#   DATASET          pile | c4 | files                   -> data_preparation=<DATASET> (default: pile)
#   STAGE_PATH       base directory; data goes to $STAGE_PATH/data/<dataset> -> data_preparation.output_dir
#   TOKENIZER_PATH   hub id, tokenizer directory or .model file -> data_preparation.tokenizer.path
#   TOKENIZER_TYPE   huggingface | sentencepiece           -> data_preparation.tokenizer.type
#   FILE_NUMBERS     Pile shards, e.g. 0-1 or 0-29         -> data_preparation.file_numbers
#   WORKERS          tokenizer processes per shard, or auto -> data_preparation.workers
#   HF_TOKEN         Hugging Face token for gated tokenizers (the Llama 3 one) and datasets
#   PYTHON           interpreter that runs main.py (default: python3; it needs the project's packages:
#                    run `bash dev.sh bash generate_dataset.sh ...` to use the project's .venv)
# Every key: docs/data-preparation.md; Hydra's help and the composed config: python main.py --help.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# The comment above is the usage (Hydra's own --help would describe main.py, not this wrapper).
usage() { sed -n '2,/^set -euo/{/^#/{s/^# \{0,1\}//;p}}' "${BASH_SOURCE[0]}"; }
for arg in "$@"; do
    case "$arg" in -h|--help) usage; exit 0 ;; esac
done

python=${PYTHON:-python3}
# One line instead of an import traceback when the interpreter lacks what main.py needs (outside the venv).
fix="run it in the project's environment (bash dev.sh bash generate_dataset.sh ...)"
fix+=" or set PYTHON=/path/to/.venv/bin/python"
if ! command -v "$python" >/dev/null 2>&1; then
    echo "generate_dataset.sh: PYTHON=$python not found; $fix" >&2
    exit 2
fi
status=0
missing=$("$python" - "$repo" <<'EOF'
import sys
sys.path.insert(0, sys.argv[1])
try:
    import hydra, omegaconf, launcher.cli  # noqa: F401
except ImportError as err:
    print(err.name or err)
    sys.exit(3)
EOF
) || status=$?
if [ "$status" -ne 0 ]; then
    what=$([ "$status" -eq 3 ] && echo "cannot import $missing, which main.py needs" || echo "fails to start main.py")
    echo "generate_dataset.sh: $python ($(command -v "$python")) $what; $fix" >&2
    exit 2
fi

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

exec "$python" "$repo/main.py" "${overrides[@]}" "$@"
