"""cluster=k8s: golden manifests for 8B, 70B and 405B and for data preparation, validated offline against the
Kubernetes API schemas (kubernetes-validate), and submission in order through a stand-in kubectl."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from common.typed import changed
import yaml

from launcher.cli import prepare
from launcher.plan.errors import PlanError

from launcher_helpers import REPO, check_golden, rendered, run_main

# A test extra (pyproject.toml); a machine without it (no registry) skips these tests with the reason.
kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate is not installed (pip install -e .[test])"
)

IMAGE = "nvcr.io/myorg/llama31-recipes:25.09"
KUBERNETES = "1.30"  # the oldest release whose schema has every field the manifests use (backoffLimitPerIndex)


def k8s(tmp_path: Path, *overrides: str) -> list[str]:
    return [
        "cluster=k8s",
        "dry_run=true",
        f"cluster.container={IMAGE}",
        "cluster.namespace=llm",
        f"cluster.volumes=[{{claim: code, mount: {REPO}}},{{claim: runs, mount: {tmp_path}}}]",
        *overrides,
    ]


def documents(text: str) -> list[dict]:
    docs = [d for d in yaml.safe_load_all(text) if d]
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)  # raises on any unknown or mistyped field
    return docs


# Keys with '/' cannot be written as Hydra overrides; they are set on the composed config.
SITE = {
    "resources": {"rdma/ib": 8},
    "node_selector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
}


@pytest.mark.parametrize(
    "name,overrides,site,nodes",
    [
        ("8b", ["training=llama31/8b"], {}, 1),
        (
            "70b_fp8",
            ["training=llama31/70b", "dtype=fp8", "+cluster.env.NCCL_IB_SL=1", "cluster.image_pull_secrets=[ngc]"],
            SITE,
            8,
        ),
        ("405b", ["training=llama31/405b", "cluster.gpu_type=h200"], {}, 128),
    ],
)
def test_training_manifests(cfg_for, tmp_path, name, overrides, site, nodes):
    cfg = changed(cfg_for(*k8s(tmp_path, *overrides)), {f"cluster.{k}": v for k, v in site.items()})
    scripts = rendered(cfg)
    assert list(scripts) == ["submission.yaml"]
    check_golden(f"{name}_k8s_submission.yaml", scripts["submission.yaml"], tmp_path, shell=False)
    service, job = documents(scripts["submission.yaml"])
    assert (service["kind"], job["kind"]) == ("Service", "Job")
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] == nodes
    assert service["spec"]["clusterIP"] == "None" and pod["subdomain"] == service["metadata"]["name"]
    assert service["spec"]["selector"] == {"batch.kubernetes.io/job-name": job["metadata"]["name"]}
    assert len(f"{job['metadata']['name']}-{nodes - 1}") <= 63  # the pods' host names
    (container,) = pod["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 8
    plan = prepare(cfg).plan
    script = container["command"][2]
    master = f"{job['metadata']['name']}-0.{service['metadata']['name']}"
    assert (
        f'torchrun --nnodes {nodes} --nproc-per-node 8 --node-rank "$JOB_COMPLETION_INDEX" --master-addr '
        f"{master} --master-port 29500 -m recipes.train --run-dir "
    ) in script
    assert plan.command.startswith("torchrun --nnodes")
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env == {"PYTHONPATH": str(REPO), **plan.env}
    assert {m["mountPath"] for m in container["volumeMounts"]} == {str(REPO), str(tmp_path), "/dev/shm"}


def test_data_preparation_is_an_indexed_job_with_one_pod_per_shard(cfg_for, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("books", "news", "web"):
        (corpus / f"{name}.jsonl").write_text('{"text": "x"}\n')
    scripts = rendered(
        cfg_for(
            *k8s(
                tmp_path,
                "stages=[data_preparation,training]",
                "data_preparation=files",
                f"data_preparation.inputs=[{corpus}/*.jsonl]",
                f"data_preparation.output_dir={tmp_path}/data",
                "data_preparation.job.max_parallel=2",
                "data_preparation.job.cpus_per_task=16",
            )
        )
    )
    assert list(scripts) == ["data_preparation.yaml", "data_check.yaml", "submission.yaml"]
    for name in ("data_preparation.yaml", "data_check.yaml"):
        check_golden(f"files_k8s_{name}", scripts[name], tmp_path, shell=False)
    (prep,) = documents(scripts["data_preparation.yaml"])
    (check,) = documents(scripts["data_check.yaml"])
    assert (prep["spec"]["completions"], prep["spec"]["parallelism"], prep["spec"]["backoffLimitPerIndex"]) == (3, 2, 0)
    assert '--shard "$JOB_COMPLETION_INDEX"' in prep["spec"]["template"]["spec"]["containers"][0]["command"][2]
    assert check["spec"]["completions"] == 1 and "data_prep verify" in json.dumps(check)


def test_kubernetes_validate_rejects_a_broken_manifest(cfg_for, tmp_path):
    """The schema check can fail: a misspelt field in the rendered Job is caught."""
    (_, job) = documents(rendered(cfg_for(*k8s(tmp_path)))["submission.yaml"])
    job["spec"]["paralelism"] = job["spec"].pop("parallelism")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, KUBERNETES, strict=True)


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["cluster.container=null"], "cluster.container=None: cluster=k8s runs an image by name from a registry"),
        (["cluster.volumes=[]"], "pods see only cluster.volumes"),
        (["cluster.volumes=[{claim: x, mount: data}]"], "cluster.volumes: each entry needs claim"),
        (["cluster.time_limit=UNLIMITED"], "cluster.time_limit='UNLIMITED': this platform needs a finite time limit"),
        (
            ["stages=[container]"],
            "stages has container but cluster=k8s runs images by name from a registry and builds "
            "none: build and push the image with docker (docs/stack.md: Images for NGC Base Command "
            "and Kubernetes)",
        ),
    ],
)
def test_problems_name_their_keys(cfg_for, tmp_path, overrides, message):
    with pytest.raises(PlanError, match=re.escape(message)):
        prepare(cfg_for(*k8s(tmp_path), *overrides))


STAND_IN_KUBECTL = r"""#!/bin/bash
# Records its arguments; answers as kubectl does for create -o name and get -o json.
echo "kubectl $*" >> "$TOOL_LOG"
args=("$@")
case " $* " in
    *" create "*)
        file=${args[$# - 3]}
        grep -q '^kind: Service' "$file" && echo "service/$(awk '/^  name:/ {print $2; exit}' "$file")"
        echo "job.batch/$(awk '/^kind: Job/ {j = 1} j && /^  name:/ {print $2; exit}' "$file")" ;;
    *" get "*)
        status=${JOB_STATUS:-Complete}
        condition="{\"type\": \"$status\", \"status\": \"True\", \"reason\": \"BackoffLimitExceeded\"}"
        echo "{\"status\": {\"conditions\": [$condition]}}" ;;
esac
"""


def _kubectl(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "kubectl").write_text(STAND_IN_KUBECTL)
    (bin_dir / "kubectl").chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "TOOL_LOG": str(tmp_path / "calls.log")}


def _submit(tmp_path: Path, **env: str):
    (tmp_path / "docs.jsonl").write_text('{"text": "x"}\n')
    args = [a for a in k8s(tmp_path) if a != "dry_run=true"]
    out = run_main(
        *args,
        "stages=[data_preparation,training]",
        "data_preparation=files",
        f"data_preparation.inputs=[{tmp_path}/docs.jsonl]",
        f"data_preparation.output_dir={tmp_path}/data",
        "cluster.poll_interval_s=0",
        f"results_dir={tmp_path}/results",
        env={**_kubectl(tmp_path), **env},
    )
    run_dir = tmp_path / "results" / "llama31_tiny_bf16_tp1_1gpu"
    return out, run_dir, (tmp_path / "calls.log").read_text().splitlines()


def test_submission_waits_for_each_job_before_the_next(tmp_path):
    out, run_dir, calls = _submit(tmp_path)
    assert out.returncode == 0, out.stderr
    names = {
        stage: f"llama31-{short}-llama31-tiny-bf16-tp1-1gpu"
        for stage, short in (("data_preparation", "data"), ("data_check", "check"), ("training", "train"))
    }
    assert calls == [
        f"kubectl --namespace llm create -f {run_dir}/data_preparation.yaml -o name",
        f"kubectl --namespace llm get job/{names['data_preparation']} -o json",
        f"kubectl --namespace llm create -f {run_dir}/data_check.yaml -o name",
        f"kubectl --namespace llm get job/{names['data_check']} -o json",
        f"kubectl --namespace llm create -f {run_dir}/submission.yaml -o name",
    ]
    jobs = json.loads((run_dir / "jobs.json").read_text())
    assert [(j["stage"], j["job_id"], j["dependency"]) for j in jobs] == [
        ("data_preparation", names["data_preparation"], None),
        ("data_check", names["data_check"], f"succeeded:{names['data_preparation']}"),
        ("training", names["training"], f"succeeded:{names['data_check']}"),
    ]
    assert "waiting for it to succeed before submitting data_check, training" in out.stdout


def test_a_failed_job_stops_the_chain_and_is_recorded(tmp_path):
    out, run_dir, calls = _submit(tmp_path, JOB_STATUS="Failed")
    assert out.returncode == 1
    assert (
        "data_preparation (job llama31-data-llama31-tiny-bf16-tp1-1gpu) failed (BackoffLimitExceeded); not "
        "submitted: data_check, training" in out.stderr
    )
    assert len(calls) == 2 and "create" in calls[0] and "get" in calls[1]
    assert [j["stage"] for j in json.loads((run_dir / "jobs.json").read_text())] == ["data_preparation"]
