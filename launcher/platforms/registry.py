"""The one place a platform is chosen: cluster.platform names one of the modules beside this one, imported when a
run uses it (importing all five is about 0.03 s of every main.py run)."""

from __future__ import annotations

import importlib
from typing import Any

from common.config import ClusterConfig, PlatformName
from launcher.platforms.base import Platform


def platform_of(cluster: ClusterConfig) -> Platform[Any]:
    """The platform of cluster.platform (the config schema accepts only the names of PlatformName)."""
    return platform_named(cluster.platform)


def platform_named(name: PlatformName) -> Platform[Any]:
    """PLATFORM of launcher/platforms/<name>.py."""
    platform: Platform[Any] = importlib.import_module(f"launcher.platforms.{name.value}").PLATFORM
    return platform
