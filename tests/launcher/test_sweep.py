"""Sweep points: which overrides tell them apart, run names that never collide, and configs composed once per
config-group choice that equal each point's own compose."""

from __future__ import annotations

import pytest
from hydra.core.hydra_config import HydraConfig
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from launcher.config import sweep
from launcher.config.compose import Bases, compose
from launcher.config.errors import error_lines
from launcher.jobs.rundir import config_yaml

# A config group swept (each choice composes in full once) and keys, swept and fixed, that are applied to copies of
# that composition: a plain value, a force-add (++), an interpolation that must resolve to the point's own value.
MIXED_SWEEP = [
    "training=llama31/8b,llama31/70b",
    "training.global_batch_size=64,128",
    "cluster=bcm",
    "cluster.partition=batch",
    "++seed=7",
    "run_name=gbs_${training.global_batch_size}",
]


def test_cli_overrides_drop_hydras_flags():
    argv = ["-m", "training=llama31/70b", "--config-name", "config", "dtype=bf16,fp8", "-cd", "/x", "dry_run=true"]
    assert sweep.cli_overrides(argv) == ["training=llama31/70b", "dtype=bf16,fp8", "dry_run=true"]


def test_swept_keys_and_points():
    overrides = ["training=llama31/70b", "parallelism=tp4_pp4_cp2_vp5,tp4_pp8_vp5", "dtype=bf16,fp8"]
    assert sweep.swept_keys(overrides) == ["parallelism", "dtype"]
    points = sweep.sweep_points(overrides)
    assert len(points) == 4
    assert ["training=llama31/70b", "parallelism=tp4_pp8_vp5", "dtype=fp8"] in points


def test_run_name_suffix_names_the_swept_values_path_safely():
    point = ["training=llama31/70b", "training.global_batch_size=256", "cluster=bcm"]
    assert sweep.run_name_suffix(point, ["training.global_batch_size"]) == "__training.global_batch_size=256"
    assert sweep.run_name_suffix(point, ["training"]) == "__training=llama31-70b"
    assert sweep.run_name_suffix(point, []) == ""


def test_long_suffixes_become_a_stable_short_hash():
    keys = ["cluster.sbatch_args"]
    a = sweep.run_name_suffix(["cluster.sbatch_args=[" + "x" * 100 + "]"], keys)
    b = sweep.run_name_suffix(["cluster.sbatch_args=[" + "y" * 100 + "]"], keys)
    assert a.startswith("__sweep-") and len(a) == len("__sweep-") + 10
    assert a != b and a == sweep.run_name_suffix(["cluster.sbatch_args=[" + "x" * 100 + "]"], keys)


def _recorded(overrides: list[str], bases: Bases | None = None) -> tuple[str, str]:
    """The config.yaml a point's run directory gets, and Hydra's node as composing left it."""
    cfg = compose(overrides, bases)
    return config_yaml(cfg), OmegaConf.to_yaml(HydraConfig.get())


def test_points_composed_from_a_shared_base_equal_their_own_compose(results):
    points = sweep.sweep_points([*MIXED_SWEEP, f"results_dir={results}"])
    bases: Bases = {}
    for point in points:
        assert _recorded(point, bases) == _recorded(point), point
    assert len(points) == 4
    # Per training choice, one composition that finds its default layout (training.default_layout), the batch
    # sizes applied to copies of it; 8B's layout (tp1_cp2: _common and its own keys) is merged into it, while 70B's
    # (its file names its userbuffers) is composed again with its name, a second base
    layouts = {choice: compose([f"training={choice}"]).parallelism.name for choice in ("llama31/8b", "llama31/70b")}
    assert set(bases) == {
        ("training=llama31/8b", "cluster=bcm"),
        ("training=llama31/70b", "cluster=bcm"),
        ("training=llama31/70b", "cluster=bcm", f"parallelism={layouts['llama31/70b']}"),
    }
    assert all(base is not None for base in bases.values())


def test_a_bad_key_in_a_shared_point_fails_as_it_does_alone():
    point = ["training=llama31/8b", "training.global_batch_sizes=64"]
    with pytest.raises(ConfigCompositionException) as alone:
        compose(point)
    bases: Bases = {}
    with pytest.raises(ConfigCompositionException) as shared:
        compose(point, bases)
    assert [base is not None for base in bases.values()] == [True]  # the base composed; the key failed on its copy
    assert error_lines(shared.value) == error_lines(alone.value)
    assert str(shared.value.__cause__) == str(alone.value.__cause__)
