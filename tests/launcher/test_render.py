"""Golden files for the rendered jobs (tests/golden/), with machine paths replaced by placeholders, and
`bash -n` on every one. UPDATE_GOLDEN=1 rewrites the golden files after a deliberate change."""

from __future__ import annotations

import re


from launcher.cli import prepare

from launcher_helpers import ONE_H100, REPO, check_golden, rendered, run_main

SQSH = "/shared/containers/nvidia+nemo+25.09.sqsh"


def test_405b_training_on_bcm(cfg_for, tmp_path):
    scripts = rendered(cfg_for("training=llama31/405b", "cluster=bcm", "dry_run=true", f"cluster.container={SQSH}"))
    assert list(scripts) == ["submission.sbatch"]
    check_golden("405b_bf16_bcm_submission.sbatch", scripts["submission.sbatch"], tmp_path)


def test_70b_fp8_with_every_cluster_knob(cfg_for, tmp_path):
    scripts = rendered(
        cfg_for(
            "training=llama31/70b",
            "dtype=fp8",
            "cluster=bcm",
            "dry_run=true",
            f"cluster.container={SQSH}",
            "cluster.partition=batch",
            "cluster.account=llm-pretrain",
            "cluster.time_limit=02:00:00",
            'cluster.sbatch_args=["--reservation=llama","--comment=perf"]',
            'cluster.srun_args=["--cpu-bind=none"]',
            "cluster.container_mounts=[/lustre/datasets]",
            "cluster.signal_before_timeout_s=600",
            "+cluster.env.NCCL_IB_SL=1",
        )
    )
    check_golden("70b_fp8_bcm_submission.sbatch", scripts["submission.sbatch"], tmp_path)


def test_lora_on_bcm(cfg_for, tmp_path):
    # A LoRA fine-tune of 70B from Hugging Face weights: the job pretraining renders, with its own run name.
    scripts = rendered(
        cfg_for(
            "training=llama31/70b",
            "peft=lora",
            "training.checkpoint.init_from_hf=/lustre/models/Llama-3.1-70B",
            "cluster=bcm",
            "dry_run=true",
            f"cluster.container={SQSH}",
        )
    )
    assert list(scripts) == ["submission.sbatch"]
    check_golden("70b_lora_bcm_submission.sbatch", scripts["submission.sbatch"], tmp_path)


def test_tiny_on_this_machine(cfg_for, tmp_path):
    scripts = rendered(cfg_for("dry_run=true"), ONE_H100)
    check_golden("tiny_local_launch.sh", scripts["launch.sh"], tmp_path)


def test_local_data_preparation(cfg_for, tmp_path, corpus):
    scripts = rendered(
        cfg_for(
            "stages=[data_preparation,training]",
            "data_preparation=files",
            f"data_preparation.inputs=[{corpus}/*.jsonl]",
            f"data_preparation.output_dir={tmp_path}/data",
            "dry_run=true",
        ),
        ONE_H100,
    )
    assert list(scripts) == ["data_preparation.sh", "launch.sh"]
    check_golden("files_local_data_preparation.sh", scripts["data_preparation.sh"], tmp_path)


def test_bare_metal_chain(cfg_for, tmp_path, corpus):
    """No container, no GRES, one task per node: the shape of the Slurm integration test's jobs."""
    scripts = rendered(
        cfg_for(
            "cluster=bcm",
            "stages=[data_preparation,training]",
            "data_preparation=files",
            f"data_preparation.inputs=[{corpus}/*.jsonl]",
            f"data_preparation.output_dir={tmp_path}/data",
            "data_preparation.job.cpus_per_task=4",
            "data_preparation.job.max_parallel=2",
            "cluster.container_runtime=none",
            "cluster.gpus_per_node=null",
            "cluster.ntasks_per_node=1",
            "dry_run=true",
        )
    )
    assert list(scripts) == ["data_preparation.sbatch", "data_check.sbatch", "submission.sbatch"]
    assert "#SBATCH --array=0-1%2" in scripts["data_preparation.sbatch"]
    for name, text in scripts.items():
        assert "--container" not in text and "--gpus-per-node" not in text
        check_golden(f"bare_metal_{name}", text, tmp_path)


def test_container_stage_on_bcm(cfg_for, tmp_path):
    scripts = rendered(
        cfg_for(
            "training=llama31/8b",
            "cluster=bcm",
            "stages=[container,training]",
            f"cluster.container={tmp_path}/images/nemo.sqsh",
            "dry_run=true",
        )
    )
    assert list(scripts) == ["container.sbatch", "submission.sbatch"]
    check_golden("8b_bcm_container.sbatch", scripts["container.sbatch"], tmp_path)


def test_container_stage_alone_builds_the_tested_image(tmp_path):
    """`python main.py stages=[container] cluster=bcm dry_run=true`, as docs/stack.md has it: import the base, install
    the declared stack into it with the repository mounted, export the .sqsh under a temporary name."""
    out = run_main("stages=[container]", "cluster=bcm", "dry_run=true", f"results_dir={tmp_path}/results")
    assert out.returncode == 0, out.stderr
    (script,) = (tmp_path / "results").glob("*/container.sbatch")
    assert [p.name for p in script.parent.iterdir() if p.suffix == ".sbatch"] == ["container.sbatch"]
    check_golden("bcm_container.sbatch", script.read_text(), tmp_path)


def test_apptainer_on_slurm_runs_the_same_commands_with_the_same_mounts(cfg_for, tmp_path, corpus):
    """cluster.container_runtime=apptainer: `apptainer exec --nv` with the pyxis path's mounts and working
    directory, the plan's environment passed explicitly, for training and data preparation."""
    common = [
        "cluster=bcm",
        "dry_run=true",
        "stages=[data_preparation,training]",
        "data_preparation=files",
        f"data_preparation.inputs=[{corpus}/*.jsonl]",
        f"data_preparation.output_dir={tmp_path}/data",
        "training=llama31/70b",
        "cluster.partition=batch",
    ]
    sif = f"{tmp_path}/images/llama31.sif"
    apptainer = rendered(cfg_for(*common, "cluster.container_runtime=apptainer", f"cluster.container={sif}"))
    pyxis = rendered(cfg_for(*common, f"cluster.container={tmp_path}/images/llama31.sqsh"))
    for name, text in apptainer.items():
        check_golden(f"70b_bcm_apptainer_{name}", text, tmp_path)
        assert "--container-" not in text
        mounts = re.search(r"--container-mounts=(\S+)", pyxis[name]).group(1)
        assert f"--bind={mounts} \\" in text and f"--pwd={REPO} \\" in text
    plan_env = prepare(cfg_for(*common, f"cluster.container={tmp_path}/x.sqsh")).plan.env
    training = apptainer["submission.sbatch"]
    assert [f"{k}={v}" for k, v in plan_env.items()] == re.findall(r"--env=(\S+)", training) and plan_env
    assert training.count("apptainer exec \\") == 2  # the ranks and the report


def test_apptainer_container_stage_builds_a_sif_from_a_definition_file(cfg_for, tmp_path):
    prepared = prepare(
        cfg_for(
            "training=llama31/8b",
            "cluster=bcm",
            "stages=[container]",
            "dry_run=true",
            "cluster.container_runtime=apptainer",
            f"cluster.container={tmp_path}/img/llama31.sif",
            f"cluster.wheel_dir={tmp_path}/wheels",
        )
    )
    (job,) = prepared.stages.jobs
    files = prepared.platform.render(job, prepared.cfg, prepared.run_dir)
    assert list(files) == ["container.sbatch", "container.def"]
    check_golden("8b_bcm_apptainer_container.sbatch", files["container.sbatch"], tmp_path)
    check_golden("8b_bcm_apptainer_container.def", files["container.def"], tmp_path, shell=False)


def test_mlperf_llama2_70b_lora_data_and_training_on_bcm_and_k8s(cfg_for, tmp_path):
    """The LoRA benchmark's chain on Slurm (its GovReport preparation, then training from Meta's weights on one
    8-GPU node) and its training on Kubernetes."""
    common = ("training=mlperf/llama2_70b_lora", "dry_run=true", "mlperf.data_dir=/lustre/mlperf/llama2_70b_lora")
    scripts = rendered(
        cfg_for(
            *common,
            "cluster=bcm",
            f"cluster.container={SQSH}",
            "data_preparation=mlperf_llama2_70b_lora",
            "stages=[data_preparation,training]",
            "training.checkpoint.init_from_hf=/lustre/models/Llama-2-70b-hf",
        )
    )
    for name, text in scripts.items():
        check_golden(f"mlperf_lora_bcm_{name}", text, tmp_path)
    k8s = rendered(
        cfg_for(
            *common,
            "cluster=k8s",
            "cluster.container=nvcr.io/myorg/llama31-recipes:25.09",
            f"cluster.volumes=[{{claim: code, mount: {REPO}}},{{claim: runs, mount: {tmp_path}}},"
            "{claim: lustre, mount: /lustre}]",
            f"results_dir={tmp_path}/results",
        )
    )
    for name, text in k8s.items():
        check_golden(f"mlperf_lora_k8s_{name}", text, tmp_path, shell=name.endswith(".sh"))
