"""cluster.platform=k8s (cluster=k8s): batch/v1 manifests. Training is one Indexed Job, one pod per node with its
GPUs, torchrun in every pod (JOB_COMPLETION_INDEX is its node rank), plus a headless Service through which the
pods find pod 0 for the rendezvous; data preparation is an Indexed Job with one pod per shard, then a one-pod
check. Images run by name from a registry; the repository, results and data live on PersistentVolumeClaims
mounted at the paths they have where main.py runs. Kubernetes has no job dependencies: main.py submits each
job once the previous one has completed."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import time
from pathlib import Path
from typing import Any, Sequence

import yaml

from common.config import Config, K8sCluster
from common.plan import Plan
from launcher.jobs import commands
from launcher.jobs.commands import REPO, REPORT_FALLBACK
from launcher.jobs.render import Job
from launcher.jobs.submit import SubmitError, Submitted, run_client, submit_in_order
from launcher.platforms.base import (
    Platform,
    Say,
    evaluation_env,
    evaluation_title,
    outside_mounts,
    time_seconds,
    training_title,
)

SHORT = {
    "data_preparation": "data",
    "data_check": "check",
    "training": "train",
    "eval_loss": "evalloss",
    "evaluation": "eval",
}
# Jobs of the training job's shape: one pod per node, torchrun in each, found through a headless Service.
RANKED = ("training", "eval_loss")


class K8s(Platform[K8sCluster]):
    name = "k8s"
    cluster_class = K8sCluster
    suffix = ".yaml"
    resubmit = "kubectl create -f"
    client = "kubectl"
    chain = (
        "in order: Kubernetes jobs cannot wait for each other, so main.py submits each job once the previous "
        "one has completed, and waits here"
    )
    builds_images = False
    runs_ft_launcher = True
    no_job_chain = (
        "a Job cannot wait for another to end; create the run again to continue it from its newest "
        "checkpoint, or let resilience.in_job_restarts restart the ranks inside the pods; set "
        "resilience.job_restarts=0"
    )

    def problems(self, cfg: Config, selected: Sequence[str], dry_run: bool) -> tuple[list[str], list[str]]:
        cluster = self.cluster_of(cfg)
        found = self.image_name_problems(cluster.container, "<registry>/<image>:<tag>") + _volume_problems(cfg, cluster)
        return found + self.limit_problems(cfg, cluster, selected, finite=True), []

    # ----------------------------------------------------------------------- jobs
    def data_preparation_jobs(self, cfg: Config, run_dir: Path, num_shards: int) -> list[Job]:
        name = cfg.data_preparation.name
        prep = commands.data_prep_command(run_dir, shard='"$JOB_COMPLETION_INDEX"')
        check = shlex.join(commands.data_check_command(run_dir))
        job = cfg.data_preparation.job
        return [
            self.job(
                "data_preparation",
                f"Data preparation ({name}): one pod per shard ({num_shards} shards)",
                [prep],
                array_size=num_shards,
                max_parallel=job.max_parallel,
                cpus_per_task=job.cpus_per_task,
                time_limit=job.time_limit,
            ),
            self.job(
                "data_check",
                f"Check every prepared shard ({num_shards}) before training starts",
                [check],
                time_limit=job.time_limit,
            ),
        ]

    def training_job(
        self, cfg: Config, plan: Plan, run_dir: Path, entry: list[str], stage: str = "training"
    ) -> tuple[Job, str]:
        """torchrun in each pod, its node rank the pod's completion index; pod 0 ends with the report."""
        command = _torchrun(cfg, self.cluster_of(cfg), plan, run_dir, entry, stage)
        report = shlex.join(commands.report_command(run_dir))
        lines = [command]
        if stage == "training":
            lines += [
                "# The throughput / MFU table (into pod 0's log) and the loss and step-time plot (into the run "
                "directory).",
                f'if [ "$JOB_COMPLETION_INDEX" = 0 ]; then {report}{REPORT_FALLBACK}; fi',
            ]
        job = self.job(
            stage,
            training_title(plan, "one pod per node, torchrun in each"),
            lines,
            env=dict(plan.env),
            nodes=plan.num_nodes,
            ntasks_per_node=plan.gpus_per_node,
            gpus_per_node=plan.gpus_per_node,
        )
        return job, command

    def evaluation_job(self, cfg: Config, run_dir: Path) -> Job:
        """One pod with one node's GPUs: lm-eval shards the model over them."""
        return self.job(
            "evaluation",
            evaluation_title(cfg, run_dir),
            [shlex.join(commands.harness_command(run_dir))],
            env=evaluation_env(cfg),
            gpus_per_node=cfg.cluster.gpus_per_node,
            time_limit=cfg.evaluation.time_limit,
        )

    # ----------------------------------------------------------------------- the manifests
    def render_script(self, job: Job, cfg: Config, run_dir: Path) -> str:
        documents = manifests(job, self.cluster_of(cfg), run_dir)
        body = yaml.dump_all(documents, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=120)
        return "\n".join(self.header_lines(job, run_dir)) + "\n" + body

    # ----------------------------------------------------------------------- submission
    def chain_as_shell(self, jobs: list[Job], run_dir: Path, cfg: Config) -> list[str]:
        cluster = self.cluster_of(cfg)
        lines = []
        for index, job in enumerate(jobs):
            lines.append(shlex.join(_kubectl(cluster, "create", "-f", str(run_dir / job.script))))
            if index < len(jobs) - 1:
                name = job_name(cluster, job.stage, run_dir)
                lines.append(
                    shlex.join(_kubectl(cluster, "wait", "--for=condition=complete", "--timeout=-1s", f"job/{name}"))
                )
        return lines

    def submit(self, jobs: list[Job], run_dir: Path, cfg: Config, say: Say = print) -> list[Submitted]:
        cluster = self.cluster_of(cfg)

        def submit_one(job: Job, previous: str | None) -> str:
            out = run_client(
                _kubectl(cluster, "create", "-f", str(run_dir / job.script), "-o", "name"),
                f"kubectl create -f {job.script}",
            )
            names = [line.split("/", 1)[1] for line in out.split() if line.startswith("job.batch/")]
            if not names:
                raise SubmitError(f"kubectl create -f {job.script} printed no job: {out.strip()!r}")
            return names[0]

        return submit_in_order(jobs, run_dir, submit_one, lambda job, name: wait(cluster, name), say)

    def waits_for(self, dependency: str) -> str:
        return f"after {dependency.split(':')[1]} completed"

    def log_of(self, job: Job, job_id: str, run_dir: Path) -> str | None:
        return None  # in the pods: kubectl logs

    def follow_command(self, submitted: list[Submitted]) -> str:
        return shlex.join(["kubectl", "logs", "-f", f"job/{submitted[-1].job_id}"])


def _kubectl(cluster: K8sCluster, *args: str) -> list[str]:
    namespace = cluster.namespace
    return ["kubectl", *(["--namespace", namespace] if namespace else []), *args]


def wait(cluster: K8sCluster, name: str) -> str | None:
    """None once the job is Complete; why not, once it failed."""
    interval = float(cluster.poll_interval_s)
    while True:
        out = run_client(_kubectl(cluster, "get", f"job/{name}", "-o", "json"), f"kubectl get job/{name}")
        conditions = json.loads(out).get("status", {}).get("conditions") or []
        done = {c.get("type") for c in conditions if c.get("status") == "True"}
        if "Complete" in done:
            return None
        if "Failed" in done:
            reason = next((c.get("reason") for c in conditions if c.get("type") == "Failed"), "")
            return f"failed ({reason})" if reason else "failed"
        time.sleep(interval)


# --------------------------------------------------------------------------- checks
def _volume_problems(cfg: Config, cluster: K8sCluster) -> list[str]:
    """Pods see only cluster.volumes: the repository, results_dir and the data must lie on them."""
    volumes = cluster.volumes
    bad = [v for v in volumes if not (v.claim and str(v.mount).startswith("/"))]
    if bad:
        return [
            f"cluster.volumes: each entry needs claim (a PersistentVolumeClaim) and an absolute mount; got {bad[0]!r}"
        ]
    missing = outside_mounts(commands.job_paths(cfg), [str(v.mount) for v in volumes])
    if missing:
        return [
            f"cluster=k8s: pods see only cluster.volumes, and {', '.join(missing)} lie on none of them; "
            "put the repository, results_dir and the data on a PersistentVolumeClaim mounted at the same "
            "path here and in the pods, e.g. cluster.volumes=[{claim: llama31, mount: /mnt/llama31}]"
        ]
    return []


# --------------------------------------------------------------------------- names
def dns_name(*parts: str, limit: int = 52) -> str:
    """A DNS-1035 label from the parts (lowercase letters, digits, '-'; starting with a letter), shortened with a
    digest of the full name when longer than `limit` so that distinct runs keep distinct names."""
    full = "-".join(p for p in parts if p)
    name = re.sub(r"[^a-z0-9]+", "-", full.lower()).strip("-")
    if not name or not name[0].isalpha():
        name = "j-" + name
    if len(name) > limit:
        digest = hashlib.sha256(full.encode()).hexdigest()[:6]
        name = name[: limit - 7].rstrip("-") + "-" + digest
    return name


def job_name(cluster: K8sCluster, stage: str, run_dir: Path) -> str:
    """A DNS label short enough for the pods' host names (<name>-<index>)."""
    return dns_name(cluster.job_name_prefix or "", SHORT[stage], run_dir.name)


def _torchrun(cfg: Config, cluster: K8sCluster, plan: Plan, run_dir: Path, entry: list[str], stage: str) -> str:
    master = job_name(cluster, stage, run_dir)
    if cfg.resilience.in_job_restarts:
        # ft_launcher's c10d rendezvous on pod 0 (it has no static one): it restarts every rank in the pods.
        return commands.ft_launch_command(
            cfg,
            run_dir,
            entry,
            plan.num_nodes,
            plan.gpus_per_node,
            (f"{master}-0.{master}:{cluster.master_port}", master),
        )
    program = entry[1:] if entry[0] == "python" else ["--no-python", *entry]
    return " ".join(
        [
            shlex.join(["torchrun", "--nnodes", str(plan.num_nodes), "--nproc-per-node", str(plan.gpus_per_node)]),
            '--node-rank "$JOB_COMPLETION_INDEX"',
            shlex.join(["--master-addr", f"{master}-0.{master}", "--master-port", str(cluster.master_port), *program]),
        ]
    )


# --------------------------------------------------------------------------- manifests
class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:  # every document spelled out, no &anchors
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    # Pod scripts as literal blocks, readable in the manifest.
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_Dumper.add_representer(str, _str)


def _metadata(cluster: K8sCluster, name: str, job: Job, run_dir: Path) -> dict[str, Any]:
    labels = {
        "app.kubernetes.io/name": "llama31-recipes",
        "app.kubernetes.io/component": job.stage.replace("_", "-"),
        "llama31-recipes/run": dns_name(run_dir.name, limit=63),
    }
    meta: dict[str, Any] = {"name": name}
    if cluster.namespace:
        meta["namespace"] = cluster.namespace
    meta["labels"] = labels
    return meta


def _pod(cluster: K8sCluster, job: Job, name: str) -> dict[str, Any]:
    volumes = cluster.volumes
    env = {"PYTHONPATH": str(REPO), **job.env}
    limits: dict[str, Any] = {}
    requests: dict[str, Any] = {}
    if job.gpus_per_node:
        limits["nvidia.com/gpu"] = job.gpus_per_node
        limits.update(cluster.resources)
    elif job.cpus_per_task:
        requests["cpu"] = job.cpus_per_task
    container: dict[str, Any] = {
        "name": job.stage.replace("_", "-"),
        "image": cluster.container,
        "workingDir": str(REPO),
        "command": ["bash", "-c", "\n".join(["set -euo pipefail", *job.lines]) + "\n"],
        "env": [{"name": k, "value": str(v)} for k, v in env.items()],
        "volumeMounts": [{"name": f"volume-{i}", "mountPath": str(v.mount)} for i, v in enumerate(volumes)]
        + [{"name": "dshm", "mountPath": "/dev/shm"}],
    }
    resources = {k: v for k, v in (("limits", limits), ("requests", requests)) if v}
    if resources:
        container["resources"] = resources
    pod: dict[str, Any] = {"restartPolicy": "Never"}
    if job.stage in RANKED:
        pod["subdomain"] = name  # <name>-<index>.<name> resolves to each pod through the headless Service
        # Kubernetes sends SIGTERM at the deadline and waits this long: the trainer checkpoints and exits.
        pod["terminationGracePeriodSeconds"] = cluster.signal_before_timeout_s or 30
    pod["containers"] = [container]
    # NCCL and the data loaders need more shared memory than a container's default 64 MiB.
    pod["volumes"] = [
        {"name": f"volume-{i}", "persistentVolumeClaim": {"claimName": str(v.claim)}} for i, v in enumerate(volumes)
    ] + [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": str(cluster.shm_size)}}]
    if cluster.node_selector:
        pod["nodeSelector"] = cluster.node_selector
    if cluster.tolerations:
        pod["tolerations"] = cluster.tolerations
    if cluster.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": s} for s in cluster.image_pull_secrets]
    return pod


def manifests(job: Job, cluster: K8sCluster, run_dir: Path) -> list[dict[str, Any]]:
    name = job_name(cluster, job.stage, run_dir)
    meta = _metadata(cluster, name, job, run_dir)
    completions = job.nodes if job.stage in RANKED else (job.array_size or 1)
    spec: dict[str, Any] = {
        "completionMode": "Indexed",
        "completions": completions,
        "parallelism": min(job.max_parallel or completions, completions),
    }
    if job.array_size:
        spec["backoffLimitPerIndex"] = 0  # a failed shard fails alone; the others run to the end
    else:
        spec["backoffLimit"] = 0  # one failed pod ends the job (torchrun's peers cannot go on without it)
    limit = time_seconds(job.time_limit or cluster.time_limit)
    spec["activeDeadlineSeconds"] = limit
    spec["template"] = {"metadata": {"labels": dict(meta["labels"])}, "spec": _pod(cluster, job, name)}
    documents = [{"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": spec}]
    if job.stage in RANKED:
        service = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": dict(meta),
            "spec": {
                "clusterIP": "None",
                "publishNotReadyAddresses": True,
                "selector": {"batch.kubernetes.io/job-name": name},
                "ports": [{"name": "rendezvous", "port": cluster.master_port}],
            },
        }
        documents.insert(0, service)
    return documents


PLATFORM = K8s()
