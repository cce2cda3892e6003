"""The typed config (common/config.py) in Hydra's ConfigStore: `config_schema` (the whole config, first in
conf/config.yaml's defaults) and one node per platform, data source and fine-tuning method, whose options' YAML
files name their subclass in their defaults list (e.g. `- /schema/cluster/slurm@_here_`); and the `${path:...}`
resolver of conf/."""

from __future__ import annotations

from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from common.config import CLUSTERS, DATA_SOURCES, PEFT_METHODS, Config


def absolute_path(path: str) -> str:
    """`${path:X}` in conf/: X taken from the directory main.py runs in, with ~ expanded. Unlike
    `${hydra:runtime.cwd}` it resolves before Hydra has set up the job, as the sweep directory needs."""
    return str(Path(path).expanduser().absolute())


def register() -> None:
    """Once per process: main.py registers at import and composing registers again, and each store converts its
    dataclasses to OmegaConf nodes anew (about 0.06 s of a dry run)."""
    if not OmegaConf.has_resolver("path"):
        OmegaConf.register_new_resolver("path", absolute_path)
    store = ConfigStore.instance()
    if "config_schema.yaml" in store.repo:
        return
    store.store(name="config_schema", node=Config)
    for name, node in CLUSTERS.items():
        store.store(group="schema/cluster", name=name, node=node)
    for name, node in DATA_SOURCES.items():
        store.store(group="schema/data_preparation", name=name, node=node)
    for name, node in PEFT_METHODS.items():
        store.store(group="schema/peft", name=name, node=node)
