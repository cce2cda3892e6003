"""Resolving the Hydra config into the plain dict the plan and the run directory use."""

from __future__ import annotations

import copy
import sys
from collections import Counter
from contextlib import ExitStack, contextmanager
from enum import Enum
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional, Sequence

import omegaconf._utils
import yaml
from hydra import compose as hydra_compose, initialize_config_dir
from hydra._internal.config_loader_impl import ConfigLoaderImpl, get_overrides_dirname
from hydra._internal import defaults_list
from hydra._internal.defaults_list import Overrides
from hydra.core.config_store import ConfigNode, ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.types import Override
from hydra.errors import ConfigCompositionException, MissingConfigException
from hydra.plugins.config_source import ConfigResult
from omegaconf import DictConfig, ListConfig, OmegaConf, flag_override, read_write
from omegaconf.basecontainer import BaseContainer
from omegaconf.errors import OmegaConfBaseException

from common.config import Config, DefaultLayout, DtypeConfig, load_config
from common.typed import from_plain
from launcher.config.schema import StoredDataclass, knows_the_internals, register
from launcher.config.sweep import parse

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
# conf/config.yaml's parallelism: not a layout, but the one the training option names (training.default_layout).
DEFAULT_LAYOUT = "default"
# The configs a sweep composed from its points' config-group overrides alone, by those overrides (None: it did not
# compose): the points that differ only in keys share one (_from_base).
Bases = dict[tuple[str, ...], Optional[DictConfig]]


def to_plain(cfg: DictConfig) -> dict[str, Any]:
    """Fully resolved plain dict of the job config (without Hydra's own node). Section by section: each resolves
    against the whole config, and nothing is copied (a copy of the config costs as much as resolving it)."""
    return {
        str(key): OmegaConf.to_container(cfg[key], resolve=True, throw_on_missing=True, enum_to_str=True)
        if OmegaConf.is_config(cfg[key])
        else _plain_value(cfg, str(key))
        for key in cfg
        if key != "hydra"
    }


def _plain_value(cfg: DictConfig, key: str) -> Any:
    value = cfg[key]
    return value.name if isinstance(value, Enum) else value


def _composed(overrides: Sequence[str], bases: Bases | None = None) -> DictConfig:
    """The config as `python main.py <overrides>` composes it (the schema registered first), Hydra's node
    included, outside of @hydra.main; from a base of `bases` where one fits (the points of a sweep). A run that
    takes the default layout becomes the run that names it: the layout merged into this composition where that
    is certain to be the same (_layout_merged), else composed again with the layout named (in a sweep, from the
    base of the overrides that name it)."""
    _hydra_over_conf()
    cfg = _compose_once(overrides, bases)
    layout = default_layout_of(cfg.hydra.runtime.choices, cfg)
    if layout is None:
        return cfg
    merged = _layout_merged(cfg, overrides, layout)
    if merged is not None:
        return merged
    try:
        return _compose_once(with_layout(overrides, layout), bases)
    except MissingConfigException as err:
        if f"parallelism/{layout}" not in str(err):
            raise
        raise ConfigCompositionException(
            f"training.default_layout names parallelism={layout}, which is not a layout of conf/parallelism/: fix "
            "the training option's default_layout, or choose a layout with parallelism=<name>"
        ) from None


def _layout_merged(cfg: DictConfig, overrides: Sequence[str], layout: str) -> DictConfig | None:
    """`cfg` (composed with parallelism=default) turned into the config of the same overrides with
    parallelism=<layout>, without composing again (half of a dry run): the layout's file merged over the
    parallelism node as Hydra merges a group option (over the schema and _common.yaml, which default.yaml only
    names), then the command line's parallelism keys applied again, as they come after every file. None (compose
    in full) where that is not certain to be the same: a layout file with other defaults than _common, an override
    of Hydra's node (a search path may hold other layouts), or a parallelism key added or deleted (+/~)."""
    named = parse(with_layout(overrides, layout))
    if any(o.is_hydra_override() for o in named):
        return None
    repository = _repository()
    own = repository.load_config(f"parallelism/{layout}")
    common = repository.load_config("parallelism/_common")
    if own is None or common is None:
        return None  # the full compose names the missing layout
    if [getattr(d, "path", None) for d in own.defaults_list or []] != ["_common", "_self_"]:
        return None
    try:
        keys = Overrides(repository, named).config_overrides
    except Exception:  # whatever it is, the full compose raises it again
        return None
    again = [o for o in keys if o.key_or_group.startswith("parallelism.")]
    if any(o.is_add() or o.is_delete() or o.is_force_add() for o in again):
        return None
    cfg.parallelism.merge_with(common.config, own.config)
    ConfigLoaderImpl._apply_overrides_to_config(again, cfg)
    # Hydra's node, and the copy of it that HydraConfig keeps for ${hydra:...} (as set_config(cfg) would make it
    # again, without a second deep copy of the node)
    kept: Any = HydraConfig.instance().cfg
    is_kept = kept is not None and kept.hydra._get_parent() is cfg
    for node in (cfg, kept) if is_kept else (cfg,):
        with read_write(node.hydra):  # Hydra's node is read-only once composed
            node.hydra.runtime.choices.parallelism = layout
            _record_overrides(node, named)
    if not is_kept:
        HydraConfig.instance().set_config(cfg)
    return cfg


def _compose_once(overrides: Sequence[str], bases: Bases | None) -> DictConfig:
    cfg = _from_base(overrides, bases) if bases is not None else None
    if cfg is None:
        cfg = _hydra_composed(overrides)
    HydraConfig.instance().set_config(cfg)
    return cfg


def default_layout_of(choices: Mapping[str, Any], cfg: DictConfig) -> str | None:
    """The layout the training option names for the dtype (training.default_layout) when the run takes the
    default (`choices`: Hydra's group choices); None when it names a layout."""
    if choices.get("parallelism") != DEFAULT_LAYOUT:
        return None
    layouts = from_plain(DefaultLayout, _resolved(cfg.training.default_layout), path="training.default_layout")
    layout = layouts.for_dtype(from_plain(DtypeConfig, _resolved(cfg.dtype), path="dtype"))
    if layout is None:
        raise ConfigCompositionException(
            f"training={choices.get('training')} names no default layout (training.default_layout.bf16): set it "
            "to a layout of conf/parallelism/ in the option's YAML, or choose one with parallelism=<name>"
        )
    return layout


def _resolved(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=True, throw_on_missing=True, enum_to_str=True)


def with_layout(overrides: Sequence[str], layout: str) -> list[str]:
    """The overrides choosing `layout` instead of the default (a `parallelism=default` among them replaced)."""
    kept = [o for o in overrides if o.partition("=")[0].lstrip("+~") != "parallelism"]
    return [*kept, f"parallelism={layout}"]


def search_path(config_dirs: Sequence[Path]) -> list[str]:
    """The override adding --config-dir directories to the search path of compose() (none without any)."""
    return [f"hydra.searchpath=[{','.join(f'file://{d}' for d in config_dirs)}]"] if config_dirs else []


def _hydra_composed(overrides: Sequence[str]) -> DictConfig:
    with _reparented_once(), _without_needless_copies():  # this order: the second wraps the first's composition
        try:
            with _libyaml_parsing():
                return hydra_compose("config", overrides=list(overrides), return_hydra_config=True)
        except yaml.YAMLError:
            pass  # libyaml words a file that does not parse its own way: PyYAML's words, which the error lines quote
        return hydra_compose("config", overrides=list(overrides), return_hydra_config=True)


@contextmanager
def _without_needless_copies() -> Iterator[None]:
    """Four things Hydra's compose does whose results the composition never reads (a fifth of a dry run's
    compose), left out within this block, which changes nothing else:
    - the deep copy of its repository (to re-initialize the copy's sources) copies the ConfigStore singleton with
      every stored node, which the copy only reads from, deep-copying each node it loads: the copy shares it;
    - every config with a defaults list makes an OmegaConf node of the choices so far, which only an interpolation
      in that list (`- x: ${y}`) reads: made for such a list only;
    - a config placed at a package (`cluster`, `training`, ...) is deep-copied into a node holding it there, before
      that node is merged as every config is: placed without a copy where the defaults list names it once (a config
      named twice, as `- db@a: x` and `- db@b: x` may, is copied each time);
    - the ConfigStore hands out a deep copy of the node it keeps: a schema node not made yet is made for the load
      that asks for it and handed out as it is (schema.py, StoredDataclass.loaded_uncopied)."""
    if not knows_the_internals():
        yield
        return
    make_map = defaults_list._create_interpolation_map
    embed = ConfigLoaderImpl._embed_result_config
    compose_from = ConfigLoaderImpl._compose_config_from_defaults_list
    load = ConfigStore.load
    named_once: set[int] = set()  # the loaded configs (by id) that the defaults list being composed names once

    def interpolation_map(overrides: Any, defaults: list[Any], self_added: bool) -> Any:
        if any(not d.is_self() and d.is_interpolation() for d in defaults):
            return make_map(overrides, defaults, self_added)
        return None  # read by nothing: _create_defaults_tree_impl resolves the interpolations of `defaults` only

    def composed_from(loader: ConfigLoaderImpl, defaults: list[Any], repo: Any) -> DictConfig:
        named_once.clear()
        for path, times in Counter(d.config_path for d in defaults).items():
            loaded = repo.load_config(path) if path is not None and times == 1 else None  # each already loaded
            if loaded is not None:
                named_once.add(id(loaded.config))
        return compose_from(loader, defaults, repo)

    def placed_uncopied(ret: ConfigResult, package_override: str | None) -> ConfigResult:
        package = ret.header["package"] if package_override is None else package_override
        if not package or id(ret.config) not in named_once:
            return embed(ret, package_override)
        cfg = OmegaConf.create()
        with flag_override(cfg, "no_deepcopy_set_nodes", True):
            OmegaConf.update(cfg, package, ret.config, merge=False)
        ret = copy.copy(ret)
        ret.config = cfg
        return ret

    def loaded(store: ConfigStore, config_path: str) -> ConfigNode:
        entry = store._load(config_path)
        made = entry.loaded_uncopied() if isinstance(entry, StoredDataclass) else None
        return load(store, config_path) if made is None else made

    with ExitStack() as replaced:
        replaced.enter_context(_replaced(ConfigStore, "__deepcopy__", _the_store))
        replaced.enter_context(_replaced(ConfigStore, "load", loaded))
        replaced.enter_context(_replaced(defaults_list, "_create_interpolation_map", interpolation_map))
        replaced.enter_context(_replaced(ConfigLoaderImpl, "_embed_result_config", staticmethod(placed_uncopied)))
        replaced.enter_context(_replaced(ConfigLoaderImpl, "_compose_config_from_defaults_list", composed_from))
        yield


@contextmanager
def _reparented_once() -> Iterator[None]:
    """OmegaConf's merge ends by setting the parent of every node of the config merged into (a node moved there, or
    an item of a list merged anew, may still point at the node it came from), and so does each nested merge within
    it; Hydra merges the 30 configs of a composition into one config in turn, each merge setting every parent of all
    merged so far. Within this block each nested node's parents are set once, by the merge it is part of, and the
    configs of a composition are merged in turn with every parent set once after the last (6% of a dry run). The
    parents are right before anything reads them: a merge reads none that this leaves pointing elsewhere (items of
    a merged list: a list is merged by replacing its items, not reading them), nor does anything between the merges
    of a composition."""
    if not knows_the_internals():
        yield
        return

    def merged(self: BaseContainer, *others: Any) -> None:
        try:
            _merged_without_reparenting(self, *others)
            self._re_parent()
        except Exception as e:
            self._format_and_raise(key=None, value=None, cause=e)

    with ExitStack() as replaced:
        replaced.enter_context(_replaced(BaseContainer, "merge_with", merged))
        replaced.enter_context(_replaced(BaseContainer, "_merge_with", _merged_without_reparenting))
        replaced.enter_context(_replaced(ConfigLoaderImpl, "_compose_config_from_defaults_list", _merged_in_turn))
        yield


def _merged_without_reparenting(self: BaseContainer, *others: Any) -> None:
    """OmegaConf 2.3's BaseContainer._merge_with without its last line, self._re_parent()."""
    for other in others:
        if other is None:
            raise ValueError("Cannot merge with a None config")
        flags = {"allow_objects": True} if self._get_flag("allow_objects") is True else {}
        other = omegaconf._utils._ensure_container(other, flags=flags)
        if isinstance(self, DictConfig) and isinstance(other, DictConfig):
            BaseContainer._map_merge(self, other)
        elif isinstance(self, ListConfig) and isinstance(other, ListConfig):
            BaseContainer._list_merge(self, other)
        else:
            raise TypeError("Cannot merge DictConfig with ListConfig")


def _merged_in_turn(loader: ConfigLoaderImpl, defaults: list[Any], repo: Any) -> DictConfig:
    """Hydra 1.3's ConfigLoaderImpl._compose_config_from_defaults_list, the parents set once after the last merge
    (cfg.merge_with sets them after each)."""
    cfg = OmegaConf.create()
    with flag_override(cfg, "no_deepcopy_set_nodes", True):
        for default in defaults:
            loaded = loader._load_single_config(default=default, repo=repo)
            try:
                try:
                    _merged_without_reparenting(cfg, loaded.config)
                except Exception as e:  # as cfg.merge_with raises it
                    cfg._format_and_raise(key=None, value=None, cause=e)
            except OmegaConfBaseException as e:  # as Hydra raises it, the merge's error its __context__
                raise ConfigCompositionException(  # noqa: B904
                    f"In '{default.config_path}': {type(e).__name__} raised while composing config:\n{e}"
                ).with_traceback(sys.exc_info()[2])
    cfg._re_parent()
    _strip_defaults(cfg)
    return cfg


def _strip_defaults(cfg: Any) -> None:
    """The defaults lists left in the composed config removed (strip_defaults of Hydra's function above)."""
    if isinstance(cfg, DictConfig):
        if cfg._is_missing() or cfg._is_none():
            return
        with flag_override(cfg, ["readonly", "struct"], False):
            if cfg._get_flag("HYDRA_REMOVE_TOP_LEVEL_DEFAULTS"):
                cfg._set_flag("HYDRA_REMOVE_TOP_LEVEL_DEFAULTS", None)
                cfg.pop("defaults", None)
        for _key, value in cfg.items_ex(resolve=False):
            _strip_defaults(value)


@contextmanager
def _replaced(owner: Any, name: str, value: Any) -> Iterator[None]:
    """`owner.name` (a class's own attribute, a module's global) is `value` within this block."""
    missing = object()
    before = vars(owner).get(name, missing)
    setattr(owner, name, value)
    try:
        yield
    finally:
        if before is missing:
            delattr(owner, name)
        else:
            setattr(owner, name, before)


def _the_store(store: ConfigStore, memo: dict[int, Any]) -> ConfigStore:
    """ConfigStore's deep copy: the singleton itself."""
    return store


@contextmanager
def _libyaml_parsing() -> Iterator[None]:
    """OmegaConf reads every YAML file of a composition with PyYAML's pure-Python parser (0.05 s of a dry run);
    within this block its own loader (its duplicate-key check, its float and path tags) runs on libyaml's parser
    where PyYAML was built with it, which gives it the same nodes ten times faster."""
    if not yaml.__with_libyaml__:
        yield
        return
    omegaconf_loader = omegaconf._utils.get_yaml_loader
    loader = _on_libyaml(omegaconf_loader())
    omegaconf._utils.get_yaml_loader = lambda: loader
    try:
        yield
    finally:
        omegaconf._utils.get_yaml_loader = omegaconf_loader


def _on_libyaml(loader: type) -> type:
    """A PyYAML SafeLoader subclass on libyaml's parser, as yaml.CSafeLoader is yaml.SafeLoader on it."""
    from yaml._yaml import CParser

    class Loader(CParser, loader):
        def __init__(self, stream: Any) -> None:
            CParser.__init__(self, stream)
            yaml.constructor.SafeConstructor.__init__(self)
            yaml.resolver.Resolver.__init__(self)

    return Loader


def _from_base(overrides: Sequence[str], bases: Bases) -> DictConfig | None:
    """The config of `overrides` as a copy of the one composed from their config-group overrides alone, the key
    overrides then applied by the function and in the order Hydra's compose applies them once every file is merged:
    the same config, without reading and merging conf/ again for each point of a sweep (a quarter of a second each).
    None where the point composes in full: with an override of Hydra's own node (hydra.searchpath changes where
    configs come from, hydra.job.* what the node records), or when the overrides or the base do not compose (the
    full compose raises the error a single run would)."""
    parsed = parse(overrides)
    if any(o.is_hydra_override() for o in parsed):
        return None
    try:
        # Hydra's own split: an override is a key's unless it names a config group (with a value that is not a dict)
        keys = Overrides(_repository(), parsed).config_overrides
    except Exception:  # whatever it is, the full compose raises it again
        return None
    groups = tuple(str(o.input_line) for o in parsed if o not in keys)
    if groups not in bases:
        bases[groups] = _base(groups)
    base = bases[groups]
    if base is None:
        return None
    cfg = copy.deepcopy(base)
    ConfigLoaderImpl._apply_overrides_to_config(keys, cfg)
    _record_overrides(cfg, parsed)
    return cfg


def _base(groups: Sequence[str]) -> DictConfig | None:
    try:
        return _hydra_composed(groups)
    except Exception:  # the points' full composes report it, each with its own overrides
        return None


def _record_overrides(cfg: DictConfig, parsed: list[Override]) -> None:
    """What Hydra's compose records of the command line in its node, for all of the point's overrides rather than the
    base's: the overrides (hydra.overrides.task) and the directory name made of them (hydra.job.override_dirname)."""
    cfg.hydra.overrides.task = [o.input_line for o in parsed]
    dirname = cfg.hydra.job.config.override_dirname
    cfg.hydra.job.override_dirname = get_overrides_dirname(
        overrides=parsed, kv_sep=dirname.kv_sep, item_sep=dirname.item_sep, exclude_keys=dirname.exclude_keys
    )


def _repository() -> Any:
    """The repository of conf/ that Hydra composes from (set up by _hydra_over_conf)."""
    return _initialized[0].config_loader.repository


_initialized: list[Any] = []  # the Hydra instance _hydra_over_conf set up, while it is the global one


def _hydra_over_conf() -> None:
    """Hydra initialized over conf/ (the schema registered), once: its repository keeps the YAML files it read, so
    the points of a sweep and the tests compose without reading conf/ again. Set up anew when something else
    (main.py's Hydra app, hydra_state_kept) replaced the global instance."""
    hydra = GlobalHydra.instance()
    if hydra.is_initialized() and _initialized and hydra.hydra is _initialized[0]:
        return
    register()
    hydra.clear()
    initialize_config_dir(config_dir=str(CONF_DIR), version_base=None)  # initializes on construction; kept
    _initialized[:] = [hydra.hydra]


def compose_plain(overrides: Sequence[str] = (), bases: Bases | None = None) -> dict[str, Any]:
    """The resolved config as plain data, as config.yaml records it."""
    return to_plain(_composed(overrides, bases))


def compose(overrides: Sequence[str] = (), bases: Bases | None = None) -> Config:
    """Compose and resolve the config as `python main.py <overrides>` would (sweep points, tests, benchmarks). The
    points of a sweep pass one `bases` for all: each config-group choice is then composed once."""
    return load_config(compose_plain(overrides, bases))


def compose_unresolved(overrides: Sequence[str] = ()) -> dict[str, Any]:
    """The composed config as conf/ writes it: interpolations such as ${path:results} kept, not resolved."""
    plain = OmegaConf.to_container(_composed(overrides), resolve=False, enum_to_str=True)
    assert isinstance(plain, dict)  # the config's root is a mapping
    plain.pop("hydra")
    return {str(key): value for key, value in plain.items()}


@contextmanager
def hydra_state_kept():
    """compose() re-initializes Hydra; a running Hydra app (main.py) needs its own state back afterwards."""
    saved_hydra, saved_cfg = GlobalHydra.instance().hydra, HydraConfig.instance().cfg
    try:
        yield
    finally:
        GlobalHydra.instance().hydra = saved_hydra
        HydraConfig.instance().cfg = saved_cfg
