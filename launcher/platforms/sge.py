"""cluster.platform=sge (cluster=sge): Grid Engine job scripts (`#$` directives, TSUBAME-style resource lines from
the config), ranks started by mpirun, one per GPU, in an Apptainer container or bare metal; each job waits for
the previous one with -hold_jid."""

from __future__ import annotations

import shlex
from pathlib import Path

from common.config import Config, SgeCluster
from common.plan import Plan
from launcher.jobs import commands
from launcher.jobs.commands import REPORT_FALLBACK, bare_path
from launcher.jobs.render import Job
from launcher.jobs.submit import SubmitError, Submitted, run_client, submit_chained
from launcher.plan.errors import PlanError
from launcher.platforms.base import (
    Platform,
    Say,
    chain_lines,
    evaluation_env,
    evaluation_title,
    export_title,
    hms,
    queued,
    time_seconds,
    training_title,
)

# A job script that exits with 100 is set into the error state, and Grid Engine never starts the jobs that wait
# for it (-hold_jid): the afterok of this platform. Only jobs that something waits for use it.
FAIL_HOLDS_DEPENDENTS = "trap 'exit 100' ERR"
# This run's jobs still queued (the rest of a chain): pending jobs of the user with this job's full name (qstat -r
# prints it on a line of its own; the job list truncates names).
CANCEL_QUEUED = (
    'qstat -s p -u "$(id -un)" -r | awk -v name="$JOB_NAME" \'/^ *[0-9]+ /{id=$1} '
    "/Full jobname:/{if ($3 == name) print id}' | xargs -r qdel"
)


class Sge(Platform[SgeCluster]):
    name = "sge"
    cluster_class = SgeCluster
    suffix = ".qsub"
    resubmit = "qsub"
    client = "qsub"
    chain = "each job waiting for the previous one (-hold_jid)"
    runtimes = ("apptainer", "none")
    chains_jobs = True
    runs_ft_launcher = True

    # ----------------------------------------------------------------------- jobs
    def data_preparation_jobs(self, cfg: Config, run_dir: Path, num_shards: int) -> list[Job]:
        """An array job, one task per shard (task ids start at 1, shards at 0), then a one-task check of every
        shard (-hold_jid on the array)."""
        cluster = self.cluster_of(cfg)
        name = cfg.data_preparation.name
        container = self.container_wrapper(cfg)
        prep = commands.data_prep_command(run_dir, shard='"$((SGE_TASK_ID - 1))"')
        check = shlex.join(commands.data_check_command(run_dir))
        job = cfg.data_preparation.job
        return [
            self.job(
                "data_preparation",
                f"Data preparation ({name}): one array task per shard ({num_shards} shards)",
                [commands.shell_line([], prep, container)],
                path_first=bare_path(cluster),
                array_size=num_shards,
                max_parallel=job.max_parallel,
                cpus_per_task=job.cpus_per_task,
                time_limit=job.time_limit,
            ),
            self.job(
                "data_check",
                f"Check every prepared shard ({num_shards}) before training starts",
                [commands.shell_line([], check, container)],
                path_first=bare_path(cluster),
                time_limit=job.time_limit,
            ),
        ]

    def export_job(self, cfg: Config, run_dir: Path) -> Job:
        """One process on one node, where the checkpoint is (CPU work)."""
        export = shlex.join(commands.export_hf_command(cfg.training.checkpoint, run_dir))
        return self.job(
            "export",
            export_title(run_dir),
            [commands.shell_line([], export, self.container_wrapper(cfg))],
            path_first=bare_path(self.cluster_of(cfg)),
        )

    def evaluation_job(self, cfg: Config, run_dir: Path) -> Job:
        """One process on one node with its GPUs: lm-eval shards the model over them."""
        env = evaluation_env(cfg)
        harness = shlex.join(commands.harness_command(run_dir))
        return self.job(
            "evaluation",
            evaluation_title(cfg, run_dir),
            [commands.shell_line([], harness, self.container_wrapper(cfg, env))],
            env=env,
            path_first=bare_path(self.cluster_of(cfg)),
            gpus_per_node=cfg.cluster.gpus_per_node,
            time_limit=cfg.evaluation.time_limit,
        )

    def training_job(
        self, cfg: Config, plan: Plan, run_dir: Path, entry: list[str], stage: str = "training"
    ) -> tuple[Job, str]:
        """mpirun starts one rank per GPU on the hosts Grid Engine gave the job; ranks come from the MPI
        launcher's variables (OMPI_COMM_WORLD_RANK / _LOCAL_RANK / _SIZE). The job ends with the report."""
        cluster = self.cluster_of(cfg)
        if (
            plan.num_nodes > 1
            and ("training" in cfg.stages or stage != "training")
            and not (cluster.node_resource or cluster.parallel_environment)
        ):
            raise PlanError(
                [
                    f"cluster=sge: the training job needs {plan.num_nodes} nodes but neither "
                    "cluster.node_resource (TSUBAME: node_f) nor cluster.parallel_environment requests "
                    "them"
                ]
            )
        in_job, chained = cfg.resilience.in_job_restarts, cfg.resilience.job_restarts
        exported = ["PYTHONPATH", "PATH", *plan.env, "MASTER_ADDR", "MASTER_PORT"]
        # With resilience.in_job_restarts mpirun starts one ft_launcher per node, which starts the node's ranks.
        processes, per_node = (plan.num_nodes, 1) if in_job else (plan.num_gpus, plan.gpus_per_node)
        mpirun = [
            ["mpirun", "-np", str(processes), "-npernode", str(per_node)],
            ["--bind-to", "none"],
            *[["-x", key] for key in exported],
            *[shlex.split(str(a)) for a in cluster.mpirun_args],
        ]
        container = self.container_wrapper(cfg, plan.env)
        groups = [*mpirun, *([container[:2], *[[a] for a in container[2:]]] if container else [])]
        if in_job:
            program = commands.ft_launch_command(
                cfg, run_dir, entry, plan.num_nodes, plan.gpus_per_node, ("$MASTER_ADDR:$MASTER_PORT", "$JOB_ID")
            )
            ranks = [
                "# sharing a node never collide. One ft_launcher per node (nvidia-resiliency-ext's torchrun) "
                "starts that node's",
                "# ranks and restarts every rank of the job after a hang or a crash (resilience.in_job_restarts); "
                "ranks come",
                "# from the RANK / LOCAL_RANK / WORLD_SIZE it sets, which win over mpirun's variables.",
            ]
        else:
            program = shlex.join(entry)
            ranks = [
                "# sharing a node never collide. Ranks come from mpirun (OMPI_COMM_WORLD_RANK / _LOCAL_RANK / _SIZE)."
            ]
        report = shlex.join(commands.report_command(run_dir))
        before: list[str] = []
        after: list[str] = []
        if chained:
            before, after = chain_lines(
                cfg,
                run_dir,
                lambda command: commands.shell_line([], command, self.container_wrapper(cfg)),
                "$JOB_ID",
                CANCEL_QUEUED,
                "-hold_jid",
            )
        lines = [
            *before,
            "# torch.distributed rendezvous on the job's first host; the port follows the job id so that jobs",
            *ranks,
            'export MASTER_ADDR=$(if [ -n "${PE_HOSTFILE:-}" ]; then head -n 1 "$PE_HOSTFILE" | cut -d " " -f 1; '
            "else hostname; fi)",
            "export MASTER_PORT=$((20000 + JOB_ID % 40000))",
            commands.grouped_line(groups, program),
            *after,
        ]
        if stage == "training":
            lines += [
                "# The throughput / MFU table (into this log) and the loss and step-time plot (into the run "
                "directory).",
                commands.shell_line([], report, self.container_wrapper(cfg)) + REPORT_FALLBACK,
            ]
        margin = cluster.signal_before_timeout_s
        how = "mpirun, ft_launcher on every node" if in_job else "mpirun, one rank per GPU"
        job = self.job(
            stage,
            training_title(plan, how),
            lines,
            env=dict(plan.env),
            path_first=bare_path(cluster),
            nodes=plan.num_nodes,
            ntasks_per_node=plan.gpus_per_node,
            gpus_per_node=plan.gpus_per_node,
            signal=f"USR1@{margin}" if margin else None,
            restarts=chained,
        )
        return job, " ".join([*(shlex.join(g) for g in groups), program])

    # ----------------------------------------------------------------------- the job script
    def render_script(self, job: Job, cfg: Config, run_dir: Path) -> str:
        """#$ directives from the job's resources and the cluster's settings; output and errors go to one log in
        RUN_DIR/logs/. Modules load before `set -u`, which many module scripts do not survive."""
        cluster = self.cluster_of(cfg)
        setup = [str(line) for line in cluster.setup]
        modules = [f"module load {m}" for m in cluster.modules]
        return "\n".join(
            [
                "#!/bin/bash",
                *self.header_lines(job, run_dir),
                *[f"#$ {d}" for d in _directives(job, cluster, run_dir)],
                *setup,
                *modules,
                "set -euo pipefail",
                *_traps(job),
                *self.env_lines(job),
                "",
                *job.lines,
                "",
            ]
        )

    # ----------------------------------------------------------------------- submission
    def chain_as_shell(self, jobs: list[Job], run_dir: Path, cfg: Config) -> list[str]:
        """What submit runs, with the job ids in variables (qsub -terse prints an array job as ID.1-N:1)."""
        lines = []
        for index, (job, _) in enumerate(queued(jobs), start=1):
            command = shlex.join(qsub_command(run_dir / job.script, None))
            if index > 1:
                command = command.replace("qsub -terse ", f"qsub -terse -hold_jid $JOB{index - 1} ", 1)
            lines.append(f"JOB{index}=$({command} | cut -d. -f1)")
        return lines

    def submit(self, jobs: list[Job], run_dir: Path, cfg: Config, say: Say = print) -> list[Submitted]:
        """Each job holds on the previous one (-hold_jid, which a failure turns into never: see render_script; the
        repeats of a chained training job never exit 100, so the next one starts however it ended)."""

        def submit_one(script: Path, previous: str | None, after_any: bool) -> tuple[str, str | None]:
            return qsub(script, previous), f"hold_jid:{previous}" if previous else None

        return submit_chained(queued(jobs), run_dir, submit_one, cancel="qdel", cancelled="deleted")

    def waits_for(self, dependency: str) -> str:
        return f"-hold_jid {dependency.split(':')[1]}"

    def follow_command(self, submitted: list[Submitted]) -> str:
        return f"qstat -j {','.join(s.job_id for s in submitted)}"


def _directives(job: Job, cluster: SgeCluster, run_dir: Path) -> list[str]:
    prefix = cluster.job_name_prefix
    # Grid Engine job names take neither ':' nor '/'.
    name = ".".join(p for p in (prefix, job.stage, run_dir.name) if p)
    log = f"{run_dir}/logs/{job.stage}_$JOB_ID" + ("_$TASK_ID" if job.array_size else "") + ".out"
    lines = [f"-N {name}", "-S /bin/bash", "-cwd", "-j y", f"-o {log}"]
    limit = time_seconds(job.time_limit or cluster.time_limit)
    if limit is not None:
        lines.append(f"-l h_rt={hms(limit)}")
        margin = job.signal and int(job.signal.split("@")[1])
        if margin:
            # Grid Engine sends SIGUSR1 at the soft limit: the trainer checkpoints and exits before h_rt.
            lines.append(f"-l s_rt={hms(limit - margin)}")
    if cluster.node_resource:
        lines.append(f"-l {cluster.node_resource}={job.nodes}")
    if cluster.parallel_environment:
        slots = job.nodes * (job.ntasks_per_node or 1) if job.stage == "training" else (job.cpus_per_task or 1)
        lines.append(f"-pe {cluster.parallel_environment} {slots}")
    lines += [f"-l {r}" for r in cluster.resources]
    if job.array_size:
        lines.append(f"-t 1-{job.array_size}")
        if job.max_parallel:
            lines.append(f"-tc {job.max_parallel}")
    lines += [str(a) for a in cluster.qsub_args]
    return lines


def _traps(job: Job) -> list[str]:
    lines = []
    if job.followed:
        lines += [
            "# Exit 100 on failure: Grid Engine then never starts the jobs that wait for this one (-hold_jid).",
            FAIL_HOLDS_DEPENDENTS,
        ]
    if job.signal:
        lines += [
            "# Grid Engine signals the whole job at s_rt; the shell waits for mpirun, which passes it to the ranks.",
            "trap 'echo \"SIGUSR1: the time limit is near\"' USR1",
        ]
    return lines


def qsub_command(script: Path, hold: str | None) -> list[str]:
    return ["qsub", "-terse", *(["-hold_jid", hold] if hold else []), str(script)]


def qsub(script: Path, hold: str | None) -> str:
    out = run_client(qsub_command(script, hold), f"qsub {script.name}", cwd=script.parent)
    job_id = out.strip().split(".")[0]  # -terse prints an array job as ID.1-N:1
    if not job_id.isdigit():
        raise SubmitError(f"qsub {script.name} printed no job id: {out.strip()!r}")
    return job_id


PLATFORM = Sge()
