"""The export stage: the newest checkpoint of a run to Hugging Face format as one process on one node."""
from __future__ import annotations

import shlex

from launcher.cli import prepare


def test_export_follows_training_as_a_one_node_job(cfg_for, tmp_path):
    prepared = prepare(cfg_for("cluster=bcm", "cluster.container=null", "stages=[export,training]", "dry_run=true",
                               f"results_dir={tmp_path}", "training.checkpoint.export_max_shard_size=2GB"))
    assert [j.stage for j in prepared.stages.jobs] == ["training", "export"]
    job = prepared.stages.jobs[1]
    assert (job.nodes, job.ntasks_per_node, job.gpus_per_node, job.script) == (1, 1, None, "export.sbatch")
    run = prepared.run_dir
    command = shlex.split(job.lines[-1].replace("\\\n", " "))
    assert command[:3] == ["srun", "--nodes=1", "--ntasks=1"]
    assert command[-9:] == ["python", "-m", "recipes.hf.exporter", "--checkpoint", f"{run}/checkpoints", "--out",
                            f"{run}/hf", "--max-shard-size", "2GB"]


def test_export_alone_on_this_machine_with_an_explicit_destination(cfg_for, tmp_path):
    prepared = prepare(cfg_for("stages=[export]", f"results_dir={tmp_path}",
                               f"training.checkpoint.export_dir={tmp_path}/exported"))
    (job,) = prepared.stages.jobs
    assert job.script == "export.sh"
    assert f"--out {tmp_path}/exported" in job.lines[0] and "logs/export.log" in job.lines[0]
