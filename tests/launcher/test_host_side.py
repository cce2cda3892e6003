"""The host side runs on login nodes: Python 3.10+, and never torch or megatron."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from launcher_helpers import REPO

# recipes/ modules that run on login nodes too: the stack table and check, and setup.sh's hub downloads.
HOST_FILES = sorted(
    [
        *(REPO / "launcher").rglob("*.py"),
        *(REPO / "common").rglob("*.py"),
        REPO / "main.py",
        REPO / "recipes" / "stack.py",
        REPO / "recipes" / "hf" / "hub.py",
    ]
)


@pytest.mark.parametrize("path", HOST_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_parses_as_python_310(path):
    ast.parse(path.read_text(), filename=str(path), feature_version=(3, 10))


def test_host_modules_import_no_torch_or_megatron():
    modules = [".".join(p.relative_to(REPO).with_suffix("").parts) for p in HOST_FILES if p.name != "main.py"]
    modules = [m.removesuffix(".__init__") for m in modules]
    code = (
        f"import sys; import {', '.join(modules)}; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'megatron', 'transformer_engine')); "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_mock_data_dry_run_of_a_named_layout_here_loads_only_the_modules_it_uses(tmp_path):
    # Each module main.py imports is part of every run's time (the search with its step-time model, data_prep's
    # readers, the other platforms: about 0.03 s each); they load when a run searches its layout, reads real data or
    # prepares it, runs on that platform, or when a config fails to compose.
    code = (
        "import runpy, sys\n"
        f"sys.argv = ['main.py', 'dry_run=true', 'results_dir={tmp_path}']\n"
        "try:\n"
        "    runpy.run_path('main.py', run_name='__main__')\n"
        "finally:\n"
        "    platforms = tuple(f'launcher.platforms.{p}' for p in ('slurm', 'sge', 'bcp', 'k8s'))\n"
        "    lazy = ('data_prep', 'launcher.autoconf.search', 'launcher.config.errors', *platforms)\n"
        "    print(sorted(m for m in sys.modules if m.startswith(lazy)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "[]", out.stdout
