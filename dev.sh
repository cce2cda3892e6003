#!/usr/bin/env bash
# Development environment in one step: on first use (or when pyproject.toml or this file change) it prepares
# .venv, then runs the given command inside it.
#   bash dev.sh python main.py        # the default job
#   bash dev.sh pytest                # the whole test suite
#
# Where the training stack already imports (the NeMo container, a GPU workstation with megatron-core and
# Transformer Engine), .venv sees that interpreter's packages and adds only what is missing: nothing to download
# when everything is there, so it works without a package registry, and the tiny default job trains on the GPUs.
# Elsewhere (a CPU machine) .venv is self-contained: the host-side packages, a CPU build of torch and
# megatron-core (for data preparation and the CPU tests).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
VENV=$(realpath -m "${VENV:-.venv}")  # absolute: the jobs and shims below run from other directories
PY=${PYTHON:-python3}
# conf/stack.yaml names the versions (the stack the recipes are tested with); a change there prepares .venv again.
stamp="$VENV/.installed-$(cat pyproject.toml dev.sh conf/stack.yaml | sha256sum | cut -c1-12)"

# A version conf/stack.yaml declares: `stack_version torch cpu_build`, `stack_version megatron_core tested`. Read
# with the venv's python once pyyaml is there (the system python may not have it).
stack_version() {
    "$VENV/bin/python" - "$1" "$2" <<'EOF'
import sys, yaml
print(yaml.safe_load(open("conf/stack.yaml"))["stack"][sys.argv[1]][sys.argv[2]])
EOF
}

# The project's console scripts (pyproject.toml [project.scripts]) in the venv's bin, as an editable install
# makes them, for the venv that adds the repository by a .pth file.
write_console_scripts() {
    "$VENV/bin/python" - "$VENV/bin" <<'EOF'
import os, sys
try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib
for name, target in tomllib.load(open("pyproject.toml", "rb"))["project"]["scripts"].items():
    module, function = target.split(":")
    path = os.path.join(sys.argv[1], name)
    with open(path, "w") as f:
        f.write(f"#!{sys.executable}\nimport sys\nfrom {module} import {function}\nsys.exit({function}())\n")
    os.chmod(path, 0o755)
EOF
}

has_training_stack() {
    "$PY" - <<'EOF'
import importlib.util, sys
sys.exit(0 if all(importlib.util.find_spec(m) for m in ("torch", "megatron.core", "transformer_engine")) else 1)
EOF
}

# Requirements from pyproject.toml (the project's dependencies plus the given extras) that the venv's Python
# does not satisfy, one per line.
unmet_requirements() {
    "$VENV/bin/python" - "$@" <<'EOF'
import importlib.metadata as metadata, re, sys
try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
wanted = list(project["dependencies"])
for extra in sys.argv[1:]:
    wanted += project["optional-dependencies"][extra]
for text in wanted:
    name = re.split(r"[\s\[<>=!~;]", text, maxsplit=1)[0]
    try:
        version = metadata.version(name)
    except metadata.PackageNotFoundError:
        print(text)
        continue
    try:
        from packaging.requirements import Requirement
    except ImportError:
        continue  # present; its version cannot be compared here
    if not Requirement(text).specifier.contains(version, prereleases=True):
        print(text)
EOF
}

prepare_over_training_stack() {
    # --system-site-packages shows the base interpreter's packages; when "$PY" is itself a virtualenv (as in
    # many images), its own site-packages come through a .pth file. The repository goes in the same way, as
    # an editable install would put it: nothing is built, so nothing needs a registry.
    "$PY" -m venv --system-site-packages --without-pip "$VENV"
    site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    "$PY" -c 'import site; print("\n".join(site.getsitepackages()))' > "$site/_training_stack.pth"
    echo "$PWD" > "$site/_llama31_recipes.pth"
    # Console scripts of the base interpreter would run without this venv: run them through its python.
    for tool in pytest torchrun; do
        module=$([ "$tool" = torchrun ] && echo torch.distributed.run || echo pytest)
        printf '#!/bin/sh\nexec "%s" -m %s "$@"\n' "$VENV/bin/python" "$module" > "$VENV/bin/$tool"
        chmod +x "$VENV/bin/$tool"
    done
    write_console_scripts
    missing=$(unmet_requirements dataprep)
    if [ -n "$missing" ]; then
        echo "dev.sh: installing what the training stack here lacks: $(echo $missing)" >&2
        # shellcheck disable=SC2086
        "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check $missing || {
            echo "dev.sh: cannot install $(echo $missing) (no package registry?): install them into $PY, or" \
                 "put their wheels in a directory and set PIP_FIND_LINKS=<dir> PIP_NO_INDEX=1" >&2
            exit 1
        }
    fi
    # Optional here: what the tests, MLPerf mode and the docs site need (a warning, not a stop, when it cannot be
    # installed).
    optional=$(unmet_requirements test mlperf docs)
    if [ -n "$optional" ]; then
        # shellcheck disable=SC2086
        "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check $optional 2>/dev/null \
            || echo "dev.sh: the tests, MLPerf mode and the docs site also need $(echo $optional);" \
                    "install them for those" >&2
    fi
}

prepare_self_contained() {
    [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
    pip=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
    "${pip[@]}" pyyaml
    # torch first and pinned, so nothing below pulls a CUDA build (TORCH_VERSION=... picks another CPU build).
    "${pip[@]}" "torch==${TORCH_VERSION:-$(stack_version torch cpu_build)}"
    # megatron-core declares Python>=3.12 but its datasets and checkpoint code run on 3.10+;
    # import megatron.core needs triton.
    "${pip[@]}" --no-deps --ignore-requires-python "megatron-core==$(stack_version megatron_core tested)"
    "${pip[@]}" triton numpy "packaging>=24.2"
    "${pip[@]}" -e ".[dataprep,mlperf,test,docs]"
}

if [ ! -f "$stamp" ]; then
    rm -rf "${VENV:?}"/.installed-*
    if has_training_stack; then
        echo "dev.sh: preparing $VENV over the training stack of $("$PY" -c 'import sys; print(sys.executable)')" >&2
        rm -rf "$VENV"
        prepare_over_training_stack
    else
        echo "dev.sh: preparing $VENV (first run or changed requirements; takes a few minutes)" >&2
        prepare_self_contained
    fi
    touch "$stamp"
fi

export PATH="$VENV/bin:$PATH"
export VIRTUAL_ENV="$VENV"
exec "$@"
