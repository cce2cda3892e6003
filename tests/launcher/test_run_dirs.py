"""A run directory belongs to one run: the commands a new user types one after another each keep their own, a second
invocation may change only how its run is run, and a run with checkpoints accepts only what can resume from them."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import yaml

from common.checkpoints import TrainState, finalize_checkpoint, partial_path
from launcher_helpers import REPO, run_main


def saved_checkpoint(run_dir, step: int = 100) -> None:
    """A complete checkpoint as the trainer leaves it (the launcher looks only at the files' layout)."""
    root = str(run_dir / "checkpoints")
    os.makedirs(partial_path(root, step))
    finalize_checkpoint(root, TrainState(step=step, consumed_samples=8 * step))


def test_quick_start_image_data_and_dry_runs_keep_their_own_directories(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"document {i} " + "word " * 50}) + "\n" for i in range(200)))
    tokenizer = tmp_path / "tok" / "sp"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "data_prep",
            "train-tokenizer",
            "--input",
            str(corpus),
            "--output",
            str(tokenizer),
            "--vocab-size",
            "300",
        ],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    work = tmp_path / "work"
    work.mkdir()

    assert run_main(cwd=work).returncode == 0  # the Quick start (no GPU here)
    assert run_main("stages=[container]", "dry_run=true", cwd=work).returncode == 0  # setup.sh's image build
    data = subprocess.run(
        [
            "bash",
            str(REPO / "generate_dataset.sh"),
            f"data_preparation.inputs=[{corpus}]",
            f"data_preparation.output_dir={work}/data/files",
        ],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=300,
        env={
            **os.environ,
            "DATASET": "files",
            "TOKENIZER_TYPE": "sentencepiece",
            "TOKENIZER_PATH": f"{tokenizer}.model",
            "PYTHON": sys.executable,
            "CUDA_VISIBLE_DEVICES": "",
        },
    )
    assert data.returncode == 0, data.stdout + data.stderr
    assert run_main("dry_run=true", cwd=work).returncode == 0  # a later training dry run

    runs = {p.name: sorted(f.name for f in p.iterdir() if f.is_file()) for p in (work / "results").iterdir()}
    assert runs == {
        "llama31_tiny_bf16_tp1_1gpu": [".job_files.json", "config.yaml", "launch.sh", "plan.json"],
        "container_llama31+nemo+25.09": [".job_files.json", "config.yaml", "container.sh", "plan.json"],
        "data_files": [".job_files.json", "config.yaml", "data_preparation.sh", "plan.json"],
    }
    listed = subprocess.run(
        [sys.executable, "-m", "data_prep", "list", "--config", str(work / "results" / "data_files" / "config.yaml")],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "corpus" in listed and "done" in listed and "pile" not in listed.lower(), listed


def test_another_model_in_a_run_directory_with_checkpoints_is_refused(tmp_path):
    results = tmp_path / "results"
    base = (
        "training=llama31/8b",
        "cluster=bcm",
        "cluster.container_runtime=none",
        "dry_run=true",
        f"results_dir={results}",
    )
    assert run_main(*base).returncode == 0
    run_dir = results / "llama31_8b_bf16_tp1_cp2_8gpu"
    saved_checkpoint(run_dir)
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}

    out = run_main(*base, "training.model.num_layers=16")
    assert out.returncode == 2
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith(
        f"error: {run_dir} holds checkpoints of another run: training.model.num_layers=32 "
        "there, 16 here; give this run its own directory with run_name="
    ), line
    assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()} == before

    # What the run resumes with may change: the time limit, more steps, the layout where it reshards.
    assert run_main(*base, "cluster.time_limit=08:00:00", "training.train_steps=100").returncode == 0
    out = run_main(*base, "parallelism.tp=2", "parallelism.cp=1", "parallelism.sequence_parallel=true")
    assert out.returncode == 0, out.stderr  # TP2 pads the vocabulary to 128256 rows as well
    out = run_main(*base, "parallelism.tp=4", "parallelism.cp=1", "parallelism.sequence_parallel=true")
    assert (
        out.returncode == 2 and "parallelism.tp=4 pads the vocabulary to 128512 rows but the checkpoints" in out.stderr
    ), out.stderr


def test_the_same_command_again_and_its_dry_run_share_the_directory(tmp_path):
    results = tmp_path / "results"
    args = ("cluster=bcm", "cluster.container_runtime=none", f"results_dir={results}")
    assert run_main(*args, "dry_run=true").returncode == 0
    out = run_main(*args, "dry_run=true", "training.optimizer.lr=2e-3")
    assert out.returncode == 2 and "training.optimizer.lr=0.001 there, 0.002 here" in out.stderr, out.stderr
    assert run_main(*args, "dry_run=true", "training.optimizer.lr=2e-3", "run_name=lr2e-3").returncode == 0
    assert sorted(p.name for p in results.iterdir()) == ["llama31_tiny_bf16_tp1_1gpu", "lr2e-3"]


# --------------------------------------------------------------------------- the scenarios a new user runs into
def job_files(run_dir) -> list[str]:
    return sorted(p.name for p in run_dir.iterdir() if p.is_file() and p.name not in ("config.yaml", "plan.json"))


def test_a_run_directory_shows_only_the_current_jobs_and_keeps_the_earlier_ones_in_history(tmp_path):
    results = tmp_path / "results"
    base = ("training=llama31/8b", "cluster.container_runtime=none", "dry_run=true", f"results_dir={results}")
    assert run_main(*base, "cluster=bcm").returncode == 0
    assert run_main(*base, "cluster=sge").returncode == 0
    out = run_main(*base, "cluster=bcm", "stages=[preflight,training]")
    assert out.returncode == 0, out.stderr
    run_dir = results / "llama31_8b_bf16_tp1_cp2_8gpu"
    assert [f for f in job_files(run_dir) if not f.startswith(".")] == ["preflight.sbatch", "submission.sbatch"]
    earlier = sorted((run_dir / "history").iterdir())
    assert [job_files(h) for h in earlier] == [["submission.sbatch"], ["submission.qsub"]]
    # Each earlier job file lies beside the config it was written with.
    platforms = [yaml.safe_load((h / "config.yaml").read_text())["cluster"]["platform"] for h in earlier]
    assert platforms == ["slurm", "sge"]
    assert f"note: moved the earlier job files submission.qsub to {earlier[1]}" in out.stdout

    # The export of that run, once it has a checkpoint, still plans and names the checkpoint it reads.
    saved_checkpoint(run_dir, step=100)
    out = run_main(*base, "cluster=bcm", "stages=[export]")
    assert out.returncode == 0, out.stderr
    assert f"note: the export reads {run_dir / 'checkpoints' / 'iter_0000100'} (step 100)" in out.stdout
    assert [f for f in job_files(run_dir) if not f.startswith(".")] == ["export.sbatch"]
    assert (run_dir / "checkpoints" / "iter_0000100" / "train_state.json").is_file()


def test_the_documented_data_only_runs_keep_their_own_directories(tmp_path):
    """docs/data-preparation.md's C4 dry run, then docs/mlperf.md's data preparation, from one directory."""
    c4 = run_main("stages=[data_preparation]", "data_preparation=c4", "dry_run=true", cwd=tmp_path)
    assert c4.returncode == 0, c4.stderr
    mlperf = run_main(
        "training=mlperf/llama31_8b",
        "data_preparation=mlperf_llama31_8b",
        "stages=[data_preparation]",
        "cluster=bcm",
        f"mlperf.data_dir={tmp_path / 'mlperf'}",
        "dry_run=true",
        cwd=tmp_path,
    )
    assert mlperf.returncode == 0, mlperf.stderr
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == ["data_c4", "data_c4_mlperf"]


def test_a_data_only_collision_names_the_data_keys_alone(tmp_path):
    base = ("stages=[data_preparation]", "data_preparation=c4", "dry_run=true", "run_name=mydata")
    assert run_main(*base, cwd=tmp_path).returncode == 0
    out = run_main(*base, "training=llama31/8b", "data_preparation.text_key=content", cwd=tmp_path)
    assert out.returncode == 2
    (line,) = out.stderr.strip().splitlines()
    assert "data_preparation.text_key='text' there, 'content' here" in line and "training." not in line, line


def test_the_next_step_printed_after_a_data_only_submission_works(tmp_path):
    """A stand-in sbatch takes the jobs; what main.py then says to run is run."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text("#!/bin/sh\necho $$\n")
    (bin_dir / "sbatch").chmod(0o755)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"text": "a document"}) + "\n")
    out = run_main(
        "stages=[data_preparation]",
        "data_preparation=files",
        f"data_preparation.inputs=[{corpus}]",
        "cluster=bcm",
        "cluster.container_runtime=none",
        cwd=tmp_path,
        env={"PATH": f"{bin_dir}:{os.environ['PATH']}"},
    )
    assert out.returncode == 0, out.stderr
    (step,) = [line.split("shards: ", 1)[1] for line in out.stdout.splitlines() if "shards: " in line]
    listed = subprocess.run(shlex.split(step), cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    assert "pending" in listed.stdout and "corpus" in listed.stdout
    assert "launcher.report" not in out.stdout  # a data-only run has no step timings to report


def test_main_py_outside_the_environment_says_how_to_run_it_in_one_line(tmp_path):
    """-S: an interpreter without the project's packages (no site-packages), as a system python3 is."""
    out = subprocess.run(
        [sys.executable, "-S", str(REPO / "main.py"), "dry_run=true"], cwd=tmp_path, capture_output=True, text=True
    )
    assert out.returncode == 2
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("error: ") and "cannot import hydra" in line and "bash dev.sh python main.py" in line
    assert not (tmp_path / "results").exists()


def test_help_answers_before_hydra_or_torch_load(tmp_path):
    """--help needs none of the packages it would wait for: it works where they cannot even be imported (-S)."""
    for argv in (["main.py", "--help"], ["-m", "recipes.hf.exporter", "--help"]):
        out = subprocess.run(
            [sys.executable, "-S", *argv], cwd=REPO, capture_output=True, text=True, env={"PYTHONPATH": str(REPO)}
        )
        assert out.returncode == 0 and "usage:" in out.stdout, (argv, out.stderr)
    out = subprocess.run(
        [sys.executable, "-S", "-m", "recipes.hf.importer", "fetch", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(REPO)},
    )
    assert out.returncode == 0 and "usage:" in out.stdout, out.stderr
