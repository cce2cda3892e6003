"""main.py against a real one-node Slurm: a data-preparation array (one task per shard, real tokenization into
.bin/.idx) and the dependent check job that reads every shard as training would. The cluster has no GPUs,
pyxis or PMIx, so the jobs run bare metal (cluster.container_runtime=none, no GRES, one task per node)."""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path

import pytest

from cluster_jobs import submit_with_main
from corpora import write_corpus

pytestmark = pytest.mark.slurm

BARE_METAL = [
    "cluster=bcm",
    "cluster.container_runtime=none",
    "cluster.gpus_per_node=null",
    "cluster.ntasks_per_node=1",
    "cluster.exclusive=false",
    "cluster.time_limit=00:10:00",
]


def submit(tmp_path: Path, inputs: str, sp_tokenizer: Path) -> tuple[Path, list[dict]]:
    results = tmp_path / "results"
    run_dir = results / "data_files_data"  # data preparation alone: its own run directory
    _, jobs = submit_with_main(
        [
            *BARE_METAL,
            "stages=[data_preparation]",
            "data_preparation=files",
            f"data_preparation.inputs=[{inputs}]",
            f"data_preparation.output_dir={tmp_path}/data",
            "training.tokenizer.type=sentencepiece",
            f"training.tokenizer.path={sp_tokenizer}",
            f"results_dir={results}",
        ],
        os.environ,
        run_dir,
    )
    assert [j["stage"] for j in jobs] == ["data_preparation", "data_check"]
    assert jobs[1]["dependency"] == f"afterok:{jobs[0]['job_id']}"
    return run_dir, jobs


def _time(value: str) -> datetime:
    return datetime.fromisoformat(value)


def test_data_preparation_array_then_the_dependent_check(slurm_cluster, sp_tokenizer, tmp_path):
    write_corpus(tmp_path / "corpus", ["books", "news", "web"])
    run_dir, (array, check) = submit(tmp_path, f"{tmp_path}/corpus/*.jsonl", sp_tokenizer)

    code, states = slurm_cluster.wait(check["job_id"])
    assert code == 0, (states, sorted(p.name for p in (run_dir / "logs").iterdir()))
    assert slurm_cluster.wait(array["job_id"]) == (0, "COMPLETEDx3")

    # afterok: the check started only after the last array task ended.
    tasks = slurm_cluster.show(array["job_id"])
    (check_job,) = slurm_cluster.show(check["job_id"])
    assert len(tasks) == 3
    assert _time(check_job["StartTime"]) >= max(_time(t["EndTime"]) for t in tasks)

    for name in ("books", "news", "web"):
        prefix = tmp_path / "data" / f"{name}_text_document"
        assert prefix.with_suffix(".idx").read_bytes()[:9] == b"MMIDIDX\x00\x00"  # megatron's index header
        assert prefix.with_suffix(".bin").stat().st_size > 0
        marker = json.loads(Path(f"{prefix}.done.json").read_text())
        assert marker["documents"] == 120 and marker["tokens"] > 120
    for k in range(3):
        assert (run_dir / "logs" / f"data_preparation_{array['job_id']}_{k}.out").exists()
    check_log = (run_dir / "logs" / f"data_check_{check['job_id']}.out").read_text()
    assert check_log.split() == ["books:", "OK", "news:", "OK", "web:", "OK"]


def test_a_failed_shard_cancels_the_dependent_job(slurm_cluster, sp_tokenizer, tmp_path):
    corpus = tmp_path / "corpus"
    write_corpus(corpus, ["good"])
    (corpus / "broken.jsonl.gz").write_text("this is not gzip data\n")
    run_dir, (array, check) = submit(tmp_path, f"{corpus}/*", sp_tokenizer)

    code, states = slurm_cluster.wait(check["job_id"])
    assert code == 1 and states.startswith("CANCELLED"), states
    (check_job,) = slurm_cluster.show(check["job_id"])
    assert check_job["Reason"] == "DependencyNeverSatisfied"
    code, states = slurm_cluster.wait(array["job_id"])
    assert code == 1 and "FAILED" in states and "COMPLETED" in states, states
    # The good shard is finished (and would be skipped by a rerun); the check never ran.
    assert (tmp_path / "data" / "good_text_document.done.json").exists()
    assert not (run_dir / "logs" / f"data_check_{check['job_id']}.out").exists()
    failed_log = "".join(p.read_text() for p in (run_dir / "logs").glob("data_preparation_*.out"))
    assert "broken: FAILED" in failed_log
