#!/usr/bin/env bash
# The single-GPU measurements (bench/gpu_measurements.py): run on a machine with one GPU and the training stack,
# from the repository root. Part 1 takes about 8.5 minutes, part 2 about 6.
#   bash bench/gpu_measurements.sh OUTDIR [--part 1|2|all] [--only NAME,...] [--list]
set -euo pipefail
if [[ $# -lt 1 || "$1" == -* ]]; then
    echo "usage: bash bench/gpu_measurements.sh OUTDIR [--part 1|2|all] [--only NAME,...] [--list]" >&2
    exit 2
fi
out=$1
shift
cd "$(dirname "$0")/.."
exec "${PYTHON:-python3}" bench/gpu_measurements.py --out "$out" "$@"
