#!/usr/bin/env bash
# Data preparation (files, 5 shards) on 2 replicas, then a check of every shard: submits to NGC Base Command Platform the job that runs data_preparation.job.sh
# Written by main.py for data_files_data; submit it again with: bash <TMP>/results/data_files_data/data_preparation.ngc.sh
set -euo pipefail
exec ngc base-command job run \
    --name llama31.data_preparation.data_files_data \
    --image nvcr.io/myorg/llm/llama31-recipes:25.09 \
    --instance dgxa100.80g.1.norm \
    --ace nv-us-east-2 \
    --org myorg \
    --team llm \
    --replicas 2 \
    --array-type PYTORCH \
    --total-runtime 14400s \
    --result /results \
    --workspace llama31-code:<REPO>:RW \
    --workspace llama31-runs:<TMP>:RW \
    --commandline 'bash <TMP>/results/data_files_data/data_preparation.job.sh'
