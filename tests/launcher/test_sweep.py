"""Sweep points: which overrides tell them apart, and run names that never collide."""

from __future__ import annotations

from launcher.config import sweep


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
