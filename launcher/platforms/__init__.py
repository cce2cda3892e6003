"""Platforms: where the stage jobs run. A platform is a `cluster` config (its `platform` key picks one here) plus a
subclass of launcher/platforms/base.py's Platform, one per module named after it, that lays out, renders and
submits the same stage jobs; the plan and the stage commands (launcher/jobs/commands.py) are shared by all of
them."""

from __future__ import annotations

import functools
import importlib
from typing import TYPE_CHECKING, Any, Mapping

from common.config import PlatformName
from launcher.plan.errors import PlanError

if TYPE_CHECKING:
    from launcher.platforms.base import Platform


@functools.cache
def _registry() -> dict[str, Platform]:
    """Every platform the config schema names (PlatformName): launcher/platforms/<name>.py's PLATFORM. Imported
    here, on first use, because those modules import this package."""
    return {name.value: importlib.import_module(f"launcher.platforms.{name.value}").PLATFORM for name in PlatformName}


def platform_of(cfg: Mapping[str, Any]) -> Platform:
    """The one place a platform is chosen: cfg.cluster.platform."""
    platforms = _registry()
    name = cfg["cluster"].get("platform")
    if name not in platforms:
        raise PlanError([f"cluster.platform={name!r}: use one of {', '.join(platforms)} (conf/cluster/*.yaml)"])
    return platforms[name]
