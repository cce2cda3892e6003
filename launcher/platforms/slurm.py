"""cluster.platform=slurm (cluster=bcm): sbatch scripts, one task per GPU started by srun, in a pyxis or apptainer
container or bare metal; each job waits for the previous one with afterok."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from common.config import Config, SlurmCluster
from common.plan import Plan
from launcher.jobs import commands
from launcher.jobs.commands import REPORT_FALLBACK, bare_path
from launcher.jobs.render import Job
from launcher.jobs.submit import SubmitError, Submitted, run_client, submit_chained
from launcher.platforms.base import (
    Platform,
    Say,
    chain_lines,
    evaluation_env,
    evaluation_title,
    export_title,
    preflight_title,
    queued,
    training_title,
)

RENDEZVOUS = [
    "# torch.distributed rendezvous on the first node; the port follows the job id so that jobs sharing",
    "# a node never collide. Ranks come from SLURM_PROCID / SLURM_LOCALID / SLURM_NTASKS.",
    'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
    "export MASTER_PORT=$((20000 + SLURM_JOB_ID % 40000))",
]
# resilience.in_job_restarts: one task per node runs ft_launcher, which starts that node's ranks.
FT_RENDEZVOUS = [
    "# ft_launcher's rendezvous on the first node; the port follows the job id so that jobs sharing a node",
    "# never collide. One ft_launcher per node (nvidia-resiliency-ext's torchrun) starts that node's ranks and,",
    "# after a hang or a crash, restarts every rank of the job in this allocation (resilience.in_job_restarts).",
    "# Ranks come from the RANK / LOCAL_RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT it sets, which win over",
    "# srun's SLURM_PROCID (here the node's launcher, not a rank).",
    'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
    "export MASTER_PORT=$((20000 + SLURM_JOB_ID % 40000))",
    "# Each node's launcher task gets every CPU of its node for its ranks, not srun's one per task.",
    "export SLURM_CPUS_PER_TASK=$SLURM_CPUS_ON_NODE",
]
# This run's jobs still queued: the rest of a chain (the running job is not pending).
CANCEL_QUEUED = 'scancel --state=PENDING --jobname="$SLURM_JOB_NAME" --user="$(id -un)"'


class Slurm(Platform[SlurmCluster]):
    name = "slurm"
    cluster_class = SlurmCluster
    suffix = ".sbatch"
    resubmit = "sbatch"
    client = "sbatch"
    chain = "each job waiting for the previous one (afterok)"
    time_format = "a Slurm time"
    rank_variable = "SLURM_PROCID"
    chains_jobs = True
    runs_ft_launcher = True

    # ----------------------------------------------------------------------- jobs
    def data_preparation_jobs(self, cfg: Config, run_dir: Path, num_shards: int) -> list[Job]:
        """An array job, one task per shard, then a one-task check of every shard (afterok on the array)."""
        cluster = self.cluster_of(cfg)
        name = cfg.data_preparation.name
        srun, container = commands.srun_prefix(cfg, cluster), self.container_wrapper(cfg)
        prep = commands.data_prep_command(run_dir, shard='"$SLURM_ARRAY_TASK_ID"')
        check = shlex.join(commands.data_check_command(run_dir))
        job = cfg.data_preparation.job
        cpus = job.cpus_per_task
        return [
            self.job(
                "data_preparation",
                f"Data preparation ({name}): one array task per shard ({num_shards} shards)",
                [commands.shell_line(srun, prep, container)],
                path_first=bare_path(cluster),
                array_size=num_shards,
                max_parallel=job.max_parallel,
                cpus_per_task=cpus,
                # Tokenizer workers use every CPU they get: a whole node per task unless sized.
                exclusive=cluster.exclusive and not cpus,
                time_limit=job.time_limit,
            ),
            self.job(
                "data_check",
                f"Check every prepared shard ({num_shards}) before training starts",
                [commands.shell_line(srun, check, container)],
                path_first=bare_path(cluster),
                time_limit=job.time_limit,
            ),
        ]

    def training_job(
        self, cfg: Config, plan: Plan, run_dir: Path, entry: list[str], stage: str = "training"
    ) -> tuple[Job, str]:
        """srun starts one task per GPU; ranks come from SLURM_PROCID / SLURM_LOCALID / SLURM_NTASKS. With
        resilience.in_job_restarts, one task per node runs ft_launcher, which starts the node's ranks. With
        resilience.job_restarts, the job asks first whether it still has work (chain_lines). The job ends with
        the report."""
        cluster = self.cluster_of(cfg)
        in_job, chained = cfg.resilience.in_job_restarts, cfg.resilience.job_restarts
        container = self.container_wrapper(cfg, plan.env)
        if in_job:
            srun = commands.srun_prefix(
                cfg, cluster, env_keys=[*plan.env, "MASTER_ADDR", "MASTER_PORT"], extra=["--kill-on-bad-exit=1"]
            )
            program = commands.ft_launch_command(
                cfg, run_dir, entry, plan.num_nodes, plan.gpus_per_node, ("$MASTER_ADDR:$MASTER_PORT", "$SLURM_JOB_ID")
            )
            how = "ft_launcher on every node"
        else:
            srun = _every_rank(cfg, cluster, plan, mpi=plan.tp_comm_overlap)
            program = shlex.join(entry)
            how = "one task per GPU"
        report = shlex.join(commands.report_command(run_dir))
        one_task = commands.srun_prefix(cfg, cluster, extra=["--nodes=1", "--ntasks=1"])
        before: list[str] = []
        after: list[str] = []
        if chained:
            before, after = chain_lines(
                cfg,
                run_dir,
                lambda command: commands.shell_line(one_task, command, self.container_wrapper(cfg)),
                "$SLURM_JOB_ID",
                CANCEL_QUEUED,
                "afterany",
            )
        lines = [
            *before,
            *(FT_RENDEZVOUS if in_job else RENDEZVOUS),
            commands.shell_line(srun, program, container),
            *after,
        ]
        if stage == "training":
            lines += [
                "# The throughput / MFU table (into this log) and the loss and step-time plot (into the run "
                "directory).",
                commands.shell_line(one_task, report, self.container_wrapper(cfg)) + REPORT_FALLBACK,
            ]
        margin = cluster.signal_before_timeout_s
        job = self.job(
            stage,
            training_title(plan, how),
            lines,
            signal=f"USR1@{margin}" if margin else None,
            restarts=chained,
            **_job_shape(cluster, plan, tasks_per_node=1 if in_job else None),
        )
        return job, " ".join([shlex.join(srun), *([shlex.join(container)] if container else []), program])

    def preflight_job(self, cfg: Config, plan: Plan, run_dir: Path) -> Job:
        """The training job's nodes and tasks running recipes.preflight; afterok stops the chain when it fails."""
        cluster = self.cluster_of(cfg)
        srun = _every_rank(cfg, cluster, plan, mpi=False)
        line = commands.shell_line(
            srun, shlex.join(commands.preflight_entry(run_dir)), self.container_wrapper(cfg, plan.env)
        )
        return self.job(
            "preflight",
            preflight_title(plan),
            [*RENDEZVOUS, line],
            time_limit=cfg.preflight.time_limit,
            **_job_shape(cluster, plan),
        )

    def export_job(self, cfg: Config, run_dir: Path) -> Job:
        """One task on one node, where the checkpoint is (CPU work)."""
        cluster = self.cluster_of(cfg)
        srun = commands.srun_prefix(cfg, cluster, extra=["--nodes=1", "--ntasks=1"])
        export = commands.export_hf_command(cfg.training.checkpoint, run_dir)
        line = commands.shell_line(srun, shlex.join(export), self.container_wrapper(cfg))
        return self.job(
            "export",
            export_title(run_dir),
            [line],
            path_first=bare_path(cluster),
            exclusive=cluster.exclusive,
        )

    def evaluation_job(self, cfg: Config, run_dir: Path) -> Job:
        """One task on one node with its GPUs: lm-eval shards the model over them."""
        cluster = self.cluster_of(cfg)
        env = evaluation_env(cfg)
        srun = commands.srun_prefix(cfg, cluster, env_keys=list(env), extra=["--nodes=1", "--ntasks=1"])
        harness = shlex.join(commands.harness_command(run_dir))
        return self.job(
            "evaluation",
            evaluation_title(cfg, run_dir),
            [commands.shell_line(srun, harness, self.container_wrapper(cfg, env))],
            env=env,
            path_first=bare_path(cluster),
            gpus_per_node=cluster.gpus_per_node,
            exclusive=cluster.exclusive,
            time_limit=cfg.evaluation.time_limit,
        )

    # ----------------------------------------------------------------------- the sbatch script
    def render_script(self, job: Job, cfg: Config, run_dir: Path) -> str:
        """#SBATCH header from the job's resources and the cluster's settings; logs go to RUN_DIR/logs/."""
        return "\n".join(
            [
                "#!/bin/bash",
                *self.header_lines(job, run_dir),
                *[f"#SBATCH {d}" for d in _directives(job, self.cluster_of(cfg), run_dir)],
                "set -euo pipefail",
                *self.env_lines(job),
                "",
                *job.lines,
                "",
            ]
        )

    # ----------------------------------------------------------------------- submission
    def chain_as_shell(self, jobs: list[Job], run_dir: Path, cfg: Config) -> list[str]:
        """What submit runs, as shell lines with the job ids in variables."""
        lines = []
        for index, (job, after_any) in enumerate(queued(jobs), start=1):
            dependency = f"{'afterany' if after_any else 'afterok'}:$JOB{index - 1}" if index > 1 else None
            # The script's path is quoted; the dependency stays unquoted so the shell expands $JOB<n>.
            command = sbatch_command(run_dir / job.script, dependency)
            lines.append(f"JOB{index}=$({' '.join(command[:-1])} {shlex.quote(command[-1])})")
        return lines

    def submit(self, jobs: list[Job], run_dir: Path, cfg: Config, say: Say = print) -> list[Submitted]:
        """Each job waits for the previous one with afterok (never singleton: names are not dependencies); the
        repeats of a chained training job with afterany."""

        def submit_one(script: Path, previous: str | None, after_any: bool) -> tuple[str, str | None]:
            dependency = f"{'afterany' if after_any else 'afterok'}:{previous}" if previous else None
            return sbatch(script, dependency), dependency

        return submit_chained(queued(jobs), run_dir, submit_one, cancel="scancel", cancelled="cancelled")

    def waits_for(self, dependency: str) -> str:
        return f"--dependency={dependency}"

    def follow_command(self, submitted: list[Submitted]) -> str:
        return f"squeue -j {','.join(s.job_id for s in submitted)}"


def _every_rank(cfg: Config, cluster: SlurmCluster, plan: Plan, mpi: bool) -> list[str]:
    return commands.srun_prefix(
        cfg, cluster, env_keys=[*plan.env, "MASTER_ADDR", "MASTER_PORT"], mpi=mpi, extra=["--kill-on-bad-exit=1"]
    )


def _job_shape(cluster: SlurmCluster, plan: Plan, tasks_per_node: int | None = None) -> dict[str, Any]:
    """One task per GPU on the plan's nodes (or tasks_per_node: ft_launcher's one): training and the preflight,
    which measures the same layout."""
    return dict(
        env=dict(plan.env),
        path_first=bare_path(cluster),
        nodes=plan.num_nodes,
        ntasks_per_node=tasks_per_node or plan.gpus_per_node,
        gpus_per_node=plan.gpus_per_node if cluster.gpus_per_node else None,
        exclusive=cluster.exclusive,
    )


def _directives(job: Job, cluster: SlurmCluster, run_dir: Path) -> list[str]:
    log = f"{run_dir}/logs/{job.stage}_" + ("%A_%a" if job.array_size else "%j")
    prefix = cluster.job_name_prefix
    directives = [f"--job-name={prefix + ':' if prefix else ''}{job.stage}:{run_dir.name}", f"--nodes={job.nodes}"]
    if job.ntasks_per_node:
        directives.append(f"--ntasks-per-node={job.ntasks_per_node}")
    if job.gpus_per_node:
        directives.append(f"--gpus-per-node={job.gpus_per_node}")
    if job.cpus_per_task:
        directives.append(f"--cpus-per-task={job.cpus_per_task}")
    if job.array_size:
        limit = f"%{job.max_parallel}" if job.max_parallel else ""
        directives.append(f"--array=0-{job.array_size - 1}{limit}")
    directives.append(f"--time={job.time_limit or cluster.time_limit}")
    for option, value in (("partition", cluster.partition), ("account", cluster.account)):
        if value:
            directives.append(f"--{option}={value}")
    if job.exclusive:
        directives += ["--exclusive", "--mem=0"]
    directives += [f"--output={log}.out", f"--error={log}.err"]
    if job.signal:
        # Without "B:" Slurm signals the job steps (every rank), which is where the trainer listens.
        directives.append(f"--signal={job.signal}")
    # A job whose afterok dependency failed would otherwise wait in the queue forever.
    directives.append("--kill-on-invalid-dep=yes")
    return directives + [str(arg) for arg in cluster.sbatch_args]


def sbatch_command(script: Path, dependency: str | None) -> list[str]:
    cmd = ["sbatch", "--parsable"]
    if dependency:
        cmd.append(f"--dependency={dependency}")
    cmd.append(str(script))
    return cmd


def sbatch(script: Path, dependency: str | None) -> str:
    out = run_client(sbatch_command(script, dependency), f"sbatch {script.name}")
    job_id = out.strip().split(";")[0]  # --parsable prints "jobid" or "jobid;cluster"
    if not job_id.isdigit():
        raise SubmitError(f"sbatch {script.name} printed no job id: {out.strip()!r}")
    return job_id


PLATFORM = Slurm()
