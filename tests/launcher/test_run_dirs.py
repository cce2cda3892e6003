"""A run directory belongs to one run: the commands a new user types one after another each keep their own, a second
invocation may change only how its run is run, and a run with checkpoints accepts only what can resume from them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

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
        "llama31_tiny_bf16_tp1_1gpu": ["config.yaml", "launch.sh", "plan.json"],
        "container_llama31+nemo+25.09": ["config.yaml", "container.sh", "plan.json"],
        "data_files": ["config.yaml", "data_preparation.sh", "plan.json"],
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
