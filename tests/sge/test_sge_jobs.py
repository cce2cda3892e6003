"""main.py against a real one-node Grid Engine: a data-preparation array job (one task per shard, real
tokenization into .bin/.idx) and the check job that holds on it (-hold_jid) and reads every shard as training
would. The cluster has no GPUs and no Apptainer, so the jobs run bare metal (container_runtime=none) without a
node resource (the Debian cell defines no node_f)."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from cluster_jobs import submit_with_main
from corpora import write_corpus

pytestmark = pytest.mark.sge

BARE_METAL = [
    "cluster=sge",
    "cluster.container_runtime=none",
    "cluster.node_resource=null",
    "cluster.time_limit=00:10:00",
    "data_preparation.job.time_limit=00:10:00",
]


def submit(grid_engine, tmp_path: Path, inputs: str, sp_tokenizer: Path) -> tuple[Path, list[dict]]:
    results = tmp_path / "results"
    run_dir = results / "data_files_data"  # data preparation alone: its own run directory
    out, jobs = submit_with_main(
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
        grid_engine.env,
        run_dir,
    )
    assert [j["stage"] for j in jobs] == ["data_preparation", "data_check"]
    assert jobs[1]["dependency"] == f"hold_jid:{jobs[0]['job_id']}"
    assert f"submitted data_check: job {jobs[1]['job_id']} (-hold_jid {jobs[0]['job_id']})" in out.stdout
    return run_dir, jobs


def _time(value: str) -> datetime:
    return datetime.strptime(value, "%a %b %d %H:%M:%S %Y")


@pytest.mark.slow
def test_data_preparation_array_then_the_check_that_holds_on_it(grid_engine, sp_tokenizer, tmp_path):
    write_corpus(tmp_path / "corpus", ["books", "news", "web"])
    run_dir, (array, check) = submit(grid_engine, tmp_path, f"{tmp_path}/corpus/*.jsonl", sp_tokenizer)

    code, summary = grid_engine.wait(check["job_id"])
    assert code == 0, (summary, sorted(p.name for p in (run_dir / "logs").iterdir()))
    assert grid_engine.wait(array["job_id"]) == (0, "exit_status=0 x3")

    # -hold_jid: the check started only after the last array task ended.
    tasks = grid_engine.accounting(array["job_id"], tasks=3)
    (check_job,) = grid_engine.accounting(check["job_id"])
    assert sorted(t["taskid"] for t in tasks) == ["1", "2", "3"]
    assert _time(check_job["start_time"]) >= max(_time(t["end_time"]) for t in tasks)

    for name in ("books", "news", "web"):
        prefix = tmp_path / "data" / f"{name}_text_document"
        assert prefix.with_suffix(".idx").read_bytes()[:9] == b"MMIDIDX\x00\x00"  # megatron's index header
        assert prefix.with_suffix(".bin").stat().st_size > 0
        marker = json.loads(Path(f"{prefix}.done.json").read_text())
        assert marker["documents"] == 120 and marker["tokens"] > 120
    for task in (1, 2, 3):  # Grid Engine's task ids count from 1; shard k ran as task k + 1
        log = run_dir / "logs" / f"data_preparation_{array['job_id']}_{task}.out"
        assert ("books", "news", "web")[task - 1] in log.read_text()
    check_log = (run_dir / "logs" / f"data_check_{check['job_id']}.out").read_text()
    assert check_log.split() == ["books:", "OK", "news:", "OK", "web:", "OK"]


def test_a_failed_shard_keeps_the_check_from_ever_starting(grid_engine, sp_tokenizer, tmp_path):
    corpus = tmp_path / "corpus"
    write_corpus(corpus, ["good"])
    (corpus / "broken.jsonl.gz").write_text("this is not gzip data\n")
    run_dir, (array, check) = submit(grid_engine, tmp_path, f"{corpus}/*", sp_tokenizer)
    try:
        code, summary = grid_engine.wait(array["job_id"])
        # The failed task exited 100: it sits in the error state, and the job holding on it can never start.
        assert code == 1 and summary.startswith("error_state"), summary
        assert grid_engine.states(check["job_id"]) == ["hqw"]
        # Shards in name order: broken (task 1) failed with 100, good (task 2) finished.
        runs = grid_engine.accounting(array["job_id"], tasks=2)
        assert {r["taskid"]: r["exit_status"] for r in runs} == {"1": "100", "2": "0"}
        assert (tmp_path / "data" / "good_text_document.done.json").exists()
        assert not list((run_dir / "logs").glob(f"data_check_{check['job_id']}*"))
        failed_log = "".join(p.read_text() for p in (run_dir / "logs").glob("data_preparation_*.out"))
        assert "broken: FAILED" in failed_log
    finally:
        grid_engine.delete(array["job_id"], check["job_id"])
