"""cluster=bcp (NGC Base Command Platform): golden submission and job scripts for 8B, 70B and 405B and for data
preparation (+ `bash -n`), the `ngc` command lines against the options the NGC CLI documents, the one-line
errors, and submission through a stand-in `ngc`."""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path

import pytest

from launcher.cli import prepare
from launcher.plan.errors import PlanError

from launcher_helpers import REPO, check_golden, run_main

IMAGE = "nvcr.io/myorg/llm/llama31-recipes:25.09"

# The NGC CLI's `ngc base-command job run` options this project renders, as the NGC CLI documentation gives them
# (https://docs.ngc.nvidia.com/cli/cmd_base-command.html, "job run"; --ace/--org/--team/--format_type are the
# named arguments every command takes, https://docs.ngc.nvidia.com/cli/cmd_org.html), with the value each takes.
# NVIDIA's own published examples use the same options and forms: the BioNeMo framework's "Getting Started with
# BCP" (--array-type PYTORCH, --ace, --instance, --commandline) and CUDA-Q's DGX Cloud guide (--name,
# --total-runtime 60s, --image, --result /results, --ace, --instance, --commandline).
JOB_RUN_OPTIONS = {
    "--name": r"[A-Za-z0-9._-]+",
    "--image": r"\S+",
    "--instance": r"dgx[a-z]+\d+\.\d+g\.\d+\.\w+",
    "--replicas": r"[2-9]|[1-9]\d+",  # only for multi-replica (multinode) jobs
    "--array-type": r"MPI|PYTORCH",
    "--total-runtime": r"\d+[sSmMhHdD]",  # [nD][nH][nM][nS]
    "--result": r"/\S*",
    "--workspace": r"[^:\s]+:/[^:\s]*:(RW|RO)",  # <id|name>:<mountpoint>:<mode>
    "--datasetid": r"[^:\s]+:/[^:\s]*",  # <id>:<mountpoint>
    "--commandline": r".+",
    "--ace": r"\S+",
    "--org": r"\S+",
    "--team": r"\S+",
    "--preempt": r"RUNONCE|RESUMABLE|RESTARTABLE",
    "--priority": r"LOW|NORMAL|HIGH",
}
# What `ngc base-command job run` prints (ascii format): the job's id under "Job Information".
JOB_RUN_OUTPUT = """--------------------------------------------------------
 Job Information
   Id: {id}
   Name: {name}
   Number of Replicas: 2
   Job Type: BATCH
 Job Status
   Created at: 2026-11-23 07:59:10 UTC
   Status: CREATED
--------------------------------------------------------
"""


def bcp(tmp_path: Path, *overrides: str) -> list[str]:
    return [
        "cluster=bcp",
        "dry_run=true",
        f"cluster.container={IMAGE}",
        "cluster.ace=nv-us-east-2",
        "cluster.org=myorg",
        "cluster.team=llm",
        f"cluster.workspaces=[{{id: llama31-code, mount: {REPO}}},{{id: llama31-runs, mount: {tmp_path}}}]",
        *overrides,
    ]


def ngc_argv(submission: str) -> list[str]:
    """The `ngc ...` words the submission script execs."""
    command = submission.split("\nexec ", 1)[1].replace("\\\n", " ")
    return shlex.split(command)


def check_documented(argv: list[str]) -> None:
    assert argv[:4] == ["ngc", "base-command", "job", "run"]
    options = argv[4:]
    assert len(options) % 2 == 0, options
    for option, value in zip(options[::2], options[1::2]):
        assert option in JOB_RUN_OPTIONS, f"{option} is not a documented job run option"
        assert re.fullmatch(JOB_RUN_OPTIONS[option], value), (option, value)


@pytest.mark.parametrize(
    "name,overrides,replicas",
    [
        ("8b", ["training=llama31/8b", "cluster.instance=dgxa100.80g.8.norm", "cluster.gpu_type=a100"], 1),
        (
            "70b_fp8",
            [
                "training=llama31/70b",
                "dtype=fp8",
                "+cluster.env.NCCL_IB_SL=1",
                'cluster.ngc_args=["--preempt", "RUNONCE", "--priority", "HIGH"]',
                "cluster.datasets=[{id: 1602645, mount: /mnt/tokenizers}]",
            ],
            8,
        ),
        ("405b", ["training=llama31/405b"], 128),
    ],
)
def test_training_jobs(cfg_for, tmp_path, name, overrides, replicas):
    prepared = prepare(cfg_for(*bcp(tmp_path, *overrides)))
    (job,) = prepared.stages.jobs
    files = prepared.platform.render(job, prepared.cfg, prepared.run_dir)
    assert list(files) == ["submission.ngc.sh", "training.job.sh"]
    for file, text in files.items():
        check_golden(f"{name}_bcp_{file}", text, tmp_path)
    argv = ngc_argv(files["submission.ngc.sh"])
    check_documented(argv)
    assert argv[-1] == f"bash {prepared.run_dir}/training.job.sh"
    assert ("--replicas" in argv) == (replicas > 1)
    if replicas > 1:
        assert argv[argv.index("--replicas") + 1] == str(replicas)
        assert argv[argv.index("--array-type") + 1] == "PYTORCH"
    body = files["training.job.sh"]
    plan = prepared.plan
    assert f"bcprun --nnodes {replicas} --npernode 8 \\" in body
    assert re.findall(r"--env (\S+) \\", body) == [f"PYTHONPATH={REPO}", *[f"{k}={v}" for k, v in plan.env.items()]]
    assert f"--cmd 'python -m recipes.train --run-dir {prepared.run_dir}'" in body


def test_data_preparation_spreads_the_shards_over_the_replicas_then_checks(cfg_for, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("a", "b", "c", "d", "e"):
        (corpus / f"{name}.jsonl").write_text('{"text": "x"}\n')
    prepared = prepare(
        cfg_for(
            *bcp(
                tmp_path,
                "stages=[data_preparation]",
                "data_preparation=files",
                f"data_preparation.inputs=[{corpus}/*.jsonl]",
                f"data_preparation.output_dir={tmp_path}/data",
                "data_preparation.job.max_parallel=2",
                "cluster.data_instance=dgxa100.80g.1.norm",
            )
        )
    )
    (job,) = prepared.stages.jobs
    files = prepared.platform.render(job, prepared.cfg, prepared.run_dir)
    for file, text in files.items():
        check_golden(f"files_bcp_{file}", text, tmp_path)
    argv = ngc_argv(files["data_preparation.ngc.sh"])
    check_documented(argv)
    assert argv[argv.index("--instance") + 1] == "dgxa100.80g.1.norm"
    body = files["data_preparation.job.sh"]
    # Replica r takes shards r, r+2, r+4: every shard exactly once.
    assert '--shard "$(seq -s, "$NGC_ARRAY_INDEX" 2 4)"' in body
    for r in (0, 1):
        assert os.popen(f"seq -s, {r} 2 4").read().strip() == ("0,2,4" if r == 0 else "1,3")
    assert body.index("data_prep run") < body.index("data_prep verify")


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["cluster.container=null"], "cluster.container=None: cluster=bcp runs an image by name from a registry"),
        (
            ["training=llama31/8b", "cluster.instance=dgxa100.80g.4.norm"],
            "cluster.instance=dgxa100.80g.4.norm has 4 GPUs but cluster.gpus_per_node=8",
        ),
        (
            ["training=llama31/8b", "cluster.instance=dgxa100.80g.8.norm"],
            "cluster.instance=dgxa100.80g.8.norm has a100 GPUs but cluster.gpu_type=h100; set cluster.gpu_type=a100",
        ),
        ([], "the plan uses 1 GPU per node but cluster.instance=dgxh100.80g.8.norm has 8"),
        (["training=llama31/8b", "cluster.workspaces=[]"], "jobs see only workspaces and datasets"),
        (
            ["training=llama31/8b", "cluster.workspaces=[{id: code, mount: code}]"],
            "cluster.workspaces: each entry needs id",
        ),
        (
            ["stages=[container]"],
            "stages has container but cluster=bcp runs images by name from a registry and builds "
            "none: build and push the image with docker (docs/stack.md: Images for NGC Base Command "
            "and Kubernetes)",
        ),
    ],
)
def test_problems_name_their_keys(cfg_for, tmp_path, overrides, message):
    with pytest.raises(PlanError, match=re.escape(message)):
        prepare(cfg_for(*bcp(tmp_path), *overrides))


def test_results_in_a_read_only_dataset_are_refused(cfg_for, tmp_path):
    with pytest.raises(
        PlanError,
        match=re.escape(
            f"cluster=bcp: {tmp_path}/results must be written and lie in no workspace (datasets are read-only)"
        ),
    ):
        prepare(
            cfg_for(
                "cluster=bcp",
                "dry_run=true",
                f"cluster.container={IMAGE}",
                "training=llama31/8b",
                f"cluster.workspaces=[{{id: code, mount: {REPO}}}]",
                f"cluster.datasets=[{{id: 42, mount: {tmp_path}}}]",
            )
        )


STAND_IN_NGC = r"""#!/bin/bash
# Records each call's arguments (one per line) and answers as the NGC CLI does.
n=$(ls "$NGC_CALLS" | wc -l)
printf '%s\n' "$@" > "$NGC_CALLS/$n"
case "$1 $2 $3" in
    "base-command job run") printf '%s' "$RUN_OUTPUT" | sed "s/{id}/$((7180359 + n))/; s/{name}/x/" ;;
    "base-command job info")
        status=${JOB_STATUS:-FINISHED_SUCCESS}
        printf ' Job Status\n   Created at: 2026-11-23 07:59:10 UTC\n   Status: %s\n' "$status" ;;
    *) echo "unexpected: $*" >&2; exit 2 ;;
esac
"""


def _submit(tmp_path: Path, **env: str):
    """stages=[data_preparation,training] on cluster=bcp through a stand-in ngc; (output, run dir, calls)."""
    (tmp_path / "docs.jsonl").write_text('{"text": "x"}\n')
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    calls.mkdir()
    (bin_dir / "ngc").write_text(STAND_IN_NGC)
    (bin_dir / "ngc").chmod(0o755)
    args = [a for a in bcp(tmp_path) if a != "dry_run=true"]
    out = run_main(
        *args,
        "training=llama31/8b",
        "stages=[data_preparation,training]",
        "data_preparation=files",
        f"data_preparation.inputs=[{tmp_path}/docs.jsonl]",
        f"data_preparation.output_dir={tmp_path}/data",
        "cluster.poll_interval_s=0",
        f"results_dir={tmp_path}/results",
        env={"PATH": f"{bin_dir}:{os.environ['PATH']}", "NGC_CALLS": str(calls), "RUN_OUTPUT": JOB_RUN_OUTPUT, **env},
    )
    run_dir = tmp_path / "results" / "llama31_8b_bf16_tp1_cp2_8gpu"
    recorded = [(calls / str(i)).read_text().splitlines() for i in range(len(list(calls.iterdir())))]
    return out, run_dir, recorded


def test_submission_passes_the_rendered_commands_and_reads_the_job_ids(tmp_path):
    out, run_dir, calls = _submit(tmp_path)
    assert out.returncode == 0, out.stderr
    prep = ngc_argv((run_dir / "data_preparation.ngc.sh").read_text())[1:]
    training = ngc_argv((run_dir / "submission.ngc.sh").read_text())[1:]
    assert calls == [prep, ["base-command", "job", "info", "7180359"], training]
    jobs = json.loads((run_dir / "jobs.json").read_text())
    assert [(j["stage"], j["job_id"], j["dependency"]) for j in jobs] == [
        ("data_preparation", "7180359", None),
        ("training", "7180361", "succeeded:7180359"),
    ]
    assert "submitted training: job 7180361 (after 7180359 finished)" in out.stdout


def test_a_failed_job_stops_the_chain(tmp_path):
    out, run_dir, calls = _submit(tmp_path, JOB_STATUS="FAILED")
    assert out.returncode == 1
    assert (
        "data_preparation (job 7180359) ended with status FAILED" in out.stderr
        and "not submitted: training" in out.stderr
    )
    assert len(calls) == 2
    assert [j["stage"] for j in json.loads((run_dir / "jobs.json").read_text())] == ["data_preparation"]
