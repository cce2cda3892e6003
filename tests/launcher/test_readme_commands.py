"""The commands of README.md and of every page under docs/, run as written from a fresh directory, so the
documentation cannot drift from the code.

A command is a line of a ```bash block (continuation lines joined, the trailing `# comment` dropped) or a line
starting with `$ ` in any block; the lines after a `$ ` command, up to the next one, are what the page says it
prints. What runs here, on a CPU machine with no GPU, no cluster and no network:

- `python main.py ...` as a dry run: a command with dry_run=true as written, one without it (it would train here
  or submit to a cluster) with dry_run=true added, so its config composes, its plan passes every check and its
  jobs are written. Each must exit 0 and write one run directory per sweep point (`-m`).
- `bash generate_dataset.sh ...` with dry_run=true added (it would download and tokenize).
- `python -m launcher.report PATH ...` where every path is in the repository (the test fixtures), on a copy of them.
- after `$ `: what the command prints equals the lines the page shows, exactly.

Every other command is named in NOT_RUN with the reason it cannot run here (a GPU, a cluster's or a registry's
tools, the network, a run that trained, files the reader brings) or where it runs instead; a command that is
neither run nor named fails test_every_command_is_run_or_says_why_not, so a new command gets a decision. Lines
with `...`, where the page leaves arguments out, are not run."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from launcher_helpers import REPO, run_main

DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]

# (pattern at the start of a command, why it does not run here), first match wins.
NOT_RUN: list[tuple[str, str]] = [
    (r"HF_TOKEN=|HF_WEIGHTS=", "downloads gated files from the Hugging Face hub (network, a token)"),
    (r"bash setup\.sh", "builds the image and downloads the tokenizer (a cluster or enroot, the network)"),
    (r"bash dev\.sh ", "prepares .venv (minutes, a package registry); what it runs is run here directly or is CI"),
    (r"(docker|ngc|kubectl) ", "a registry's or a cluster's own tool"),
    (r"cd ", "changes into a workspace of a Base Command cluster"),
    (r"(tensorboard|vllm|lm_eval) ", "a server or an evaluation reading what training wrote (a GPU)"),
    (
        r"(CUDA_VISIBLE_DEVICES=\S+ )?python bench/(bench_train|bench_lora|bench_sft|two_gpu_fp8|four_gpu)\.py"
        r"|bash bench/gpu_",
        "trains on GPUs (tests/launcher/test_bench_*.py cover the rest)",
    ),
    (
        r"python bench/bench_kernels\.py",
        "times kernels on a GPU or joins the trace of a run that trained (tests/launcher/test_bench_kernels.py)",
    ),
    (
        r"python bench/autoconf_cases\.py --rank |python bench/fit_steptime\.py --rows ",
        "reads the rows a GPU run measured (tests/launcher/test_two_gpu_ranking.py runs both on rows it builds)",
    ),
    (r"python -m recipes\.hf\.exporter", "reads a trained checkpoint (tests/recipes/test_hf_cpu.py exports one)"),
    (r"python -m launcher\.report ", "reads run directories that training wrote (results/...)"),
    (
        r"python -m recipes\.evaluation fetch ",
        "downloads task data from the hub (network); tests/launcher/test_evaluation.py runs its --dry-run",
    ),
    (r"python -m data_prep train-tokenizer ", "trains on the reader's corpus (tests/data_prep train tokenizers)"),
    (r"python main.py .*'stages=\[export\]'", "exports the checkpoint a run wrote (stages=[export] alone needs one)"),
    (r"python main.py .*training\.tokenizer\.path=/", "names a tokenizer on the cluster; the plan checks it exists"),
    (r"python main.py .*'data_preparation\.inputs=\[/", "names input files on the cluster; the plan checks they exist"),
    (
        r"python main.py .*cluster=(bcp|k8s) .*(workspaces|volumes)=",
        "runs from the repository in the cluster's shared workspace or volume, which the plan checks",
    ),
    (r"python main.py --config-dir site ", "reads the reader's own site directory (test_site_config.py makes one)"),
    (r".*\.\.\.", "leaves arguments out (...)"),
]


@dataclass(frozen=True)
class Command:
    document: str
    line: str
    output: tuple[str, ...]  # what the page shows it prints (after `$ `), or nothing

    def __str__(self) -> str:
        return f"{self.document}: {self.line}"


def code_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced block, indented ones (in list items) dedented."""
    return [(lang, textwrap.dedent(body)) for lang, body in re.findall(r"^ *```(\w*)\n(.*?)^ *```", text, re.S | re.M)]


def commands(document: Path) -> list[Command]:
    found = []
    for language, block in code_blocks(document.read_text()):
        lines = block.replace("\\\n", " ").splitlines()
        for index, line in enumerate(lines):
            shown = line.startswith("$ ")
            if not shown and (language != "bash" or not line.strip() or line.lstrip().startswith("#")):
                continue
            command = re.split(r"\s+# ", line[2:] if shown else line)[0].strip()
            output = []
            if shown:
                for after in lines[index + 1 :]:
                    if after.startswith("$ "):
                        break
                    output.append(after)
            found.append(Command(str(document.relative_to(REPO)), re.sub(r"\s+", " ", command), tuple(output)))
    return found


ALL = [c for doc in DOCUMENTS for c in commands(doc)]


def kind(command: Command) -> str:
    """main | generate | report | the reason it is not run."""
    line = command.line
    if line.startswith("python -m launcher.report ") and _report_paths(line):
        return "report"
    for pattern, reason in NOT_RUN:
        if re.match(pattern, line):
            return reason
    if line.startswith("python main.py "):
        return "main"
    if line.startswith("bash generate_dataset.sh"):
        return "generate"
    return ""


def arguments(line: str) -> list[str]:
    return shlex.split(line, comments=True)


def _report_paths(line: str) -> list[str]:
    """The paths a report command reads, when every one is a tracked test fixture under tests/; else []. Only those:
    which tests are collected must not depend on what a reader left in the checkout (a results/ directory)."""
    args = arguments(line)[3:]
    paths, skip = [], False
    for arg in args:
        if skip or arg.startswith("-"):
            skip = arg.startswith("--") and arg not in ("--rank",)
            continue
        paths.append(arg)
    tracked = all(p.startswith("tests/") and (REPO / p).exists() for p in paths)
    return paths if paths and tracked else []


# Each distinct command once (README.md and a page may show the same one).
RUN = list({(c.line, c.output): c for c in reversed(ALL) if kind(c) in ("main", "generate", "report")}.values())[::-1]


def test_the_documents_have_commands_of_each_kind():
    kinds = [kind(c) for c in RUN]
    sweeps = [c for c in RUN if " -m " in f" {c.line} "]
    shown = [c for c in RUN if c.output]
    assert kinds.count("main") >= 20 and len(sweeps) >= 3 and len(shown) >= 4 and "report" in kinds
    assert "generate" in kinds


def test_every_command_is_run_or_says_why_not():
    unknown = [str(c) for c in ALL if not kind(c)]
    assert not unknown, "commands neither run by this test nor named in NOT_RUN:\n" + "\n".join(unknown)


@pytest.mark.parametrize("command", RUN, ids=str)
def test_each_command_runs(tmp_path, command):
    args = arguments(command.line)
    how = kind(command)
    if how == "main":
        dry = [] if command.output or "dry_run=true" in args else ["dry_run=true"]
        out = run_main(*args[2:], *dry, cwd=tmp_path)
    elif how == "generate":
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHON": sys.executable}
        out = subprocess.run(
            ["bash", str(REPO / args[1]), *args[2:], "dry_run=true"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    else:
        for path in _report_paths(command.line):
            copy = getattr(shutil, "copytree" if (REPO / path).is_dir() else "copy")
            (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
            copy(REPO / path, tmp_path / path)
        fixtures = _files(tmp_path / "tests")
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        out = subprocess.run(
            [sys.executable, *args[1:]], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
        # Run from a checkout, as the page shows it, the command must leave the repository's files as they are.
        assert _files(tmp_path / "tests") == fixtures, "the command wrote into the repository's tests/"
    printed = (out.stdout + out.stderr).strip().splitlines()
    if command.output:
        assert printed == [line for line in command.output if line.strip()], out.stdout + out.stderr
        return
    assert out.returncode == 0, out.stdout + out.stderr
    if how in ("main", "generate"):
        _one_run_directory_per_point(tmp_path, command.line)


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_only_tracked_fixtures_make_report_commands_run(tmp_path, monkeypatch):
    """A leftover results/RUN in the checkout does not add a test: report commands run only on tests/ fixtures."""
    leftover = Command("docs/report.md", "python -m launcher.report results/RUN_A", ())
    assert kind(leftover) != "report"
    (tmp_path / "results" / "RUN_A").mkdir(parents=True)
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    assert _report_paths(leftover.line) == [] and kind(leftover) != "report"


def _one_run_directory_per_point(cwd: Path, line: str) -> None:
    points = 1
    for arg in arguments(line):
        key, _, value = arg.partition("=")
        if " -m " in f" {line} " and "," in value and not value.startswith("["):
            points *= len(value.split(","))
    runs = [p for p in (cwd / "results").iterdir() if p.name != "sweeps"]
    assert len(runs) == points, [p.name for p in runs]
    assert all((run / "config.yaml").exists() and (run / "plan.json").exists() for run in runs)
