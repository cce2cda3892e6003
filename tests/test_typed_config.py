"""The run config is typed from end to end: the type checker refuses a misspelt config attribute, and no function
takes the config, or a section of it, as an untyped mapping."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("launcher", "common", "data_prep", "recipes")
# What a parameter carrying the run config, or one of its sections, is called here.
CONFIG_NAMES = {
    "cfg", "config", "run_config", "training", "train", "model", "dtype", "parallelism", "par", "cluster",
    "data_preparation", "prep", "stack", "logging", "profile", "prof", "telemetry", "preflight", "resilience",
    "res", "mlperf", "optimizer", "opt", "scheduler", "sched", "checkpoint", "ckpt", "tokenizer",
}  # fmt: skip
# Files (or file:function) whose config-named mapping parameters hold something else, and what.
NOT_THE_RUN_CONFIG = {
    "launcher/cli.py:run_hydra_app": "Hydra's composition, typed on its first line",
    "common/hf_config.py": "a Hugging Face config.json",
    "launcher/config/compose.py": "Hydra's composition, the one place it becomes the typed Config",
    "launcher/plan/checks/run_dir.py": "an earlier run's config.yaml, perhaps of another version, compared as data",
}
UNTYPED = ("Mapping", "MutableMapping", "dict", "Dict", "DictConfig")


def _untyped_mapping(annotation: ast.expr | None) -> bool:
    if annotation is None:
        return False
    text = ast.unparse(annotation).replace("typing.", "").replace("omegaconf.", "")
    return text == "DictConfig" or any(text.startswith(f"{name}[str, Any]") for name in UNTYPED)


def config_parameters_typed_as_mappings(source: str, where: str) -> list[str]:
    """Parameters named like the config (or a section) and annotated as an untyped mapping, as `where:line f(p: T)`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        arguments = node.args
        for arg in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]:
            named_like_config = arg.arg in CONFIG_NAMES or arg.arg.endswith(("_cfg", "_config"))
            if named_like_config and _untyped_mapping(arg.annotation):
                if f"{where}:{node.name}" not in NOT_THE_RUN_CONFIG:
                    found.append(f"{where}:{node.lineno} {node.name}({arg.arg}: {ast.unparse(arg.annotation)})")
    return found


def test_no_function_takes_the_run_config_as_an_untyped_mapping():
    found = [
        hit
        for package in PACKAGES
        for path in sorted((REPO / package).rglob("*.py"))
        if str(path.relative_to(REPO)) not in NOT_THE_RUN_CONFIG
        for hit in config_parameters_typed_as_mappings(path.read_text(), str(path.relative_to(REPO)))
    ]
    assert found == [], "\n".join(found)


def test_the_check_finds_a_config_taken_as_a_mapping_and_leaves_records_alone():
    source = (
        "from typing import Any, Mapping\n"
        "def plan(cfg: Mapping[str, Any], rows: dict[str, Any], model_cfg: dict[str, Any] | None = None): ...\n"
        "def render(*, cluster: DictConfig): ...\n"
    )
    assert config_parameters_typed_as_mappings(source, "sample.py") == [
        "sample.py:2 plan(cfg: Mapping[str, Any])",
        "sample.py:2 plan(model_cfg: dict[str, Any] | None)",
        "sample.py:3 render(cluster: DictConfig)",
    ]


def test_the_type_checker_refuses_a_misspelt_config_attribute():
    fixture = REPO / "tests" / "typecheck" / "misspelt_attribute.py"
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", str(fixture.relative_to(REPO))],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    assert '"TrainingConfig" has no attribute "seq_lenght"' in result.stdout, result.stdout
