"""Launcher test fixtures: configs composed as `python main.py` would, with results in the test's temp dir."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.config.compose import compose


@pytest.fixture
def results(tmp_path: Path) -> Path:
    return tmp_path / "results"


@pytest.fixture
def cfg_for(results: Path):
    """compose(overrides) with results_dir in the test's temp dir."""

    def make(*overrides: str) -> dict:
        return compose([*overrides, f"results_dir={results}"])

    return make
