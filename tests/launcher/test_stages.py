"""Stage selection and the checks only stages can make (container paths, Slurm times, data shards)."""

from __future__ import annotations

import re

import pytest

from launcher.cli import prepare
from launcher.plan.errors import PlanError
from launcher.platforms.base import time_seconds as slurm_time_seconds

from launcher_helpers import NO_GPU


@pytest.mark.parametrize(
    "text,seconds",
    [
        ("30", 1800),
        ("30:15", 1815),
        ("04:00:00", 14400),
        ("2-00", 172800),
        ("1-02:03", 93780),
        ("1-02:03:04", 93784),
        ("UNLIMITED", None),
    ],
)
def test_slurm_time_formats(text, seconds):
    assert slurm_time_seconds(text) == seconds


@pytest.mark.parametrize("text", ["4h", "", "1:2:3:4", "-5"])
def test_slurm_time_rejects(text):
    with pytest.raises(ValueError):
        slurm_time_seconds(text)


def test_stages_run_in_pipeline_order_whatever_the_listing(cfg_for, tmp_path):
    prepared = prepare(
        cfg_for("cluster=bcm", "stages=[training,container]", "dry_run=true", f"cluster.container={tmp_path}/nemo.sqsh")
    )
    assert [j.stage for j in prepared.stages.jobs] == ["container", "training"]


def test_an_existing_container_is_not_built_again(cfg_for, tmp_path):
    image = tmp_path / "nemo.sqsh"
    image.write_bytes(b"hsqs")
    prepared = prepare(
        cfg_for("cluster=bcm", "stages=[container,training]", f"cluster.container={image}", "dry_run=true")
    )
    assert [j.stage for j in prepared.stages.jobs] == ["training"]
    assert prepared.stages.notes == [f"container: {image} exists; nothing to build"]


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["stages=[container]", "cluster.container=null"], "cluster.container=None is not a .sqsh path"),
        (["stages=[container]", "cluster.container=nemo.sqsh"], "must be an absolute path"),
        (
            ["cluster.container=/nowhere/nemo.sqsh", "dry_run=false"],
            "cluster.container=/nowhere/nemo.sqsh does not exist",
        ),
        (["cluster.signal_before_timeout_s=600", "cluster.time_limit=00:05:00"], "cluster.signal_before_timeout_s=600"),
        (["stages=[]"], "stages is empty"),
    ],
)
def test_stage_problems_name_their_keys(cfg_for, overrides, message):
    with pytest.raises(PlanError, match=re.escape(message)):
        prepare(cfg_for("cluster=bcm", *overrides))


def test_a_missing_container_is_only_a_warning_in_a_dry_run(cfg_for):
    prepared = prepare(cfg_for("cluster=bcm", "cluster.container=/nowhere/nemo.sqsh", "dry_run=true"))
    assert prepared.warnings and "does not exist" in prepared.warnings[0]


def test_local_container_import_needs_enroot(cfg_for, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no enroot here
    with pytest.raises(PlanError, match="enroot is not installed here"):
        prepare(cfg_for("stages=[container]", f"cluster.container={tmp_path}/nemo.sqsh"), NO_GPU)


def test_data_preparation_array_has_one_task_per_shard(cfg_for, tmp_path):
    prepared = prepare(
        cfg_for("cluster=bcm", "stages=[data_preparation]", "data_preparation.file_numbers=0-5", "dry_run=true")
    )
    (array, check) = prepared.stages.jobs
    assert array.array_size == 6 and array.exclusive and check.stage == "data_check"


def test_data_preparation_config_errors_are_plan_errors(cfg_for):
    with pytest.raises(PlanError, match="data_preparation.inputs is empty"):
        prepare(cfg_for("cluster=bcm", "stages=[data_preparation]", "data_preparation=files", "dry_run=true"))
