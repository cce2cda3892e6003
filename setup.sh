#!/usr/bin/env bash
# One-time setup: the training image (the NeMo container with the declared stack installed, through main.py's
# container stage) and the Llama 3.1 tokenizer from the Hugging Face hub.
#
#   HF_TOKEN=hf_... bash setup.sh                      # both
#   HF_TOKEN=hf_... bash setup.sh cluster.partition=cpu cluster.account=llm   # overrides for the container stage
#   SKIP_CONTAINER=1 HF_TOKEN=hf_... bash setup.sh     # the tokenizer only
#   SKIP_TOKENIZER=1 bash setup.sh                     # the container only
#   HF_WEIGHTS=meta-llama/Llama-3.1-8B HF_TOKEN=hf_... bash setup.sh   # also the weights, into models/<name>
#                                                      # (start runs from them: training.checkpoint.init_from_hf)
#
# The container stage builds cluster.container from cluster.container_source (enroot for a .sqsh, apptainer for a
# .sif): as a one-node Slurm job when sbatch is on this machine (cluster=bcm), else here (cluster=local); pass
# cluster=... to choose. It does nothing when the image already exists.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

TOKENIZER_REPO=${TOKENIZER_REPO:-meta-llama/Llama-3.1-8B}
TOKENIZER_DIR=${TOKENIZER_DIR:-$PWD/tokenizers/$(basename "$TOKENIZER_REPO")}

# Check the token first: a missing token should not surface after a container job was already queued.
if [ -z "${SKIP_TOKENIZER:-}" ] && [ -z "${HF_TOKEN:-}" ]; then
    cat >&2 <<EOF
setup: HF_TOKEN is not set, so the tokenizer cannot be downloaded.
  $TOKENIZER_REPO is gated on the Hugging Face hub: accept its license on https://huggingface.co/$TOKENIZER_REPO,
  create a read token on https://huggingface.co/settings/tokens, then run:  HF_TOKEN=hf_... bash setup.sh
  (SKIP_TOKENIZER=1 bash setup.sh sets up the container only.)
EOF
    exit 1
fi

if [ -z "${SKIP_CONTAINER:-}" ]; then
    args=("stages=[container]" "$@")
    if ! printf '%s\n' "$@" | grep -q '^cluster='; then
        if command -v sbatch >/dev/null 2>&1; then args=("cluster=bcm" "${args[@]}"); else args=("cluster=local" "${args[@]}"); fi
    fi
    echo "setup: container: python main.py ${args[*]}"
    bash dev.sh python main.py "${args[@]}"
fi

if [ -z "${SKIP_TOKENIZER:-}" ]; then
    echo "setup: tokenizer: $TOKENIZER_REPO -> $TOKENIZER_DIR"
    # recipes/hf/hub.py: the same download as the weights' below and init_from_hf's, without torch.
    bash dev.sh python -m recipes.hf.hub fetch "$TOKENIZER_REPO" --tokenizer --local-dir "$TOKENIZER_DIR" \
        --prefix setup --offline-fix "run setup.sh where the hub is reachable and copy $TOKENIZER_DIR here (SKIP_TOKENIZER=1 skips this step)"
    echo "setup: tokenizer ready; use it with training.tokenizer.path=$TOKENIZER_DIR (data preparation follows it)"
fi

if [ -n "${HF_WEIGHTS:-}" ]; then
    WEIGHTS_DIR=${WEIGHTS_DIR:-$PWD/models/$(basename "$HF_WEIGHTS")}
    echo "setup: weights: $HF_WEIGHTS -> $WEIGHTS_DIR"
    bash dev.sh python -m recipes.hf.hub fetch "$HF_WEIGHTS" --local-dir "$WEIGHTS_DIR" \
        --prefix setup --offline-fix "run setup.sh where the hub is reachable and copy $WEIGHTS_DIR here"
fi
