"""Checks of the weights a run starts from (training.checkpoint.init_from / init_from_hf) that the plan makes on
the host, when the directory can be read from here: its config.json against training.model, and its safetensors
headers (every tensor there, complete, of the shape training.model needs). The modules that do it on the GPU side
too, common/hf_config.py and common/safetensors_io.py, are plain Python."""

from __future__ import annotations

from pathlib import Path

from common import hf_config
from common.config import Config
from common.safetensors_io import SafetensorsFileError, SafetensorsFiles
from launcher.plan.findings import Findings
from launcher.plan.sizes import Sizes


def check(cfg: Config, sizes: Sizes, found: Findings) -> None:
    for line in init_problems(cfg, sizes.num_nodes or 1):
        found.problem(line)


def init_problems(cfg: Config, num_nodes: int) -> list[str]:
    ckpt = cfg.training.checkpoint
    value = ckpt.init_from_hf
    if not value:
        return []
    key = hf_config.KEY
    if ckpt.init_from:
        return [f"training.checkpoint.init_from and {key} are both set; keep one"]
    # Jobs that run here see this machine's paths; elsewhere a path may exist only on the compute nodes.
    local = cfg.cluster.runs_here
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
    model = cfg.training.model
    try:
        hf_config.check_directory(directory, model, source=value)
        # The headers only (milliseconds): a truncated or damaged file, a missing tensor or one of another shape
        # would otherwise stop every rank after the queue wait.
        SafetensorsFiles(directory).check(hf_config.hf_shapes(model))
    except hf_config.HFConfigError as err:
        return [str(err)]
    except SafetensorsFileError as err:
        return [f"{key}={value}: {err}"]
    return []
