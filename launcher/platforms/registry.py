"""The one place a platform is chosen: cluster.platform names one of the modules beside this one."""

from __future__ import annotations

from typing import Any

from common.config import ClusterConfig, PlatformName
from launcher.platforms import bcp, k8s, local, sge, slurm
from launcher.platforms.base import Platform

PLATFORMS: dict[PlatformName, Platform[Any]] = {
    PlatformName.local: local.PLATFORM,
    PlatformName.slurm: slurm.PLATFORM,
    PlatformName.sge: sge.PLATFORM,
    PlatformName.bcp: bcp.PLATFORM,
    PlatformName.k8s: k8s.PLATFORM,
}


def platform_of(cluster: ClusterConfig) -> Platform[Any]:
    """The platform of cluster.platform (the config schema accepts only the names registered here)."""
    return PLATFORMS[cluster.platform]
