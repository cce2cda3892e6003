#!/usr/bin/env bash
# Development environment in one step: on first use (or when pyproject.toml or this file change) it builds
# .venv with the host-side packages, a CPU build of torch and megatron-core (for data preparation and the
# CPU tests), then runs the given command inside it.
#   bash dev.sh python main.py        # the default job
#   bash dev.sh pytest                # the whole test suite
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
MCORE_VERSION=0.19.2
stamp="$VENV/.installed-$(cat pyproject.toml dev.sh | sha256sum | cut -c1-12)"

if [ ! -f "$stamp" ]; then
    echo "dev.sh: preparing $VENV (first run or changed requirements; takes a few minutes)" >&2
    [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
    pip=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
    # torch first and pinned, so nothing below pulls a CUDA build.
    "${pip[@]}" "torch==$TORCH_VERSION"
    # megatron-core declares Python>=3.12 but its datasets and checkpoint code run on 3.10+;
    # import megatron.core needs triton.
    "${pip[@]}" --no-deps --ignore-requires-python "megatron-core==$MCORE_VERSION"
    "${pip[@]}" triton numpy "packaging>=24.2"
    "${pip[@]}" -e ".[dataprep,test]"
    rm -f "$VENV"/.installed-*
    touch "$stamp"
fi

export PATH="$PWD/$VENV/bin:$PATH"
export VIRTUAL_ENV="$PWD/$VENV"
exec "$@"
