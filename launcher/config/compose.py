"""Resolving the Hydra config into the plain dict the plan and the run directory use."""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any, Sequence

from omegaconf import DictConfig, OmegaConf, open_dict

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


def to_plain(cfg: DictConfig) -> dict[str, Any]:
    """Fully resolved plain dict of the job config (without Hydra's own node)."""
    cfg = cfg.copy()
    if "hydra" in cfg:
        with open_dict(cfg):
            del cfg["hydra"]
    return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True, enum_to_str=True)  # type: ignore[return-value]


def compose(overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Compose and resolve the config as `python main.py <overrides>` would, outside of @hydra.main
    (tests, benchmarks, notebooks)."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    from launcher.config.schema import register

    register()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = hydra_compose("config", overrides=list(overrides), return_hydra_config=True)
        HydraConfig.instance().set_config(cfg)
        return to_plain(cfg)


def compose_unresolved(overrides: Sequence[str] = ()) -> dict[str, Any]:
    """The composed config as conf/ writes it: interpolations such as ${path:results} kept, not resolved."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from launcher.config.schema import register

    register()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = hydra_compose("config", overrides=list(overrides))
    return OmegaConf.to_container(cfg, resolve=False, enum_to_str=True)  # type: ignore[return-value]


@contextmanager
def hydra_state_kept():
    """compose() re-initializes Hydra; a running Hydra app (main.py, a sweep) needs its own state back afterwards."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    saved_hydra, saved_cfg = GlobalHydra.instance().hydra, HydraConfig.instance().cfg
    try:
        yield
    finally:
        GlobalHydra.instance().hydra = saved_hydra
        HydraConfig.instance().cfg = saved_cfg
