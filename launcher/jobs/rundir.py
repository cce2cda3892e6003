"""The run directory: config.yaml (fully resolved), plan.json, the rendered jobs (and the files they read), logs/,
jobs.json."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import yaml

from common.config import BcpCluster, Config, ContainerCluster, K8sCluster, LocalCluster, PeftMethod
from common.files import atomic_write
from common.plan import Plan
from common.typed import to_plain
from launcher.jobs.render import Job


class JobRenderer(Protocol):
    """What writes a job's files: the cluster's platform (launcher/platforms/), which the caller passes in, the
    platforms standing above the jobs."""

    def render(self, job: Job, cfg: Config, run_dir: Path) -> dict[str, str]:
        """File name -> text: the job's own file first, then the files it reads."""
        ...


def default_run_name(cfg: Config) -> str:
    """The run directory's name when run_name is null, from what the selected stages produce, so that runs of
    different things never meet in one directory: `<model>_<dtype>_<layout>_<N>gpu` for training (and the stages
    that go with it; `<model>_lora_...` for LoRA), `data_<source>` for data preparation alone,
    `data_<source>_<output directory's name>` where that differs from the source (the data set it makes: C4 and
    MLPerf's C4 files never share one), `eval_<directory>` for the evaluation of a Hugging Face directory alone
    (evaluation.model), `container_<image>` for the image build alone."""
    stages = set(cfg.stages)
    if stages == {"evaluation"} and cfg.evaluation.model:
        return "eval_" + re.sub(r"[^A-Za-z0-9._=+-]", "-", Path(cfg.evaluation.model).name or "model")
    if stages & {"training", "preflight", "export", "evaluation"}:
        par = cfg.parallelism
        # A fine-tuning run never shares (and resumes from) the directory of the pretraining run of its layout.
        model = cfg.training.name if cfg.peft.method == PeftMethod.none else f"{cfg.training.name}_{cfg.peft.method}"
        return f"{model}_{cfg.dtype.name}_{par.name}_{par.num_gpus}gpu"
    if "data_preparation" in stages:
        source, output = cfg.data_preparation.name, Path(cfg.data_preparation.output_dir).name
        return "data_" + re.sub(r"[^A-Za-z0-9._=+-]", "-", source if output == source else f"{source}_{output}")
    cluster = cfg.cluster
    named = cluster.container if isinstance(cluster, (LocalCluster, ContainerCluster, BcpCluster, K8sCluster)) else None
    image = Path(str(named or "image"))
    return "container_" + re.sub(r"[^A-Za-z0-9._=+-]", "-", image.name.removesuffix(image.suffix))


def run_dir_of(cfg: Config) -> Path:
    return Path(cfg.results_dir).expanduser().absolute() / str(cfg.run_name)


def config_yaml(cfg: Config) -> str:
    # libyaml's emitter where PyYAML has it: the same text, five times faster (once per run, per sweep point).
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return yaml.dump(to_plain(cfg), Dumper=dumper, sort_keys=False, default_flow_style=False)


# The job files this directory's last invocation wrote, so the next one knows which of them are its own.
JOB_FILES = ".job_files.json"
HISTORY = "history"


@dataclass
class Written:
    scripts: list[Path]  # the job scripts, in order
    retired: list[str]  # earlier job files this invocation did not write again, moved to `history`
    history: Path | None  # where they went, with the config.yaml and plan.json they were written with


def write_run_dir(run_dir: Path, cfg: Config, plan: Plan, jobs: list[Job], renderer: JobRenderer) -> Written:
    """Everything the jobs read, each job's files as `renderer` (its platform) writes them. The job files of an
    earlier invocation that this one does not write (another platform's, a stage not selected now) move under
    history/, so the directory shows only this run's jobs."""
    files = {name: text for job in jobs for name, text in renderer.render(job, cfg, run_dir).items()}
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    retired, history = _retire_earlier_jobs(run_dir, set(files))
    atomic_write(run_dir / "config.yaml", config_yaml(cfg))
    atomic_write(run_dir / "plan.json", json.dumps(plan.to_json_dict(), indent=2) + "\n")
    for name, text in files.items():
        atomic_write(run_dir / name, text, mode=0o755 if name.endswith((".sh", ".sbatch", ".qsub")) else 0o644)
    atomic_write(run_dir / JOB_FILES, json.dumps(sorted(files)) + "\n")
    return Written([run_dir / job.script for job in jobs], retired, history)


def _retire_earlier_jobs(run_dir: Path, writing: set[str]) -> tuple[list[str], Path | None]:
    """Move the earlier invocation's job files that are not written again into history/<time>/, beside copies of
    the config.yaml and plan.json they belong to."""
    try:
        earlier = json.loads((run_dir / JOB_FILES).read_text())
    except (OSError, ValueError):
        earlier = []
    stale = sorted(name for name in earlier if name not in writing and (run_dir / name).is_file())
    if not stale:
        return [], None
    history = run_dir / HISTORY / time.strftime("%Y%m%d-%H%M%S")
    while history.exists():  # two invocations in one second
        history = history.with_name(history.name + "+")
    history.mkdir(parents=True)
    for name in ("config.yaml", "plan.json"):
        if (run_dir / name).is_file():
            shutil.copy2(run_dir / name, history / name)
    for name in stale:
        os.replace(run_dir / name, history / name)
    return stale, history


def record_jobs(run_dir: Path, submitted: list[dict[str, Any]]) -> None:
    """Append this submission's job ids to jobs.json (a resubmitted run keeps its history)."""
    path = run_dir / "jobs.json"
    history = json.loads(path.read_text()) if path.exists() else []
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    history += [{**entry, "submitted_at": stamp} for entry in submitted]
    atomic_write(path, json.dumps(history, indent=2) + "\n")
