"""The run directory: config.yaml (fully resolved), plan.json, the rendered jobs (and the files they read), logs/,
jobs.json."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any, Mapping

import yaml

from common.files import atomic_write
from common.plan import Plan
from launcher.jobs.render import Job
from launcher.platforms import platform_of


def default_run_name(cfg: Mapping[str, Any]) -> str:
    """The run directory's name when run_name is null, from what the selected stages produce, so that runs of
    different things never meet in one directory: `<model>_<dtype>_<layout>_<N>gpu` for training (and the stages
    that go with it), `data_<source>` for data preparation alone, `container_<image>` for the image build alone."""
    stages = set(cfg["stages"])
    if stages & {"training", "preflight", "export"}:
        par = cfg["parallelism"]
        return f"{cfg['training']['name']}_{cfg['dtype']['name']}_{par['name']}_{par['num_gpus']}gpu"
    if "data_preparation" in stages:
        return f"data_{cfg['data_preparation']['name']}"
    image = Path(str(cfg["cluster"].get("container") or "image"))
    return "container_" + re.sub(r"[^A-Za-z0-9._=+-]", "-", image.name.removesuffix(image.suffix))


def run_dir_of(cfg: Mapping[str, Any]) -> Path:
    return Path(cfg["results_dir"]).expanduser().absolute() / cfg["run_name"]


def rendered_files(job: Job, cfg: Mapping[str, Any], run_dir: Path) -> dict[str, str]:
    """File name -> text for one job, as its platform renders it; the job's own script first."""
    return platform_of(cfg).render(job, cfg, run_dir)


def render(job: Job, cfg: Mapping[str, Any], run_dir: Path) -> str:
    """The job's own script (what is run or submitted)."""
    return rendered_files(job, cfg, run_dir)[job.script]


def config_yaml(cfg: Mapping[str, Any]) -> str:
    # libyaml's emitter where PyYAML has it: the same text, five times faster (once per run, per sweep point).
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return yaml.dump(dict(cfg), Dumper=dumper, sort_keys=False, default_flow_style=False)


def write_run_dir(run_dir: Path, cfg: Mapping[str, Any], plan: Plan, jobs: list[Job]) -> list[Path]:
    """Everything the jobs read. Returns the job scripts, in order."""
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    atomic_write(run_dir / "config.yaml", config_yaml(cfg))
    atomic_write(run_dir / "plan.json", json.dumps(plan.to_json_dict(), indent=2) + "\n")
    scripts = []
    for job in jobs:
        for name, text in rendered_files(job, cfg, run_dir).items():
            atomic_write(run_dir / name, text, mode=0o755 if name.endswith((".sh", ".sbatch", ".qsub")) else 0o644)
        scripts.append(run_dir / job.script)
    return scripts


def record_jobs(run_dir: Path, submitted: list[dict[str, Any]]) -> None:
    """Append this submission's job ids to jobs.json (a resubmitted run keeps its history)."""
    path = run_dir / "jobs.json"
    history = json.loads(path.read_text()) if path.exists() else []
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    history += [{**entry, "submitted_at": stamp} for entry in submitted]
    atomic_write(path, json.dumps(history, indent=2) + "\n")
