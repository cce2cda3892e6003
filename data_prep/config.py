"""Read the `data_preparation` section out of a config file.

The launcher writes the fully resolved config into the run directory; `--config` takes that file (or a file
holding just the data_preparation section). Interpolations still present are resolved, so a hand-written
section may use `${.output_dir}` and alike.
"""
from __future__ import annotations

from typing import Any, Sequence

from data_prep.shards import DATASETS, ConfigError


def load_section(path: str, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """The data_preparation section of `path` as plain containers, after `key=value` overrides (dotted paths
    from the file's top level, e.g. data_preparation.workers=8)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        cfg = OmegaConf.load(path)
    except FileNotFoundError:
        raise ConfigError(f"config {path} does not exist") from None
    except Exception as e:
        raise ConfigError(f"cannot read config {path}: {e}") from None
    if "data_preparation" not in cfg and cfg.get("name") in DATASETS:
        cfg = OmegaConf.create({"data_preparation": cfg})  # a bare section: overrides still use full paths
    if overrides:
        bad = [o for o in overrides if "=" not in o]
        if bad:
            raise ConfigError(f"override {bad[0]!r} is not key=value")
        try:
            cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(list(overrides)))
        except OmegaConfBaseException as e:
            raise ConfigError(f"cannot apply overrides {list(overrides)}: {e}") from None
    if "data_preparation" in cfg:
        section = cfg.data_preparation
    else:
        raise ConfigError(f"config {path} has no data_preparation section (pass the run directory's config.yaml)")
    try:
        return OmegaConf.to_container(section, resolve=True)
    except OmegaConfBaseException as e:
        msg = str(e).splitlines()[0]
        raise ConfigError(f"config {path}: cannot resolve data_preparation ({msg}); pass the resolved config.yaml "
                          "the launcher writes into the run directory") from None
