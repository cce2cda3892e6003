"""The evaluation stage on the host: its jobs on every platform (golden files), the one-line refusals before
anything is written (task data not fetched, an unknown task, a model too big for one node), the fetch command's
plan, and the report's --compare."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest
import yaml

from common.evaluation import BLEND_ROWS, FETCHED, RESULTS_DIR, TASK_ROWS
from launcher.cli import prepare
from launcher.report.__main__ import main as report_main

from launcher_helpers import ONE_H100, REPO, check_golden, run_main

SUITE = ["lambada_openai", "boolq", "race", "piqa", "hellaswag", "winogrande", "wikitext"]
IMAGE = "nvcr.io/myorg/llm/llama31-recipes:25.09"
SIF = "/gpfs/containers/llama31+nemo+25.09.sif"


def inputs(root) -> list[str]:
    """Everything an evaluation reads, under `root`: the default suite's data as fetch records it, a held-out
    file, a blend's .bin/.idx, a Hugging Face directory."""
    data = root / "eval_data"
    data.mkdir(parents=True, exist_ok=True)
    (data / FETCHED).write_text(json.dumps({"tasks": {t: {} for t in SUITE}}))
    (root / "heldout.jsonl").write_text(json.dumps({"text": "held-out text"}) + "\n")
    for suffix in (".bin", ".idx"):
        (root / f"val_text_document{suffix}").write_text("")
    (root / "hf").mkdir(exist_ok=True)
    (root / "hf" / "config.json").write_text("{}")
    return [
        f"evaluation.data_dir={data}",
        f"evaluation.heldout=[{root / 'heldout.jsonl'}]",
        f"evaluation.blends=[{{name: val, prefixes: [{root / 'val_text_document'}]}}]",
        f"evaluation.model={root / 'hf'}",
    ]


PLATFORMS = {
    "local": (["training=llama31/tiny", "cluster=local"], ONE_H100),
    "bcm": (["training=llama31/8b", "cluster=bcm", "cluster.partition=batch", "cluster.account=llm"], None),
    "sge": (["training=llama31/8b", "cluster=sge", f"cluster.container={SIF}"], None),
    "bcp": (
        [
            "training=llama31/8b",
            "cluster=bcp",
            f"cluster.container={IMAGE}",
            "cluster.ace=nv-us-east-2",
            "cluster.org=myorg",
            f"cluster.workspaces=[{{id: code, mount: {REPO}}},{{id: runs, mount: <TMP>}}]",
        ],
        None,
    ),
    "k8s": (
        [
            "training=llama31/8b",
            "cluster=k8s",
            f"cluster.container={IMAGE}",
            f"cluster.volumes=[{{claim: code, mount: {REPO}}},{{claim: runs, mount: <TMP>}}]",
        ],
        None,
    ),
}


@pytest.mark.parametrize("platform", PLATFORMS)
def test_the_stage_renders_for_every_platform(cfg_for, tmp_path, platform):
    overrides, gpus = PLATFORMS[platform]
    overrides = [o.replace("<TMP>", str(tmp_path)) for o in overrides]
    prepared = prepare(cfg_for(*overrides, "stages=[training,evaluation]", "dry_run=true", *inputs(tmp_path)), gpus)
    jobs = prepared.stages.jobs
    assert [j.stage for j in jobs] == ["training", "eval_loss", "evaluation"]
    training, loss, harness = jobs
    # The blends' loss runs on the training job's nodes and ranks, the tasks on one node.
    assert (loss.nodes, loss.ntasks_per_node, loss.gpus_per_node) == (
        training.nodes,
        training.ntasks_per_node,
        training.gpus_per_node,
    )
    assert harness.nodes == 1 and harness.env["HF_DATASETS_OFFLINE"] == "1"
    assert training.followed and loss.followed and not harness.followed
    files = {}
    for job in (loss, harness):
        files.update(prepared.platform.render(job, prepared.cfg, prepared.run_dir))
    for name, text in files.items():
        check_golden(f"eval_{platform}_{name}", text, tmp_path, shell=not name.endswith(".yaml"))
    text = "\n".join(files.values())
    assert f"recipes.evaluate --run-dir {prepared.run_dir}" in text
    assert f"recipes.evaluation harness --run-dir {prepared.run_dir}" in text
    assert "launcher.report" not in text  # the report ends training, not the evaluation
    if platform == "k8s":
        for name, text in files.items():
            docs = [d for d in yaml.safe_load_all(text) if d]
            job = docs[-1]
            limits = job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
            assert limits["nvidia.com/gpu"] == 8
            assert (docs[0]["kind"] == "Service") == name.startswith("eval_loss")


def test_evaluation_alone_of_a_hugging_face_directory_is_its_own_run(cfg_for, tmp_path):
    prepared = prepare(
        cfg_for(
            "stages=[evaluation]", "evaluation.blends=[]", *inputs(tmp_path)[:-2], f"evaluation.model={tmp_path / 'hf'}"
        ),
        ONE_H100,
    )
    assert prepared.run_dir.name == "eval_hf"
    (job,) = prepared.stages.jobs
    assert job.script == "evaluation.sh"


def refusal(tmp_path, *overrides: str) -> list[str]:
    """main.py's error lines; nothing may be written."""
    results = tmp_path / "results"
    result = run_main(*overrides, f"results_dir={results}", cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert not results.exists(), "a refused run wrote its run directory"
    return result.stderr.strip().splitlines()


def test_tasks_whose_data_was_not_fetched_stop_the_plan_naming_the_fetch_command(tmp_path):
    (line,) = refusal(
        tmp_path,
        "stages=[evaluation]",
        f"evaluation.model={inputs(tmp_path)[-1].split('=', 1)[1]}",
        "evaluation.tasks=[boolq,piqa]",
        f"evaluation.data_dir={tmp_path / 'nowhere'}",
    )
    assert line.startswith("error: evaluation.tasks: no data for boolq, piqa in evaluation.data_dir=")
    assert "(no such directory)" in line
    assert line.endswith(f"python -m recipes.evaluation fetch --tasks boolq,piqa --data-dir {tmp_path / 'nowhere'}")


def test_an_unknown_task_name_is_one_line(tmp_path):
    pytest.importorskip("lm_eval")  # the plan asks lm-eval's index which names exist
    (line,) = refusal(
        tmp_path,
        "stages=[evaluation]",
        *inputs(tmp_path)[:2],
        f"evaluation.model={tmp_path / 'hf'}",
        "evaluation.tasks=[boolq,hellaswagg]",
    )
    assert line.startswith("error: evaluation.tasks: unknown lm-eval task hellaswagg:")


def test_a_model_too_large_for_one_node_points_to_the_blends(tmp_path):
    (line,) = refusal(
        tmp_path,
        "training=llama31/405b",
        "cluster=bcm",
        "cluster.gpu_type=h100",
        "cluster.gpus_per_node=8",
        "stages=[evaluation]",
        "dry_run=true",
        *inputs(tmp_path)[:2],
    )
    assert "evaluation: the model (756 GiB of bfloat16 weights" in line
    assert "does not fit one node (8 x 80 GiB h100)" in line and "evaluation.blends" in line
    # 70B fits: its export is evaluated on one node of the same cluster.
    result = run_main(
        "training=llama31/70b",
        "cluster=bcm",
        "cluster.gpu_type=h100",
        "cluster.gpus_per_node=8",
        "stages=[evaluation]",
        "dry_run=true",
        *inputs(tmp_path)[:2],
        f"results_dir={tmp_path / 'results'}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr


def test_nothing_to_evaluate_is_refused(cfg_for, tmp_path):
    (line,) = refusal(tmp_path, "stages=[evaluation]", "evaluation.tasks=[]")
    assert "evaluation.tasks, evaluation.heldout and evaluation.blends are all empty" in line


# --------------------------------------------------------------------------- fetch
def fetch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "recipes.evaluation", "fetch", *args], cwd=REPO, capture_output=True, text=True
    )


def test_the_fetch_command_plans_the_default_suite_and_writes_nothing_in_a_dry_run(tmp_path):
    pytest.importorskip("lm_eval")
    data = tmp_path / "eval_data"
    result = fetch("--tasks", ",".join(SUITE), "--data-dir", str(data), "--dry-run")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"fetch into {data}: 7 of 7 tasks to fetch"
    planned = {line.split()[0]: line for line in lines[1:8]}
    assert list(planned) == SUITE and all(line.endswith(" fetch") for line in planned.values())
    assert "EleutherAI/lambada_openai" in planned["lambada_openai"] and "piqa" in planned["piqa"]
    assert lines[-1] == "dry run: nothing was downloaded or written" and not data.exists()
    # Tasks recorded as fetched are skipped: a second run continues where a failed one stopped.
    data.mkdir()
    (data / FETCHED).write_text(json.dumps({"tasks": {"boolq": {}}}))
    lines = fetch("--tasks", "boolq,piqa", "--data-dir", str(data), "--dry-run").stdout.splitlines()
    assert lines[0].endswith("1 of 2 tasks to fetch") and lines[1].endswith("already fetched")


def test_fetch_refuses_an_unknown_task_in_one_line(tmp_path):
    pytest.importorskip("lm_eval")
    result = fetch("--tasks", "boolq,nosuchtask", "--data-dir", str(tmp_path / "d"))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: fetch: unknown lm-eval task nosuchtask: see `lm_eval ls tasks` for the names (a task of your own: "
        "--include-path DIR)"
    ]
    assert not (tmp_path / "d").exists()


def test_the_docs_fetch_command_is_the_one_the_plan_prints(tmp_path):
    """The command the refusal names parses as the fetch command line does."""
    from recipes.evaluation import fetch as fetch_module

    words = shlex.split(fetch_module.command(["boolq"], "/data/eval"))
    assert words[:4] == ["python", "-m", "recipes.evaluation", "fetch"]


# --------------------------------------------------------------------------- the report
def evaluated(run_dir, rows: list[dict], blends: list[dict] = ()) -> None:
    out = run_dir / RESULTS_DIR
    out.mkdir(parents=True)
    (out / TASK_ROWS).write_text("".join(json.dumps(r) + "\n" for r in rows))
    if blends:
        (out / BLEND_ROWS).write_text("".join(json.dumps(r) + "\n" for r in blends))


def row(task, metric, value, stderr=None, **more):
    return {"task": task, "metric": metric, "value": value, "stderr": stderr, "model": "hf", **more}


def test_compare_prints_two_runs_rows_side_by_side(tmp_path, capsys):
    a, b = tmp_path / "gbs64", tmp_path / "gbs128"
    evaluated(a, [row("boolq", "acc", 0.61, 0.008), row("heldout", "word_perplexity", 31.5)])
    evaluated(
        b,
        [row("boolq", "acc", 0.64, 0.0085), row("piqa", "acc", 0.7)],
        [row("blend:val", "loss", 2.345678, step=300)],
    )
    assert report_main(["--compare", str(a), str(b)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["task", "metric", "gbs64", "gbs128"]
    body = [line.split() for line in lines[2:]]
    assert body == [
        ["boolq", "acc", "0.6100", "±", "0.0080", "0.6400", "±", "0.0085"],
        ["heldout", "word_perplexity", "31.5000", "-"],
        ["piqa", "acc", "-", "0.7000"],
        ["blend:val", "loss", "-", "2.3457"],
    ]
    # The columns line up: each run's values start where its header does.
    column = lines[0].index("gbs128")
    assert lines[2][column:].startswith("0.6400") and lines[4][column:].startswith("0.7000")


def test_compare_refuses_a_run_that_was_not_evaluated(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    evaluated(a, [row("boolq", "acc", 0.6)])
    b.mkdir()
    assert report_main(["--compare", str(a), str(b)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"{b} holds no evaluation rows" in line


def test_the_report_of_an_evaluated_run_prints_its_rows(tmp_path, capsys):
    run = tmp_path / "eval_hf"
    evaluated(run, [row("boolq", "acc", 0.6, 0.01)])
    assert report_main([str(run)]) == 0
    out = capsys.readouterr().out
    assert "evaluation of eval_hf" in out and "0.6000 ± 0.0100" in out


@pytest.mark.parametrize(
    "what,message",
    [
        ("heldout", "holds no exported model: add export to stages"),
        ("blends", "has no complete checkpoint to evaluate"),
    ],
)
def test_evaluation_alone_of_a_run_without_what_it_reads_is_one_line(tmp_path, what, message):
    """The held-out task reads the run's export, the blends its newest checkpoint: neither is there."""
    (given,) = [o for o in inputs(tmp_path) if o.startswith(f"evaluation.{what}=")]
    (line,) = refusal(tmp_path, "stages=[evaluation]", "evaluation.tasks=[]", given)
    assert message in line


# --------------------------------------------------------------------------- the held-out task and lm-eval's rows
def test_the_heldout_task_reads_json_lines_and_text_files_and_names_a_bad_line(tmp_path):
    from recipes.evaluation.tasks import HeldoutError, heldout_documents, write_heldout_task

    (tmp_path / "a.jsonl").write_text('{"body": "first"}\n\n{"body": "second"}\n')
    (tmp_path / "b.txt").write_text("a whole file\nis one document\n")
    files = [str(tmp_path / "a.jsonl"), str(tmp_path / "b.txt")]
    assert heldout_documents(files, "body") == ["first", "second", "a whole file\nis one document\n"]
    directory = write_heldout_task(files, "body", str(tmp_path / "task"))
    task = yaml.safe_load((tmp_path / "task" / "heldout.yaml").read_text())
    assert task["output_type"] == "loglikelihood_rolling" and task["dataset_path"] == "json"
    data = [json.loads(line) for line in open(task["dataset_kwargs"]["data_files"]["test"])]
    assert [d["text"] for d in data] == heldout_documents(files, "body") and directory == str(tmp_path / "task")
    with pytest.raises(HeldoutError, match=r"a.jsonl line 1 is not a JSON object with the key 'text'"):
        heldout_documents(files, "text")


def test_lm_eval_results_become_one_row_per_task_and_metric():
    from recipes.evaluation.harness import summary_rows

    results = {
        "results": {
            "boolq": {"alias": "boolq", "acc,none": 0.62, "acc_stderr,none": 0.0085},
            "heldout": {"word_perplexity,none": 31.5, "word_perplexity_stderr,none": "N/A", "bits_per_byte,none": 1.2},
            "lambada_openai": {"acc,none": 0.4, "acc_stderr,none": 0.007, "perplexity,none": 20.1},
        }
    }
    assert [(r.task, r.metric, r.value, r.stderr) for r in summary_rows(results, "hf")] == [
        ("boolq", "acc", 0.62, 0.0085),
        ("heldout", "word_perplexity", 31.5, None),
        ("heldout", "bits_per_byte", 1.2, None),
        ("lambada_openai", "acc", 0.4, 0.007),
        ("lambada_openai", "perplexity", 20.1, None),
    ]
