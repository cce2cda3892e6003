"""Composing conf/ (launcher/config/compose.py) reads its YAML files with libyaml's parser under OmegaConf's own
loader: the same data as OmegaConf's pure-Python reading, and a file that does not parse fails in PyYAML's words."""

from __future__ import annotations

import os
from pathlib import Path

import omegaconf._utils
import pytest
import yaml

from launcher.config.compose import _libyaml_parsing, compose

from launcher_helpers import REPO

# What OmegaConf's loader reads unlike PyYAML's SafeLoader (1e-5 is a float, dates stay strings), and plain values.
TRICKY = "a: 1e-5\nb: 3.0e+2\nc: .inf\nd: 2024-01-01\ne: 0o17\nf: 1_000\ng: ~\nh: [1, 'x', yes]\ni: {j: null}\n"


def _both_ways(text: str) -> tuple[str, str]:
    """`text` as OmegaConf's loader reads it, and as it reads it within _libyaml_parsing (which must be libyaml's)."""
    pure = yaml.load(text, Loader=omegaconf._utils.get_yaml_loader())
    with _libyaml_parsing():
        loader = omegaconf._utils.get_yaml_loader()
    assert issubclass(loader, yaml.cyaml.CParser)
    return repr(yaml.load(text, Loader=loader)), repr(pure)


@pytest.mark.parametrize("path", sorted((REPO / "conf").rglob("*.yaml")), ids=lambda p: str(p.relative_to(REPO)))
def test_libyaml_reads_every_conf_file_as_omegaconf_does(path: Path):
    fast, pure = _both_ways(path.read_text())
    assert fast == pure


def test_libyaml_keeps_omegaconfs_own_reading_of_values():
    fast, pure = _both_ways(TRICKY)
    assert fast == pure
    assert "'a': 1e-05" in fast and "'d': '2024-01-01'" in fast


def test_a_file_that_does_not_parse_fails_in_pyyamls_words(tmp_path: Path):
    # libyaml would say "did not find expected ',' or ']'"; the error lines quote PyYAML's message
    (tmp_path / "cluster").mkdir()
    broken = tmp_path / "cluster" / "broken.yaml"
    broken.write_text("partition: [batch,\naccount: x\n")
    with pytest.raises(yaml.YAMLError) as composed:
        compose([f"hydra.searchpath=[file://{tmp_path}]", "cluster=broken"])
    with open(os.path.realpath(broken)) as f, pytest.raises(yaml.YAMLError) as pure:
        yaml.load(f, Loader=omegaconf._utils.get_yaml_loader())
    assert str(composed.value) == str(pure.value)


# Runs that take their model's default layout, each with what the command line adds (the tiny and 8B layouts' files
# have no defaults beyond _common: the merge; the 70B and 405B layouts name their userbuffers: composed in full).
DEFAULT_LAYOUT_RUNS = [
    [],
    ["training=llama31/8b", "dtype=fp8"],
    ["training=llama31/tiny", "parallelism.vp=2", "parallelism.num_gpus=4", "cluster=bcm"],
    ["training=llama32/1b", "peft=lora"],
    ["training=finetune/llama31_8b_lora_1gpu"],
    ["training=llama31/405b", "dtype=fp8", "parallelism.num_gpus=1024"],
]


@pytest.mark.parametrize("overrides", DEFAULT_LAYOUT_RUNS, ids=lambda o: " ".join(o) or "defaults")
def test_a_default_layout_merged_into_the_first_composition_is_the_run_that_names_it(overrides):
    from launcher.config.compose import _compose_once, _composed, to_plain, with_layout

    merged = _composed(overrides)
    layout = merged.hydra.runtime.choices.parallelism
    assert layout != "default"
    named = _compose_once(with_layout(overrides, layout), None)  # the reference: Hydra composing it in full
    assert to_plain(merged) == to_plain(named)
    assert dict(merged.hydra.runtime.choices) == dict(named.hydra.runtime.choices)
    assert list(merged.hydra.overrides.task) == list(named.hydra.overrides.task)
    assert merged.hydra.job.override_dirname == named.hydra.job.override_dirname


def test_the_default_layout_of_a_plain_run_is_merged_not_composed_again():
    from launcher.config.compose import _compose_once, _layout_merged

    first = _compose_once([], None)
    assert _layout_merged(first, [], "tp1") is not None  # the equality above is then the merge's, not Hydra's


@pytest.mark.parametrize("overrides", DEFAULT_LAYOUT_RUNS[:4], ids=lambda o: " ".join(o) or "defaults")
def test_hydras_compose_without_its_needless_copies_is_the_same_config(overrides, monkeypatch):
    # _without_needless_copies leaves out copies and a node Hydra makes that the composition never reads: the config,
    # Hydra's node included, is the one Hydra composes with them
    import contextlib

    from omegaconf import OmegaConf

    from launcher.config import compose as composing

    composing._hydra_over_conf()
    fast = composing._hydra_composed(overrides)
    monkeypatch.setattr(composing, "_without_needless_copies", contextlib.nullcontext)
    hydras = composing._hydra_composed(overrides)
    assert OmegaConf.to_yaml(fast) == OmegaConf.to_yaml(hydras)
    assert OmegaConf.get_type(fast.cluster) is OmegaConf.get_type(hydras.cluster)


def test_the_default_layout_merge_keeps_hydraconfig_the_copy_of_the_runs_node():
    # ${hydra:...} reads HydraConfig's copy of the node: after the merge it names the layout, as set_config would
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from launcher.config.compose import _composed

    cfg = _composed(["seed=3"])
    kept = HydraConfig.get()
    assert kept.runtime.choices.parallelism == cfg.hydra.runtime.choices.parallelism != "default"
    assert OmegaConf.to_yaml(kept) == OmegaConf.to_yaml(cfg.hydra)


def test_with_other_hydra_or_omegaconf_releases_the_shortcuts_are_left_out(monkeypatch):
    # The shortcuts mirror Hydra 1.3 and OmegaConf 2.3 internals; another release composes at the libraries' pace
    import hydra
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    from launcher.config import compose as composing
    from launcher.config import schema

    assert schema.knows_the_internals()  # the installed releases are the ones the other tests check
    embed = ConfigLoaderImpl._embed_result_config
    with composing._without_needless_copies():
        assert ConfigLoaderImpl._embed_result_config is not embed
    monkeypatch.setattr(hydra, "__version__", "1.4.0")
    assert not schema.knows_the_internals()
    with composing._without_needless_copies():
        assert ConfigLoaderImpl._embed_result_config is embed
    assert composing.compose(["training=llama31/tiny", "cluster=local"]).training.name


def test_a_schema_nodes_first_load_is_the_node_made_for_it_uncopied_and_later_loads_copy_the_kept_one():
    # Within the composition the first load of a schema node not made yet hands out that node (ConfigStore.load would
    # make it, keep it and hand out a deep copy); the loads after it copy the node then made and kept, as before
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    from launcher.config import compose as composing
    from launcher.config.schema import StoredDataclass, register

    register()
    store = ConfigStore.instance()
    name = "schema/cluster/slurm.yaml"
    kept = store.repo["schema"]["cluster"]["slurm.yaml"]
    assert isinstance(kept, StoredDataclass)
    fresh = StoredDataclass("slurm", kept._kind, group="schema/cluster")
    store.repo["schema"]["cluster"]["slurm.yaml"] = fresh
    try:
        with composing._without_needless_copies():
            first = store.load(name)
            assert not fresh._made  # made for this load alone: nothing kept, nothing copied
            second, third = store.load(name), store.load(name)
        assert fresh._made  # the second load made the node kept from then on, and copied it
        assert all(loaded.node is not fresh._made[0] for loaded in (first, second, third))
        for loaded in (first, second, third):
            assert (loaded.name, loaded.group, loaded.package, loaded.provider) == (
                "slurm.yaml",
                "schema/cluster",
                None,
                None,
            )
            assert OmegaConf.to_yaml(loaded.node) == OmegaConf.to_yaml(kept.node)
            assert OmegaConf.get_type(loaded.node) is OmegaConf.get_type(kept.node)
    finally:
        store.repo["schema"]["cluster"]["slurm.yaml"] = kept


@pytest.mark.parametrize(
    "overrides",
    [*DEFAULT_LAYOUT_RUNS, ["cluster=k8s", "data_preparation=files"], ["training.seq_length=abc"], ["peft.nosuch=1"]],
    ids=lambda o: " ".join(o) or "defaults",
)
def test_merges_that_set_the_parents_once_compose_the_same_nodes(overrides, monkeypatch):
    # _reparented_once sets the parents once per composition rather than at the end of every merge and nested merge:
    # the same nodes (types, flags, parents, values) as Hydra's and OmegaConf's merges give, or the same error
    import contextlib

    from omegaconf import OmegaConf

    from launcher.config import compose as composing

    def composed():
        try:
            cfg = composing._hydra_composed(overrides)
        except Exception as err:  # the same error, in the same words
            return type(err), str(err)
        return OmegaConf.to_yaml(cfg), _tree(cfg)

    composing._hydra_over_conf()
    once = composed()
    monkeypatch.setattr(composing, "_reparented_once", contextlib.nullcontext)
    assert once == composed()


def _tree(node, path=""):
    """Every node below `node`: its path, type, flags, the path of its parent, and a leaf's value."""
    from omegaconf.basecontainer import BaseContainer

    parent = node._get_parent()
    rows = [(path, type(node).__name__, repr(node._metadata.flags), parent is None or parent._get_full_key(None))]
    if isinstance(node, BaseContainer) and not (node._is_none() or node._is_missing() or node._is_interpolation()):
        content = node.__dict__["_content"]
        for key, child in content.items() if isinstance(content, dict) else enumerate(content):
            assert child._get_parent() is node, f"{path}.{key}"
            rows += _tree(child, f"{path}.{key}")
    else:
        rows.append((path, repr(node._value())))
    return rows
