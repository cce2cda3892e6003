"""cluster=local: the stages as bash scripts run one after another on this machine; training with torchrun over
its GPUs, with the Python that runs main.py."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Sequence

from common.config import Config, LocalCluster
from common.plan import Plan
from launcher.jobs import commands
from launcher.jobs.commands import REPO, REPORT_FALLBACK, bare_path
from launcher.jobs.render import KEEP_LOG, Job, tee
from launcher.platforms import containers
from launcher.platforms.base import Platform, evaluation_env, evaluation_title, export_title, gpus, preflight_title


class Local(Platform[LocalCluster]):
    name = "local"
    cluster_class = LocalCluster
    suffix = ".sh"
    resubmit = "bash"
    # Jobs here never run in a container; only the container stage reads the runtime, to build with it.
    runtimes = ("pyxis", "apptainer")
    rank_variable = "RANK"  # torchrun's
    runs_ft_launcher = True
    no_job_chain = (
        "nothing here stops a run at a time limit, and a failed run is started again with the same "
        "command; resilience.in_job_restarts restarts the ranks after a hang or a crash"
    )

    def script_name(self, stage: str) -> str:
        return "launch.sh" if stage == "training" else super().script_name(stage)

    def problems(self, cfg: Config, selected: Sequence[str], dry_run: bool) -> tuple[list[str], list[str]]:
        if "container" in selected:
            return containers.runtime_problems(self.cluster_of(cfg), self.runtimes), []
        return [], []

    def container_job(self, cfg: Config, run_dir: Path) -> Job:
        job = super().container_job(cfg, run_dir)
        job.title += " on this machine"
        return job

    def data_preparation_jobs(self, cfg: Config, run_dir: Path, num_shards: int) -> list[Job]:
        name = cfg.data_preparation.name
        log = run_dir / "logs" / "data_preparation.log"
        check = shlex.join(commands.data_check_command(run_dir))
        return [
            self.job(
                "data_preparation",
                f"Data preparation ({name}, {num_shards} shards) on this machine, then a check of every shard",
                [tee(commands.data_prep_command(run_dir), log), tee(check, log)],
                path_first=bare_path(self.cluster_of(cfg)),
            )
        ]

    def training_job(
        self, cfg: Config, plan: Plan, run_dir: Path, entry: list[str], stage: str = "training"
    ) -> tuple[Job, str]:
        """The stack check, then torchrun over this machine's GPUs (ft_launcher with resilience.in_job_restarts);
        the job ends with the report."""
        if cfg.resilience.in_job_restarts:
            command = commands.ft_launch_command(cfg, run_dir, entry, 1, plan.num_gpus)
        else:
            command = shlex.join(commands.torchrun_command(plan.num_gpus, run_dir, entry))
        report = shlex.join(commands.report_command(run_dir))
        log = run_dir / "logs" / f"{stage}.log"
        lines = [
            "# The training stack (conf/stack.yaml) first: one line and exit status 2 on a mismatch.",
            tee(shlex.join(commands.stack_check_command(run_dir)), log),
            tee(command, log),
        ]
        if stage == "training":
            lines += [
                "# The throughput / MFU table and the loss and step-time plot of this run.",
                tee(report, run_dir / "logs" / "report.txt", append=False) + REPORT_FALLBACK,
            ]
        return self.job(
            stage,
            f"Train {plan.model} ({plan.dtype}) on {gpus(plan.num_gpus)} of this machine",
            lines,
            env=dict(plan.env),
            path_first=bare_path(self.cluster_of(cfg)),
        ), command

    def preflight_job(self, cfg: Config, plan: Plan, run_dir: Path) -> Job:
        """torchrun over the training job's GPUs running recipes.preflight: a non-zero exit below
        preflight.min_busbw_gbps stops the stages before training."""
        command = shlex.join(commands.torchrun_command(plan.num_gpus, run_dir, commands.preflight_entry(run_dir)))
        return self.job(
            "preflight",
            preflight_title(plan),
            [tee(command, run_dir / "logs" / "preflight.log")],
            env=dict(plan.env),
            path_first=bare_path(self.cluster_of(cfg)),
        )

    def export_job(self, cfg: Config, run_dir: Path) -> Job:
        export = shlex.join(commands.export_hf_command(cfg.training.checkpoint, run_dir))
        return self.job(
            "export",
            export_title(run_dir),
            [tee(export, run_dir / "logs" / "export.log")],
            path_first=bare_path(self.cluster_of(cfg)),
        )

    def evaluation_job(self, cfg: Config, run_dir: Path) -> Job:
        """lm-eval over this machine's GPUs, the model sharded over them."""
        harness = shlex.join(commands.harness_command(run_dir))
        return self.job(
            "evaluation",
            evaluation_title(cfg, run_dir),
            [tee(harness, run_dir / "logs" / "evaluation.log")],
            env=evaluation_env(cfg),
            path_first=bare_path(self.cluster_of(cfg)),
        )

    def render_script(self, job: Job, cfg: Config, run_dir: Path) -> str:
        """A bash script run from the repository; its commands tee their output into the run's logs."""
        return "\n".join(
            [
                "#!/usr/bin/env bash",
                *self.header_lines(job, run_dir),
                "set -euo pipefail",
                KEEP_LOG,
                f"cd {shlex.quote(str(REPO))}",
                *self.env_lines(job),
                "",
                *job.lines,
                "",
            ]
        )


PLATFORM = Local()
