"""The typed schema: every option of every config group composes, and every resolved value has the type the schema
declares (interpolations included); the configuration reference page (docs/) is the one the schema generates."""

from __future__ import annotations

import dataclasses
import pytest

from common import config as schema
from common.config import load_config
from common.typed import TypedConfigError, to_plain
from hydra.core.config_store import ConfigStore

from launcher.config import reference as config_reference
from launcher.config.compose import compose_plain
from launcher.config.schema import register

from launcher_helpers import REPO

CONF = REPO / "conf"


def options(group: str) -> list[str]:
    """Every selectable option of a group (files under conf/<group>/, without the private _*.yaml)."""
    root = CONF / group
    found = []
    for path in sorted(root.rglob("*.yaml")):
        rel = path.relative_to(root).with_suffix("").as_posix()
        if not any(part.startswith("_") for part in rel.split("/")):
            found.append(rel)
    return found


COMPOSITIONS = (
    [[f"training={t}"] for t in options("training")]
    + [[f"dtype={d}"] for d in options("dtype")]
    + [[f"parallelism={p}", "training=llama31/405b"] for p in options("parallelism")]
    + [[f"cluster={c}"] for c in options("cluster")]
    + [[f"data_preparation={d}"] for d in options("data_preparation")]
    + [[f"peft={p}"] for p in options("peft")]
    + [["training=mlperf/llama31_405b", "cluster=bcm", "cluster.gpus_per_node=4"]]
)


def test_every_group_has_options():
    for group in ("training", "dtype", "parallelism", "cluster", "data_preparation"):
        assert len(options(group)) >= 2, group


@pytest.mark.parametrize("overrides", COMPOSITIONS, ids=lambda o: " ".join(o))
def test_every_option_composes_to_the_declared_types(overrides):
    # Composing builds the typed config (common/typed.py checks every value against its declared type), and the
    # typed config gives back exactly what config.yaml records.
    plain = compose_plain([*overrides, "results_dir=/tmp/results"])
    cfg = load_config(plain)
    assert to_plain(cfg) == plain
    assert type(cfg.cluster) is schema.CLUSTERS[plain["cluster"]["platform"]]
    assert type(cfg.data_preparation) is schema.DATA_SOURCES[plain["data_preparation"]["name"]]
    assert type(cfg.peft) is schema.PEFT_METHODS[plain["peft"]["method"]]


@pytest.mark.parametrize(
    "key,value,line",
    [
        ("training.seq_length", "2048", "training.seq_length='2048' must be an integer"),
        ("cluster.gpus_per_node", True, "cluster.gpus_per_node=True must be an integer"),
        ("stages", ["training", "trianing"], "stages[1]='trianing' is none of container, data_preparation"),
        ("training.model.hidden_sise", 4096, "training.model.hidden_sise is not a config key"),
        ("cluster.platform", "lsf", "cluster.platform='lsf' is none of local, slurm, sge, bcp, k8s"),
    ],
)
def test_a_value_that_does_not_fit_the_schema_is_one_line_naming_its_key(key, value, line):
    plain = compose_plain(["results_dir=/tmp/results"])
    *path, last = key.split(".")
    section = plain
    for part in path:
        section = section[part]
    section[last] = value
    with pytest.raises(TypedConfigError) as err:
        load_config(plain)
    assert str(err.value).startswith(line), str(err.value)


def test_a_config_missing_a_required_key_is_refused_by_name():
    plain = compose_plain(["results_dir=/tmp/results"])
    del plain["training"]["model"]["hidden_size"]
    with pytest.raises(TypedConfigError, match=r"^training\.model\.hidden_size is missing$"):
        load_config(plain)


def test_every_schema_key_has_a_one_line_doc():
    for kind in [v for v in vars(schema).values() if isinstance(v, type) and dataclasses.is_dataclass(v)]:
        for f in dataclasses.fields(kind):
            doc = f.metadata.get("doc", "")
            assert doc and "\n" not in doc, f"{kind.__name__}.{f.name}"


def test_the_docs_reference_is_the_generated_one():
    page = REPO / config_reference.PAGE
    assert page.read_text() == config_reference.page(), (
        f"{config_reference.PAGE} differs from the schema: python -m launcher.config.reference --write "
        f"{config_reference.PAGE}"
    )


def test_registering_again_keeps_the_stored_schema():
    # main.py registers at import and composing registers again: the second converts nothing anew
    register()
    stored = ConfigStore.instance().repo["config_schema.yaml"]
    register()
    assert ConfigStore.instance().repo["config_schema.yaml"] is stored


def _nodes(node, path=""):
    """Every node of an OmegaConf tree with its type, metadata, parent and value: what two conversions must share."""
    from omegaconf import DictConfig
    from omegaconf.basecontainer import BaseContainer

    md = node._metadata
    rows = [(path, type(node).__name__, md.ref_type, md.object_type, md.key, md.optional, repr(md.flags))]
    rows.append((path, "parent", node._get_parent()._get_full_key(None) if node._get_parent() is not None else None))
    if isinstance(node, BaseContainer) and not (node._is_none() or node._is_missing() or node._is_interpolation()):
        keys = list(node.keys()) if isinstance(node, DictConfig) else range(len(node))
        for key in keys:
            child = node._get_node(key)
            assert child._get_parent() is node, f"{path}.{key}"
            rows += _nodes(child, f"{path}.{key}")
    else:
        rows.append((path, repr(node._value())))
    return rows


@pytest.mark.parametrize(
    "kind",
    [schema.Config, *schema.CLUSTERS.values(), *schema.DATA_SOURCES.values(), *schema.PEFT_METHODS.values()],
    ids=lambda kind: kind.__name__,
)
def test_the_stored_schema_nodes_are_omegaconfs_conversion(kind):
    # structured() leaves out OmegaConf's copies of the nodes it has just made: the same tree, no node shared
    from omegaconf import OmegaConf

    from launcher.config.schema import structured

    ours, omegaconfs = structured(kind), OmegaConf.structured(kind)
    assert _nodes(ours) == _nodes(omegaconfs)
    assert OmegaConf.to_yaml(ours) == OmegaConf.to_yaml(omegaconfs)
