"""`python main.py ...` end to end, as users run it: dry runs, errors before anything is written, the default run
on a machine without GPU, sweeps, and what Hydra itself leaves behind."""

from __future__ import annotations

import json
import re
import subprocess

import yaml

from launcher_helpers import REPO, run_main

ACCEPTANCE_405B = dict(
    tp=8, pp=8, cp=2, vp=8, asymmetric_pipeline=True, layers_per_pipeline_stage=[15, 16, 16, 16, 16, 16, 16, 15]
)


def test_405b_dry_run_writes_plan_and_a_valid_pyxis_script(tmp_path):
    results = tmp_path / "results"
    out = run_main("training=llama31/405b", "cluster=bcm", "dry_run=true", f"results_dir={results}")
    assert out.returncode == 0, out.stderr
    (run_dir,) = results.iterdir()
    plan = json.loads((run_dir / "plan.json").read_text())
    assert {k: plan[k] for k in ACCEPTANCE_405B} == ACCEPTANCE_405B
    assert (plan["num_gpus"], plan["num_nodes"], plan["gpus_per_node"], plan["dp"]) == (1024, 128, 8, 8)

    script = run_dir / "submission.sbatch"
    assert str(script) in out.stdout  # the path of the script is printed
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    text = script.read_text()
    for directive in (
        "--nodes=128",
        "--ntasks-per-node=8",
        "--gpus-per-node=8",
        "--time=04:00:00",
        "--exclusive",
        f"--output={run_dir}/logs/training_%j.out",
        f"--error={run_dir}/logs/training_%j.err",
        "--signal=USR1@300",
        "--kill-on-invalid-dep=yes",
        "--job-name=llama31:training:",
    ):
        assert f"#SBATCH {directive}" in text, directive
    for flag in (
        "--container-image=",
        "--container-workdir=",
        "--no-container-mount-home",
        "--container-writable",
        "--mpi=pmix",
        "--kill-on-bad-exit=1",
    ):
        assert flag in text, flag
    mounts = re.search(r"--container-mounts=(\S+)", text).group(1).split(",")
    assert f"{REPO}:{REPO}" in mounts and f"{results}:{results}" in mounts
    for key, value in plan["env"].items():
        assert f"export {key}={value}" in text
    assert plan["env"]["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert 'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)' in text
    assert f"python -m recipes.train --run-dir {run_dir}" in text
    assert plan["command"].startswith("srun ") and plan["command"].endswith(f"--run-dir {run_dir}")

    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert "hydra" not in config and "${" not in (run_dir / "config.yaml").read_text()
    assert config["parallelism"]["tp"] == 8 and config["results_dir"] == str(results)


def test_the_table_and_the_reason_when_this_machine_has_no_gpu(tmp_path):
    results = tmp_path / "results"
    out = run_main(f"results_dir={results}")  # = training=llama31/tiny dtype=bf16 cluster=local
    assert out.returncode == 0, out.stderr
    run_dir = results / "llama31_tiny_bf16_tp1_1gpu"
    assert (run_dir / "plan.json").exists() and (run_dir / "launch.sh").exists()
    for word in ("layout", "TP1 PP1 CP1 DP1", "per PP stage: 6", "GiB per GPU", "per sample"):
        assert word in out.stdout, word
    assert "did not train: no NVIDIA GPU" in out.stdout
    assert "cluster=bcm" in out.stdout and "dry_run=true" in out.stdout
    plan = json.loads((run_dir / "plan.json").read_text())
    assert (
        plan["command"]
        == f"python -m torch.distributed.run --standalone --nproc-per-node 1 -m recipes.train --run-dir {run_dir}"
    )
    assert not (run_dir / "logs" / "training.log").exists()


def test_bad_inputs_fail_before_anything_is_written(tmp_path):
    results = tmp_path / "results"
    cases = [
        (["training=llama31/8b", "parallelism.tp=3"], "parallelism.tp=3"),
        (["training=llama31/405b", "parallelism.vp=3"], "parallelism.vp=3"),
        (["training=llama31/8b", "training.global_batch_size=130"], "training.global_batch_size=130"),
        (["training=llama31/8b", "cluster.ntasks_per_node=16"], "cluster.ntasks_per_node=16"),
        (["stages=[trianing]"], "stages=[trianing]: 'trianing' is not a stage"),
        (["cluster.time_limit=4h"], "cluster.time_limit='4h'"),
    ]
    for overrides, key in cases:
        out = run_main(*overrides, "cluster=bcm", "dry_run=true", f"results_dir={results}")
        assert out.returncode == 2, (overrides, out.stdout, out.stderr)
        lines = out.stderr.strip().splitlines()
        assert lines and all(line.startswith("error: ") for line in lines), out.stderr
        assert key in out.stderr, out.stderr
        assert not results.exists(), overrides


def test_submitting_without_sbatch_is_an_error_not_a_crash(tmp_path):
    results = tmp_path / "results"
    out = run_main(
        "cluster=bcm", "cluster.container_runtime=none", f"results_dir={results}", env={"PATH": "/nonexistent"}
    )
    assert out.returncode == 2
    assert "sbatch" in out.stderr and "dry_run=true" in out.stderr
    assert not results.exists()


def test_hydra_writes_nothing_outside_the_run_directory(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    out = run_main("dry_run=true", cwd=work)  # results_dir defaults to <cwd>/results
    assert out.returncode == 0, out.stderr
    assert [p.name for p in work.iterdir()] == ["results"]
    assert [p.name for p in (work / "results").iterdir()] == ["llama31_tiny_bf16_tp1_1gpu"]


def test_a_sweep_of_four_points_gives_four_run_directories(tmp_path):
    results = tmp_path / "results"
    out = run_main(
        "-m",
        "training=llama31/8b",
        "cluster=bcm",
        "dry_run=true",
        f"results_dir={results}",
        "training.global_batch_size=64,128",
        "dtype=bf16,fp8",
    )
    assert out.returncode == 0, out.stderr
    runs = sorted(p for p in results.iterdir() if p.name != "sweeps")
    assert len(runs) == 4
    seen = set()
    for run in runs:
        plan = json.loads((run / "plan.json").read_text())
        assert (run / "submission.sbatch").exists()
        assert f"training.global_batch_size={plan['global_batch_size']}" in run.name
        assert f"dtype={plan['dtype']}" in run.name
        assert f"--run-dir {run}" in (run / "submission.sbatch").read_text()
        seen.add((plan["global_batch_size"], plan["dtype"]))
    assert seen == {(64, "bf16"), (64, "fp8"), (128, "bf16"), (128, "fp8")}


def test_a_sweep_with_one_bad_point_writes_no_point(tmp_path):
    results = tmp_path / "results"
    out = run_main(
        "-m",
        "training=llama31/8b",
        "cluster=bcm",
        "dry_run=true",
        f"results_dir={results}",
        "training.global_batch_size=128,130",
    )
    assert out.returncode == 2
    assert "sweep point training.global_batch_size=130: training.global_batch_size=130" in out.stderr
    assert not results.exists()  # not even Hydra's record of the sweep


def test_dry_run_shows_the_afterok_chain_of_data_preparation_and_training(tmp_path):
    data = tmp_path / "data"
    result = run_main(
        "stages=[data_preparation,training]",
        "data_preparation=pile",
        "data_preparation.file_numbers='0-3'",
        f"data_preparation.output_dir={data}",
        "training=llama31/8b",
        "cluster=bcm",
        "cluster.container_runtime=none",
        "dry_run=true",
        f"results_dir={tmp_path}",
        "training.data.mock=false",
        f"training.data.blend=[{data}/my-llama_00_text_document]",
    )
    assert result.returncode == 0, result.stderr
    run_dir = tmp_path / "llama31_8b_bf16_tp1_cp2_8gpu"
    array = (run_dir / "data_preparation.sbatch").read_text()
    assert "#SBATCH --array=0-3" in array and '--shard "$SLURM_ARRAY_TASK_ID"' in array
    chain = [line.strip() for line in result.stdout.splitlines() if line.strip().startswith("JOB")]
    assert chain == [
        f"JOB1=$(sbatch --parsable {run_dir}/data_preparation.sbatch)",
        f"JOB2=$(sbatch --parsable --dependency=afterok:$JOB1 {run_dir}/data_check.sbatch)",
        f"JOB3=$(sbatch --parsable --dependency=afterok:$JOB2 {run_dir}/submission.sbatch)",
    ]


def test_a_bare_stage_name_is_refused_with_the_list_syntax(tmp_path):
    # `stages=data_preparation` (no brackets) is a string where the schema wants a list: one line, nothing written.
    result = run_main("stages=data_preparation", f"results_dir={tmp_path / 'runs'}", "dry_run=true")
    assert result.returncode == 2
    assert (
        result.stderr.startswith("error: stages=data_preparation: stages must be a list")
        and "'key=[a,b]'" in result.stderr
    ), result.stderr
    assert not (tmp_path / "runs").exists()


def test_data_about_to_be_prepared_need_not_exist_yet(tmp_path):
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text('{"text": "hello"}\n')
    result = run_main(
        "stages=[data_preparation]",
        "data_preparation=files",
        f"data_preparation.inputs=[{corpus}]",
        f"data_preparation.output_dir={tmp_path / 'data'}",
        "training.data.mock=false",
        f"training.data.blend=[{tmp_path / 'data' / 'docs_text_document'}]",
        "dry_run=true",
        f"results_dir={tmp_path / 'runs'}",
    )
    assert result.returncode == 0, result.stderr
    scripts = sorted(p.relative_to(tmp_path / "runs").as_posix() for p in (tmp_path / "runs").glob("*/*.sh"))
    assert scripts == ["data_files_data/data_preparation.sh"]  # data preparation alone: a run directory of its own
    assert "Plan for" not in result.stdout  # the training plan table belongs to runs that train
