#!/usr/bin/env bash
# Train llama31_tiny (bf16) on 2 GPUs of this machine
# Written by main.py for llama31_tiny_bf16_tp1_2gpu; run it again with: bash <TMP>/results/llama31_tiny_bf16_tp1_2gpu/launch.sh
set -euo pipefail
keep_log() { trap '' INT TERM; exec tee "$@"; }
cd <REPO>
export PYTHONPATH=<REPO>${PYTHONPATH:+:$PYTHONPATH}
export PATH=<PYTHON_BIN>:$PATH
export TORCH_NCCL_AVOID_RECORD_STREAMS=1
export NCCL_NVLS_ENABLE=0
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
export PYTHONUNBUFFERED=1

# The training stack (conf/stack.yaml) first: one line and exit status 2 on a mismatch.
python -m recipes.stack check --run-dir <TMP>/results/llama31_tiny_bf16_tp1_2gpu --versions-only 2>&1 | keep_log -a <TMP>/results/llama31_tiny_bf16_tp1_2gpu/logs/training.log
python -m torch.distributed.run --standalone --nproc-per-node 2 --no-python bash -c 'mkdir -p <TMP>/results/llama31_tiny_bf16_tp1_2gpu/profile
if [[ " 1 " == *" $RANK "* ]]; then
  command -v nsys >/dev/null || { echo "profile.tool=nsys: nsys (Nsight Systems) is not on PATH on $(hostname) for rank $RANK; install it in the job environment or use profile.tool=torch" >&2; exit 1; }
  exec nsys profile --capture-range=cudaProfilerApi --capture-range-end=stop --force-overwrite=true --trace=cuda,nvtx,osrt,cublas,cudnn --sample=none --cpuctxsw=none --output=<TMP>/results/llama31_tiny_bf16_tp1_2gpu/profile/nsys_rank"$RANK" python -m recipes.train --run-dir <TMP>/results/llama31_tiny_bf16_tp1_2gpu
fi
exec python -m recipes.train --run-dir <TMP>/results/llama31_tiny_bf16_tp1_2gpu' 2>&1 | keep_log -a <TMP>/results/llama31_tiny_bf16_tp1_2gpu/logs/training.log
# The throughput / MFU table and the loss and step-time plot of this run.
python -m launcher.report <TMP>/results/llama31_tiny_bf16_tp1_2gpu 2>&1 | keep_log <TMP>/results/llama31_tiny_bf16_tp1_2gpu/logs/report.txt || echo 'report: nothing to report (see above)'
