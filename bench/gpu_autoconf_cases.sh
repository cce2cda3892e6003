#!/usr/bin/env bash
# The auto-configurator's measured cases (bench/autoconf_cases.py): run on a machine with the training stack, from the
# repository root. One GPU: the default 8 cases take about 9 minutes. Two GPUs (--gpus 2): 21 cases, about 23
# minutes, in four shards (--shard 1/4 .. 4/4) of about 6. Four GPUs (--gpus 4): 21 cases, about 32 minutes, in five
# shards of about 6.5 (--budget-s 450 --timeout-s 180). The rows for conf/perf/measured.yaml are printed at the end and
# written to OUTDIR/measured_rows.yaml after every case.
#   bash bench/gpu_autoconf_cases.sh OUTDIR [--gpus 1|2|4] [--cases default|all|KEY,...] [--shard I/N] [--list]
set -euo pipefail
if [[ $# -lt 1 || "$1" == -* ]]; then
    echo "usage: bash bench/gpu_autoconf_cases.sh OUTDIR [--gpus 1|2|4] [--cases default|all|KEY,...] [--shard I/N]" >&2
    exit 2
fi
out=$1
shift
cd "$(dirname "$0")/.."
exec "${PYTHON:-python3}" bench/autoconf_cases.py --out "$out" "$@"
