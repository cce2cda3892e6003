#!/usr/bin/env bash
# Data preparation (files, 5 shards) on 2 replicas, then a check of every shard
# Runs in the image on the job's first replica (ngc base-command job run --commandline); bcprun starts
# the processes on every replica. Written by main.py for data_files_data
set -euo pipefail
keep_log() { trap '' INT TERM; exec tee "$@"; }
cd <REPO>
export PYTHONPATH=<REPO>${PYTHONPATH:+:$PYTHONPATH}

bcprun --nnodes 2 --npernode 1 \
    --workdir <REPO> \
    --env PYTHONPATH=<REPO> \
    --cmd 'python -m data_prep run --config <TMP>/results/data_files_data/config.yaml --shard "$(seq -s, "$NGC_ARRAY_INDEX" 2 4)"' 2>&1 | keep_log -a "<TMP>/results/data_files_data/logs/data_preparation_$NGC_JOB_ID.log"
python -m data_prep verify --config <TMP>/results/data_files_data/config.yaml --shard all 2>&1 | keep_log -a "<TMP>/results/data_files_data/logs/data_preparation_$NGC_JOB_ID.log"
