"""The export stage: the newest checkpoint of a run to Hugging Face format as one process on one node."""

from __future__ import annotations

import os
import shlex

import pytest

from common.checkpoints import TrainState, finalize_checkpoint, partial_path
from launcher.cli import prepare
from launcher.plan.errors import PlanError


def saved_checkpoint(run_dir, step: int = 10) -> str:
    """A complete checkpoint as the trainer leaves one (no tensors: the launcher looks only at the files' layout)."""
    root = str(run_dir / "checkpoints")
    os.makedirs(partial_path(root, step))
    return finalize_checkpoint(root, TrainState(step=step, consumed_samples=8 * step))


def test_export_follows_training_as_a_one_node_job(cfg_for, tmp_path):
    prepared = prepare(
        cfg_for(
            "cluster=bcm",
            "cluster.container_runtime=none",
            "stages=[export,training]",
            "dry_run=true",
            f"results_dir={tmp_path}",
            "training.checkpoint.export_max_shard_size=2GB",
        )
    )
    assert [j.stage for j in prepared.stages.jobs] == ["training", "export"]
    job = prepared.stages.jobs[1]
    assert (job.nodes, job.ntasks_per_node, job.gpus_per_node, job.script) == (1, 1, None, "export.sbatch")
    run = prepared.run_dir
    command = shlex.split(job.lines[-1].replace("\\\n", " "))
    assert command[:3] == ["srun", "--nodes=1", "--ntasks=1"]
    assert command[-9:] == [
        "python",
        "-m",
        "recipes.hf.exporter",
        "--checkpoint",
        f"{run}/checkpoints",
        "--out",
        f"{run}/hf",
        "--max-shard-size",
        "2GB",
    ]


def test_export_alone_on_this_machine_with_an_explicit_destination(cfg_for, results, tmp_path):
    overrides = ("stages=[export]", f"training.checkpoint.export_dir={tmp_path}/exported")
    with pytest.raises(PlanError, match="has no complete checkpoint to export: check run_name"):
        prepare(cfg_for(*overrides))  # nothing trained in this run directory (a mistyped run_name, say)
    run_dir = results / "llama31_tiny_bf16_tp1_1gpu"
    assert not run_dir.exists()
    saved_checkpoint(run_dir)
    prepared = prepare(cfg_for(*overrides))
    (job,) = prepared.stages.jobs
    assert job.script == "export.sh"
    assert f"--out {tmp_path}/exported" in job.lines[0] and "logs/export.log" in job.lines[0]
