"""Checks of the weights a run starts from (training.checkpoint.init_from / init_from_hf) that the plan makes on
the host: a Hugging Face config.json is compared with training.model when the directory can be read from here
(the module that does it on the GPU side too, common/hf_config.py, is plain Python and json)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from common import hf_config
from launcher.plan.findings import Findings
from launcher.plan.sizes import Sizes


def check(cfg: Mapping[str, Any], sizes: Sizes, found: Findings) -> None:
    for line in init_problems(cfg, sizes.num_nodes or 1):
        found.problem(line)


def init_problems(cfg: Mapping[str, Any], num_nodes: int) -> list[str]:
    ckpt = cfg["training"]["checkpoint"]
    value = ckpt.get("init_from_hf")
    if not value:
        return []
    value = str(value)
    key = hf_config.KEY
    if ckpt.get("init_from"):
        return [f"training.checkpoint.init_from and {key} are both set; keep one"]
    local = cfg["cluster"]["name"] == "local"
    if hf_config.is_hub_id(value):
        if num_nodes > 1:
            return [
                f"{key}={value} is a hub id, which rank 0 downloads on its node only; for a {num_nodes}-node job "
                f"fetch it into a directory every node sees (python -m recipes.hf.importer fetch {value} "
                f"--local-dir /shared/models/{value.split('/')[-1]}) and set {key} to it"
            ]
        directory = hf_config.cached_snapshot(value)
        if directory is None:
            return []  # not downloaded yet: rank 0 downloads it, every rank checks it before building the model
    else:
        directory = Path(value).expanduser()
        if not directory.is_absolute() and not local:
            return [f"{key}={value} must be an absolute path (jobs do not run in this directory)"]
        if not directory.is_dir():
            # Possibly a path only the compute nodes see: the ranks check it before building the model.
            return (
                []
                if not local
                else [
                    f"{key}={value} is not a directory (a Hugging Face model directory or a "
                    "hub id such as meta-llama/Llama-3.1-8B)"
                ]
            )
    try:
        hf_config.check_directory(directory, cfg["training"]["model"], source=value)
    except hf_config.HFConfigError as err:
        return [str(err)]
    return []
