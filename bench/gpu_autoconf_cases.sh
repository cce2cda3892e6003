#!/usr/bin/env bash
# The auto-configurator's single-GPU cases (bench/autoconf_cases.py): run on a machine with one GPU and the training
# stack, from the repository root. The default 8 cases take about 9 minutes; the rows for conf/perf/measured.yaml
# are printed at the end and written to OUTDIR/measured_rows.yaml.
#   bash bench/gpu_autoconf_cases.sh OUTDIR [--cases default|all|KEY,...] [--shard I/N] [--list]
set -euo pipefail
if [[ $# -lt 1 || "$1" == -* ]]; then
    echo "usage: bash bench/gpu_autoconf_cases.sh OUTDIR [--cases default|all|KEY,...] [--shard I/N] [--list]" >&2
    exit 2
fi
out=$1
shift
cd "$(dirname "$0")/.."
exec "${PYTHON:-python3}" bench/autoconf_cases.py --out "$out" "$@"
