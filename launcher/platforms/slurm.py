"""cluster.platform=slurm (cluster=bcm): sbatch scripts, one task per GPU started by srun, in a pyxis or apptainer
container or bare metal; each job waits for the previous one with afterok."""
from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any, Mapping

from common.plan import Plan
from launcher.jobs import commands
from launcher.jobs.commands import REPORT_FALLBACK, bare_path
from launcher.jobs.render import Job, render_sbatch
from launcher.jobs.submit import SubmitError, Submitted, follow_lines, run_client, submit_chained
from launcher.platforms import Platform, containers
from launcher.platforms.common import export_title, image_checks, limits_problems, preflight_title, training_title


def script_name(stage: str) -> str:
    return "submission.sbatch" if stage == "training" else f"{stage}.sbatch"


def problems(cfg: Mapping[str, Any], selected: list[str], dry_run: bool) -> tuple[list[str], list[str]]:
    cluster = cfg["cluster"]
    found = containers.runtime_problems(cluster, containers.RUNTIMES)
    if found:
        return found, []
    found, warnings = image_checks(cfg, selected, dry_run)
    found += containers.env_problems(cluster, cluster.get("env") or {})
    return found + limits_problems(cfg, selected, what="a Slurm time"), warnings


def _container(cfg: Mapping[str, Any], env: Mapping[str, str] = {}) -> list[str]:
    """`apptainer exec ... image.sif` before the command (pyxis works through srun's own flags instead)."""
    cluster = cfg["cluster"]
    if commands.in_container(cluster) and cluster["container_runtime"] == "apptainer":
        return containers.apptainer_exec(cfg, env)
    return []


def container_job(cfg: Mapping[str, Any], run_dir: Path) -> Job:
    lines, files = containers.build_lines(cfg, run_dir)
    return Job("container", script_name("container"), containers.build_title(cfg["cluster"]), lines, files=files)


def data_preparation_jobs(cfg: Mapping[str, Any], run_dir: Path, num_shards: int) -> list[Job]:
    """An array job, one task per shard, then a one-task check of every shard (afterok on the array)."""
    cluster = cfg["cluster"]
    name = cfg["data_preparation"].get("name")
    srun, container = commands.srun_prefix(cfg), _container(cfg)
    prep = commands.data_prep_command(run_dir, shard='"$SLURM_ARRAY_TASK_ID"')
    check = shlex.join(commands.data_check_command(run_dir))
    job = cfg["data_preparation"].get("job") or {}
    cpus = job.get("cpus_per_task")
    return [
        Job("data_preparation", script_name("data_preparation"),
            f"Data preparation ({name}): one array task per shard ({num_shards} shards)",
            [commands.shell_line(srun, prep, container)], path_first=bare_path(cluster), array_size=num_shards,
            max_parallel=job.get("max_parallel"), cpus_per_task=cpus,
            # Tokenizer workers use every CPU they get: a whole node per task unless sized.
            exclusive=bool(cluster.get("exclusive")) and not cpus, time_limit=job.get("time_limit")),
        Job("data_check", script_name("data_check"),
            f"Check every prepared shard ({num_shards}) before training starts",
            [commands.shell_line(srun, check, container)], path_first=bare_path(cluster),
            time_limit=job.get("time_limit")),
    ]


RENDEZVOUS = [
    "# torch.distributed rendezvous on the first node; the port follows the job id so that jobs sharing",
    "# a node never collide. Ranks come from SLURM_PROCID / SLURM_LOCALID / SLURM_NTASKS.",
    'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
    "export MASTER_PORT=$((20000 + SLURM_JOB_ID % 40000))",
]


def _every_rank(cfg: Mapping[str, Any], plan: Plan, mpi: bool) -> list[str]:
    return commands.srun_prefix(cfg, env_keys=[*plan.env, "MASTER_ADDR", "MASTER_PORT"], mpi=mpi,
                                extra=["--kill-on-bad-exit=1"])


def _job_shape(cluster: Mapping[str, Any], plan: Plan) -> dict[str, Any]:
    """One task per GPU on the plan's nodes: training and the preflight, which measures the same layout."""
    return dict(env=dict(plan.env), path_first=bare_path(cluster), nodes=plan.num_nodes,
                ntasks_per_node=plan.gpus_per_node,
                gpus_per_node=plan.gpus_per_node if cluster.get("gpus_per_node") else None,
                exclusive=bool(cluster.get("exclusive")))


def training_job(cfg: Mapping[str, Any], plan: Plan, run_dir: Path, entry: list[str]) -> tuple[Job, str]:
    """srun starts one task per GPU; ranks come from SLURM_PROCID / SLURM_LOCALID / SLURM_NTASKS. The job ends
    with the report."""
    cluster = cfg["cluster"]
    srun = _every_rank(cfg, plan, mpi=plan.tp_comm_overlap)
    container = _container(cfg, plan.env)
    program = shlex.join(entry)
    report = shlex.join(commands.report_command(run_dir))
    report_srun = commands.srun_prefix(cfg, extra=["--nodes=1", "--ntasks=1"])
    lines = [
        *RENDEZVOUS,
        commands.shell_line(srun, program, container),
        "# The throughput / MFU table (into this log) and the loss and step-time plot (into the run directory).",
        commands.shell_line(report_srun, report, _container(cfg)) + REPORT_FALLBACK,
    ]
    margin = cluster.get("signal_before_timeout_s")
    job = Job("training", script_name("training"), training_title(plan, "one task per GPU"), lines,
              signal=f"USR1@{margin}" if margin else None, **_job_shape(cluster, plan))
    return job, " ".join([shlex.join(srun), *([shlex.join(container)] if container else []), program])


def export_job(cfg: Mapping[str, Any], run_dir: Path) -> Job:
    """One task on one node, where the checkpoint is (CPU work)."""
    cluster = cfg["cluster"]
    srun = commands.srun_prefix(cfg, extra=["--nodes=1", "--ntasks=1"])
    line = commands.shell_line(srun, shlex.join(commands.export_hf_command(cfg, run_dir)), _container(cfg))
    return Job("export", script_name("export"), export_title(run_dir), [line], path_first=bare_path(cluster),
               exclusive=bool(cluster.get("exclusive")))


def preflight_job(cfg: Mapping[str, Any], plan: Plan, run_dir: Path) -> Job:
    """The training job's nodes and tasks running recipes.preflight; afterok stops the chain when it fails."""
    srun = _every_rank(cfg, plan, mpi=False)
    line = commands.shell_line(srun, shlex.join(commands.preflight_entry(run_dir)), _container(cfg, plan.env))
    return Job("preflight", script_name("preflight"), preflight_title(plan), [*RENDEZVOUS, line],
               time_limit=cfg["preflight"].get("time_limit"), **_job_shape(cfg["cluster"], plan))


def render(job: Job, cfg: Mapping[str, Any], run_dir: Path) -> dict[str, str]:
    return {job.script: render_sbatch(job, cfg["cluster"], run_dir), **job.files}


# --------------------------------------------------------------------------- submission
def sbatch_command(script: Path, dependency: str | None) -> list[str]:
    cmd = ["sbatch", "--parsable"]
    if dependency:
        cmd.append(f"--dependency={dependency}")
    cmd.append(str(script))
    return cmd


def chain_as_shell(jobs: list[Job], run_dir: Path, cfg: Mapping[str, Any]) -> list[str]:
    """What submit runs, as shell lines with the job ids in variables."""
    lines = []
    for index, job in enumerate(jobs, start=1):
        dependency = f"afterok:$JOB{index - 1}" if index > 1 else None
        # The script's path is quoted; the dependency stays unquoted so the shell expands $JOB<n>.
        command = sbatch_command(run_dir / job.script, dependency)
        lines.append(f"JOB{index}=$({' '.join(command[:-1])} {shlex.quote(command[-1])})")
    return lines


def sbatch(script: Path, dependency: str | None) -> str:
    out = run_client(sbatch_command(script, dependency), f"sbatch {script.name}")
    job_id = out.strip().split(";")[0]  # --parsable prints "jobid" or "jobid;cluster"
    if not job_id.isdigit():
        raise SubmitError(f"sbatch {script.name} printed no job id: {out.strip()!r}")
    return job_id


def submit(jobs: list[Job], run_dir: Path, cfg: Mapping[str, Any], say: Any = print) -> list[Submitted]:
    """Each job waits for the previous one with afterok (never singleton: names are not dependencies)."""
    def submit_one(script: Path, previous: str | None) -> tuple[str, str | None]:
        dependency = f"afterok:{previous}" if previous else None
        return sbatch(script, dependency), dependency

    return submit_chained(jobs, run_dir, submit_one, cancel="scancel", cancelled="cancelled")


def follow(jobs: list[Job], submitted: list[Submitted], run_dir: Path) -> list[str]:
    return follow_lines(jobs, submitted, run_dir, lambda dependency: f"--dependency={dependency}", "squeue -j")


PLATFORM = Platform(
    name="slurm", client="sbatch", chain="each job waiting for the previous one (afterok)", script_name=script_name,
    problems=problems, data_preparation_jobs=data_preparation_jobs, training_job=training_job, render=render,
    container_job=container_job, submit=submit, chain_as_shell=chain_as_shell, follow=follow,
    export_job=export_job, preflight_job=preflight_job, rank_variable="SLURM_PROCID",
)
