"""The typed config (common/config.py) in Hydra's ConfigStore: `config_schema` (the whole config, first in
conf/config.yaml's defaults) and one node per platform, data source and fine-tuning method, whose options' YAML
files name their subclass in their defaults list (e.g. `- /schema/cluster/slurm@_here_`); and the `${path:...}`
resolver of conf/."""

from __future__ import annotations

import copy
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import hydra
import omegaconf
import omegaconf.basecontainer
from hydra.core.config_store import ConfigNode, ConfigStore
from omegaconf import DictConfig, Node, OmegaConf

from common.config import CLUSTERS, DATA_SOURCES, PEFT_METHODS, Config


def absolute_path(path: str) -> str:
    """`${path:X}` in conf/: X taken from the directory main.py runs in, with ~ expanded. Unlike
    `${hydra:runtime.cwd}` it resolves before Hydra has set up the job, as the sweep directory needs."""
    return str(Path(path).expanduser().absolute())


class StoredDataclass(ConfigNode):
    """A ConfigStore entry as ConfigStore.store makes it, except that its node (OmegaConf's conversion of the
    dataclass, up to 0.04 s each) is made when a composition first loads the entry: a run loads the schema and the
    one platform, data source and fine-tuning method its options name, not the other variants (0.06 s of a dry
    run). Made once, kept by the entry and its copies (ConfigStore.load hands out a deep copy of it, as of any
    stored node)."""

    def __init__(self, name: str, kind: type, group: str | None = None) -> None:
        self.name, self.group, self.package, self.provider = f"{name}.yaml", group, None, None
        self._kind = kind
        self._made: list[DictConfig] = []  # shared with the shallow copies ConfigStore.load makes
        self._own: DictConfig | None = None  # the node set on a copy (ConfigStore.load's deep copy)
        self._lent = False  # whether a node made for one load alone was handed out (loaded_uncopied)

    @property  # ConfigNode's field, made on first read
    def node(self) -> DictConfig:
        if self._own is not None:
            return self._own
        if not self._made:
            self._made.append(structured(self._kind))
        return self._made[0]

    @node.setter
    def node(self, value: DictConfig) -> None:
        self._own = value

    def loaded_uncopied(self) -> ConfigNode | None:
        """ConfigStore.load's result for the entry's first load, before its node is made: a copy of the entry
        holding a node made for this load alone, which nothing else holds, so ConfigStore.load's deep copy of it
        is left out (a dry run loads each node once). None for any later load: ConfigStore.load then makes the
        node the entry keeps (once) and hands out a deep copy of it, as before."""
        if self._made or self._lent:
            return None
        self._lent = True
        loaded = copy.copy(self)
        loaded.node = structured(self._kind)
        return loaded


def knows_the_internals() -> bool:
    """Whether the installed Hydra and OmegaConf are the releases whose internals the shortcuts here and in
    compose.py mirror (tests/launcher/test_schema.py and test_compose.py check them against the libraries' own
    results). With any other release every shortcut is left out: the same configs, composed at the libraries' pace."""
    return hydra.__version__.startswith("1.3.") and omegaconf.__version__.startswith("2.3.")


def structured(kind: type) -> DictConfig:
    """OmegaConf.structured(kind) in half the time: OmegaConf makes a node of each field and then sets a deep copy
    of it into the node of its dataclass, and a nested dataclass's nodes are copied again at each level up. The
    node set is one OmegaConf has just made and nothing else holds (it has no parent yet), so here it is set
    itself; any other node is copied as OmegaConf copies it."""
    if not knows_the_internals():
        node = OmegaConf.structured(kind)
    else:
        with _fresh_nodes_set_uncopied():
            node = OmegaConf.structured(kind)
    assert isinstance(node, DictConfig)  # a dataclass converts to a DictConfig
    return node


class _CopyingAllButFreshNodes:
    """The `copy` module as omegaconf.basecontainer uses it, except that deepcopy returns a node without a parent
    as it is."""

    def __getattr__(self, name: str) -> Any:
        return getattr(copy, name)

    @staticmethod
    def deepcopy(value: Any, memo: Any = None) -> Any:
        if isinstance(value, Node) and value._get_parent() is None:
            return value
        return copy.deepcopy(value, memo)


@contextmanager
def _fresh_nodes_set_uncopied() -> Iterator[None]:
    module: Any = omegaconf.basecontainer
    module.copy = _CopyingAllButFreshNodes()
    try:
        yield
    finally:
        module.copy = copy


def _store(store: ConfigStore, name: str, kind: type, group: str | None = None) -> None:
    """ConfigStore.store(name=name, node=kind, group=group), the node made on first load."""
    where: Any = store.repo
    for part in group.split("/") if group else ():
        where = where.setdefault(part, {})
    where[f"{name}.yaml"] = StoredDataclass(name, kind, group)


def register() -> None:
    """Once per process: main.py registers at import and composing registers again. Each node is made from its
    dataclass when a composition first loads it."""
    if not OmegaConf.has_resolver("path"):
        OmegaConf.register_new_resolver("path", absolute_path)
    store = ConfigStore.instance()
    if "config_schema.yaml" in store.repo:
        return
    _store(store, "config_schema", Config)
    for name, node in CLUSTERS.items():
        _store(store, name, node, group="schema/cluster")
    for name, node in DATA_SOURCES.items():
        _store(store, name, node, group="schema/data_preparation")
    for name, node in PEFT_METHODS.items():
        _store(store, name, node, group="schema/peft")
