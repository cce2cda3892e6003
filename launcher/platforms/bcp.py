"""cluster.platform=bcp (cluster=bcp): NGC Base Command Platform / DGX Cloud. Each stage is one
`ngc base-command job run` (image by name, instance type, --replicas N --array-type PYTORCH, workspaces
read-write, datasets read-only, --result, --total-runtime) whose command runs a script from the run directory on
the first replica; bcprun there starts the processes on every replica (one per GPU for training, one per replica
for data preparation, each replica taking every R-th shard, then the check). Base Command has no job
dependencies: main.py submits each job once the previous one has finished successfully."""

from __future__ import annotations

import re
import shlex
import time
from pathlib import Path
from typing import Mapping, Sequence

from common.config import BcpCluster, Config, Dataset, Workspace
from common.plan import Plan
from launcher.jobs import commands
from launcher.jobs.commands import REPO, REPORT_FALLBACK
from launcher.jobs.render import KEEP_LOG, Job, tee
from launcher.jobs.submit import SubmitError, Submitted, run_client, submit_in_order
from launcher.plan.errors import PlanError
from launcher.platforms.base import (
    Platform,
    Say,
    evaluation_env,
    evaluation_title,
    outside_mounts,
    time_seconds,
    training_title,
)
from launcher.platforms.base import gpus as gpus_text

# dgxa100.80g.8.norm: the GPU family, memory per GPU, GPUs per replica, class.
INSTANCE = re.compile(r"^dgx(?P<gpu>[a-z]+\d+)\.\d+g\.(?P<gpus>\d+)\.")
# `ngc base-command job info` prints the job's state as "Status: <STATE>" under "Job Status".
STATUS = re.compile(r"^\s*Status:\s*([A-Z_]+)\s*$", re.MULTILINE)
# The jobs that need the GPU instance (the others run on cluster.data_instance where it is set).
GPU_STAGES = ("training", "eval_loss", "evaluation")
UNFINISHED = {"CREATED", "QUEUED", "STARTING", "RUNNING", "PENDING_TERMINATION", "PENDING_STORAGE_CREATION"}
SUCCEEDED = "FINISHED_SUCCESS"


class Bcp(Platform[BcpCluster]):
    name = "bcp"
    cluster_class = BcpCluster
    suffix = ".ngc.sh"
    resubmit = "bash"
    client = "ngc"
    chain = (
        "in order: Base Command jobs cannot wait for each other, so main.py submits each job once the previous "
        "one has finished successfully, and waits here"
    )
    builds_images = False
    no_job_chain = (
        "a job cannot wait for another to end; submit the run again to continue it from its newest "
        "checkpoint, and set resilience.job_restarts=0"
    )
    no_ft_launcher = "bcprun starts every rank itself, one process per GPU"

    # ----------------------------------------------------------------------- checks
    def problems(self, cfg: Config, selected: Sequence[str], dry_run: bool) -> tuple[list[str], list[str]]:
        cluster = self.cluster_of(cfg)
        example = "nvcr.io/<org>/<team>/<image>:<tag>"
        found = self.image_name_problems(cluster.container, example) + _instance_problems(cluster)
        problem = _mount_problem(cluster)
        if problem:
            return found + [problem], []
        limits = self.limit_problems(cfg, cluster, selected, finite=True)
        return found + _path_problems(cfg, cluster, selected) + limits, []

    # ----------------------------------------------------------------------- jobs
    def data_preparation_jobs(self, cfg: Config, run_dir: Path, num_shards: int) -> list[Job]:
        """One job: its replicas take every R-th shard (replica r: shards r, r+R, ...), then the first replica
        checks every shard."""
        name = cfg.data_preparation.name
        job = cfg.data_preparation.job
        replicas = min(num_shards, job.max_parallel or num_shards)
        if replicas > 1:
            shards = f'"$(seq -s, "$NGC_ARRAY_INDEX" {replicas} {num_shards - 1})"'
            prep = _bcprun(replicas, 1, {}, commands.data_prep_command(run_dir, shard=shards))
        else:
            prep = commands.data_prep_command(run_dir)
        check = shlex.join(commands.data_check_command(run_dir))
        return [
            self.job(
                "data_preparation",
                f"Data preparation ({name}, {num_shards} shards) on {replicas} replica"
                f"{'s' if replicas > 1 else ''}, then a check of every shard",
                [logged(prep, run_dir, "data_preparation"), logged(check, run_dir, "data_preparation")],
                nodes=replicas,
                ntasks_per_node=1,
                time_limit=job.time_limit,
            )
        ]

    def training_job(
        self, cfg: Config, plan: Plan, run_dir: Path, entry: list[str], stage: str = "training"
    ) -> tuple[Job, str]:
        """bcprun starts one process per GPU on every replica (array type PYTORCH: torchrun's RANK / LOCAL_RANK /
        WORLD_SIZE / MASTER_ADDR); the first replica then prints the report."""
        cluster = self.cluster_of(cfg)
        _, gpus = instance_gpus(cluster.instance)
        if gpus and plan.gpus_per_node != gpus and ("training" in cfg.stages or stage != "training"):
            raise PlanError(
                [
                    f"the plan uses {gpus_text(plan.gpus_per_node)} per node but cluster.instance="
                    f"{cluster.instance} has {gpus}: pick a {plan.gpus_per_node}-GPU instance or set "
                    f"parallelism.num_gpus to a multiple of {gpus}"
                ]
            )
        command = _bcprun(plan.num_nodes, plan.gpus_per_node, plan.env, shlex.join(entry))
        report = shlex.join(commands.report_command(run_dir))
        lines = [logged(command, run_dir, stage)]
        if stage == "training":
            lines += [
                "# The throughput / MFU table and the loss and step-time plot of this run.",
                tee(report, run_dir / "logs" / "report.txt", append=False) + REPORT_FALLBACK,
            ]
        job = self.job(
            stage,
            training_title(plan, "bcprun, one process per GPU"),
            lines,
            env=dict(plan.env),
            nodes=plan.num_nodes,
            ntasks_per_node=plan.gpus_per_node,
            gpus_per_node=plan.gpus_per_node,
        )
        return job, command

    def evaluation_job(self, cfg: Config, run_dir: Path) -> Job:
        """One replica: lm-eval shards the model over its GPUs."""
        harness = shlex.join(commands.harness_command(run_dir))
        return self.job(
            "evaluation",
            evaluation_title(cfg, run_dir),
            [logged(harness, run_dir, "evaluation")],
            env=evaluation_env(cfg),
            gpus_per_node=cfg.cluster.gpus_per_node,
            time_limit=cfg.evaluation.time_limit,
        )

    # ----------------------------------------------------------------------- rendering
    def render(self, job: Job, cfg: Config, run_dir: Path) -> dict[str, str]:
        """The submission script, then the job's body, which the submitted job runs."""
        return {**super().render(job, cfg, run_dir), body_name(job.stage): self.render_body(job, run_dir)}

    def render_script(self, job: Job, cfg: Config, run_dir: Path) -> str:
        title = f"{job.title}: submits to NGC Base Command Platform the job that runs {body_name(job.stage)}"
        return "\n".join(
            [
                "#!/usr/bin/env bash",
                *self.header_lines(job, run_dir, title),
                "set -euo pipefail",
                "exec " + _grouped(ngc_command(job, self.cluster_of(cfg), run_dir)),
                "",
            ]
        )

    def render_body(self, job: Job, run_dir: Path) -> str:
        return "\n".join(
            [
                "#!/usr/bin/env bash",
                f"# {job.title}",
                "# Runs in the image on the job's first replica (ngc base-command job run --commandline); "
                "bcprun starts",
                "# the processes on every replica. Written by main.py for " + run_dir.name,
                "set -euo pipefail",
                KEEP_LOG,
                f"cd {shlex.quote(str(REPO))}",
                *self.env_lines(job),
                "",
                *job.lines,
                "",
            ]
        )

    # ----------------------------------------------------------------------- submission
    def chain_as_shell(self, jobs: list[Job], run_dir: Path, cfg: Config) -> list[str]:
        lines = []
        for index, job in enumerate(jobs):
            lines.append(shlex.join(["bash", str(run_dir / job.script)]))
            if index < len(jobs) - 1:
                lines.append("# ... until `ngc base-command job info <its id>` shows Status: FINISHED_SUCCESS")
        return lines

    def submit(self, jobs: list[Job], run_dir: Path, cfg: Config, say: Say = print) -> list[Submitted]:
        def submit_one(job: Job, previous: str | None) -> str:
            out = run_client(["bash", str(run_dir / job.script)], f"ngc base-command job run ({job.script})")
            match = re.search(r"^\s*Id:\s*(\d+)\s*$", out, re.MULTILINE)  # "Job Information / Id: 7180359"
            if not match:
                raise SubmitError(f"ngc base-command job run ({job.script}) printed no job id: {out.strip()[:200]!r}")
            return match.group(1)

        interval = float(self.cluster_of(cfg).poll_interval_s)
        return submit_in_order(jobs, run_dir, submit_one, lambda job, job_id: wait(job_id, interval), say)

    def waits_for(self, dependency: str) -> str:
        return f"after {dependency.split(':')[1]} finished"

    def log_of(self, job: Job, job_id: str, run_dir: Path) -> str | None:
        return f"{run_dir}/logs/{job.stage}_{job_id}.log"

    def follow_command(self, submitted: list[Submitted]) -> str:
        return f"ngc base-command job info {submitted[-1].job_id}"


def body_name(stage: str) -> str:
    return f"{stage}.job.sh"


def logged(cmd: str, run_dir: Path, stage: str) -> str:
    """Output into the job's log and RUN_DIR/logs/<stage>_<job id>.log (render.py's keep_log)."""
    return f'{cmd} 2>&1 | keep_log -a "{run_dir}/logs/{stage}_$NGC_JOB_ID.log"'


def wait(job_id: str, interval: float) -> str | None:
    """None once the job has finished successfully; why not, once it ended otherwise (asked every `interval`
    seconds)."""
    while True:
        out = run_client(["ngc", "base-command", "job", "info", job_id], f"ngc base-command job info {job_id}")
        match = STATUS.search(out)
        status = match.group(1) if match else "UNKNOWN"
        if status == SUCCEEDED:
            return None
        if status not in UNFINISHED:
            return f"ended with status {status} (ngc base-command job log {job_id})"
        time.sleep(interval)


# --------------------------------------------------------------------------- checks
def _mount_problem(cluster: BcpCluster) -> str | None:
    mounts: list[tuple[str, Sequence[Workspace | Dataset]]] = [
        ("workspaces", cluster.workspaces),
        ("datasets", cluster.datasets),
    ]
    for key, entries in mounts:
        for entry in entries:
            if not (entry.id and entry.mount and str(entry.mount).startswith("/")):
                return f"cluster.{key}: each entry needs id and an absolute mount; got {entry!r}"
    return None


def instance_gpus(instance: str | None) -> tuple[str | None, int | None]:
    """The GPU family and the GPUs per replica an instance type names (dgxh100.80g.8.norm: h100, 8)."""
    match = INSTANCE.match(str(instance or ""))
    return (match["gpu"], int(match["gpus"])) if match else (None, None)


def _instance_problems(cluster: BcpCluster) -> list[str]:
    """The instance type names the GPUs of a replica: they must be the plan's."""
    family, gpus = instance_gpus(cluster.instance)
    if not cluster.instance:
        return [
            "cluster.instance is empty: name the instance type (ngc base-command ace list), e.g. "
            "cluster.instance=dgxh100.80g.8.norm"
        ]
    if gpus is not None and gpus != cluster.gpus_per_node:
        return [
            f"cluster.instance={cluster.instance} has {gpus} GPUs but cluster.gpus_per_node="
            f"{cluster.gpus_per_node}; set cluster.gpus_per_node={gpus} or pick another instance"
        ]
    if family and cluster.gpu_type and family != str(cluster.gpu_type).lower():
        return [
            f"cluster.instance={cluster.instance} has {family} GPUs but cluster.gpu_type="
            f"{cluster.gpu_type}; set cluster.gpu_type={family}"
        ]
    return []


def _path_problems(cfg: Config, cluster: BcpCluster, selected: Sequence[str]) -> list[str]:
    """Jobs see only workspaces (read-write) and datasets (read-only), at the paths they have here."""
    found = []
    mounts = [str(m.mount) for m in cluster.workspaces] + [str(m.mount) for m in cluster.datasets]
    missing = outside_mounts(commands.job_paths(cfg), mounts)
    if missing:
        found.append(
            f"cluster=bcp: jobs see only workspaces and datasets, and {', '.join(missing)} lie on none of "
            "them; keep the repository, results_dir and the data in a workspace mounted at the same path "
            "here (ngc workspace mount) and in the job, e.g. cluster.workspaces=[{id: llama31, mount: "
            "/mnt/llama31}]"
        )
    writable = [str(m.mount) for m in cluster.workspaces]
    outputs = [cfg.results_dir] + ([str(cfg.data_preparation.output_dir)] if "data_preparation" in selected else [])
    read_only = [p for p in outside_mounts(outputs, writable) if p not in missing]
    if read_only:
        found.append(
            f"cluster=bcp: {', '.join(read_only)} must be written and lie in no workspace (datasets are "
            "read-only); move them into one of cluster.workspaces"
        )
    return found


# --------------------------------------------------------------------------- the job's files
def _bcprun(nodes: int, per_node: int, env: Mapping[str, str], command: str) -> str:
    """bcprun with one option per line; its --cmd runs in a shell on every replica."""
    groups = [
        ["bcprun", "--nnodes", str(nodes), "--npernode", str(per_node)],
        ["--workdir", str(REPO)],
        ["--env", f"PYTHONPATH={REPO}"],
        *[["--env", f"{k}={v}"] for k, v in env.items()],
    ]
    return commands.grouped_line(groups, shlex.join(["--cmd", command]))


def job_name(cluster: BcpCluster, stage: str, run_dir: Path) -> str:
    name = ".".join(p for p in (cluster.job_name_prefix, stage, run_dir.name) if p)
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name)


def ngc_command(job: Job, cluster: BcpCluster, run_dir: Path) -> list[str]:
    """The documented `ngc base-command job run` options: the job runs the body script on its first replica."""
    instance = cluster.instance
    if job.stage not in GPU_STAGES and cluster.data_instance:
        instance = cluster.data_instance
    args = [
        "ngc",
        "base-command",
        "job",
        "run",
        "--name",
        job_name(cluster, job.stage, run_dir),
        "--image",
        str(cluster.container),
        "--instance",
        str(instance),
    ]
    for option, value in (("ace", cluster.ace), ("org", cluster.org), ("team", cluster.team)):
        if value:
            args += [f"--{option}", str(value)]
    if job.nodes > 1:
        args += ["--replicas", str(job.nodes), "--array-type", "PYTORCH"]
    args += [
        "--total-runtime",
        f"{time_seconds(job.time_limit or cluster.time_limit)}s",
        "--result",
        str(cluster.result),
    ]
    for ws in cluster.workspaces:
        args += ["--workspace", f"{ws.id}:{ws.mount}:{ws.mode or 'RW'}"]
    for ds in cluster.datasets:
        args += ["--datasetid", f"{ds.id}:{ds.mount}"]
    args += [str(a) for a in cluster.ngc_args]
    return [*args, "--commandline", f"bash {run_dir / body_name(job.stage)}"]


def _grouped(args: list[str]) -> str:
    """One option (with its value) per line."""
    groups: list[list[str]] = [args[:4]]
    for arg in args[4:]:
        if arg.startswith("--"):
            groups.append([arg])
        else:
            groups[-1].append(arg)
    return " \\\n    ".join(shlex.join(g) for g in groups)


PLATFORM = Bcp()
