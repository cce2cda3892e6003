"""Resolving the Hydra config into the plain dict the plan and the run directory use."""

from __future__ import annotations

from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Any, Mapping, Sequence

from hydra import compose as hydra_compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf import DictConfig, OmegaConf

from common.config import Config, DefaultLayout, DtypeConfig, load_config
from common.typed import from_plain
from launcher.config.schema import register

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
# conf/config.yaml's parallelism: not a layout, but the one the training option names (training.default_layout).
DEFAULT_LAYOUT = "default"


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


def _composed(overrides: Sequence[str]) -> DictConfig:
    """The config as `python main.py <overrides>` composes it (the schema registered first), Hydra's node
    included, outside of @hydra.main. A run that takes the default layout is composed again with that layout
    named, so it is the same run as one that names it."""
    _hydra_over_conf()
    cfg = _compose_once(overrides)
    layout = default_layout_of(cfg.hydra.runtime.choices, cfg)
    if layout is None:
        return cfg
    try:
        return _compose_once(with_layout(overrides, layout))
    except MissingConfigException as err:
        if f"parallelism/{layout}" not in str(err):
            raise
        raise ConfigCompositionException(
            f"training.default_layout names parallelism={layout}, which is not a layout of conf/parallelism/: fix "
            "the training option's default_layout, or choose a layout with parallelism=<name>"
        ) from None


def _compose_once(overrides: Sequence[str]) -> DictConfig:
    cfg = hydra_compose("config", overrides=list(overrides), return_hydra_config=True)
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


def compose_plain(overrides: Sequence[str] = ()) -> dict[str, Any]:
    """The resolved config as plain data, as config.yaml records it."""
    return to_plain(_composed(overrides))


def compose(overrides: Sequence[str] = ()) -> Config:
    """Compose and resolve the config as `python main.py <overrides>` would (sweep points, tests, benchmarks)."""
    return load_config(compose_plain(overrides))


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
