"""The README's main.py commands, run as written from a fresh directory: every dry run exits 0 (a sweep with one
run directory per point), every sweep runs as a dry run, and where the README shows what a command prints
(`$ python main.py ...` followed by its output), it prints exactly that. So the README cannot drift from the code."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from launcher_helpers import REPO, run_main

DOCUMENTS = [REPO / "README.md"]


def code_blocks(text: str) -> list[str]:
    return re.findall(r"^```[a-z]*\n(.*?)^```", text, flags=re.S | re.M)


def commands(document: Path) -> list[tuple[str, list[str]]]:
    """(main.py command, the output lines the document shows for it) from every code block."""
    found = []
    for block in code_blocks(document.read_text()):
        lines = block.replace("\\\n", " ").splitlines()
        for index, line in enumerate(lines):
            shown = line.startswith("$ ")
            command = line[2:] if shown else line
            if not command.startswith("python main.py ") or "..." in command:
                continue
            output = []
            if shown:
                for after in lines[index + 1 :]:
                    if after.startswith("$ "):
                        break
                    output.append(after)
            found.append((command.split("  #")[0].strip(), output))
    return found


def arguments(command: str) -> list[str]:
    return shlex.split(command, comments=True)[2:]


ALL = [(doc, command, output) for doc in DOCUMENTS for command, output in commands(doc)]
DRY_RUNS = [(c, o) for _, c, o in ALL if "dry_run=true" in c and not o]
SWEEPS = [c for _, c, o in ALL if " -m " in f" {c} " and "dry_run=true" not in c]
SHOWN = [(c, o) for _, c, o in ALL if o]


def test_the_readme_has_commands_of_each_kind():
    assert len(DRY_RUNS) >= 5 and len(SWEEPS) >= 3 and len(SHOWN) >= 2


@pytest.mark.parametrize("command", [c for c, _ in DRY_RUNS])
def test_each_dry_run_runs(tmp_path, command):
    out = run_main(*arguments(command), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    _one_run_directory_per_point(tmp_path, command)


@pytest.mark.parametrize("command", SWEEPS)
def test_each_sweep_runs_as_a_dry_run(tmp_path, command):
    """The README's sweeps submit to a cluster; here they write their jobs without submitting them."""
    out = run_main(*arguments(command), "dry_run=true", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    _one_run_directory_per_point(tmp_path, command)


@pytest.mark.parametrize("command,output", SHOWN)
def test_shown_output_is_what_the_command_prints(tmp_path, command, output):
    out = run_main(*arguments(command), cwd=tmp_path)
    printed = (out.stdout + out.stderr).strip().splitlines()
    assert printed == [line for line in output if line.strip()], out.stdout + out.stderr


def _one_run_directory_per_point(cwd: Path, command: str) -> None:
    points = 1
    for arg in arguments(command):
        key, _, value = arg.partition("=")
        if " -m " in f" {command} " and "," in value and not value.startswith("["):
            points *= len(value.split(","))
    runs = [p for p in (cwd / "results").iterdir() if p.name != "sweeps"]
    assert len(runs) == points, [p.name for p in runs]
    assert all((run / "config.yaml").exists() and (run / "plan.json").exists() for run in runs)
