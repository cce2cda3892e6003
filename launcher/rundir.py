"""The run directory: config.yaml (fully resolved), plan.json, the rendered jobs, logs/, jobs.json."""
from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping

import yaml

from launcher.plan import Plan
from launcher.render import Job, render_local, render_sbatch


def run_dir_of(cfg: Mapping[str, Any]) -> Path:
    return Path(cfg["results_dir"]).expanduser().absolute() / cfg["run_name"]


def _write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """Temp file + rename: a reader (a job starting, a second launcher) never sees half a file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def render(job: Job, cfg: Mapping[str, Any], run_dir: Path) -> str:
    if cfg["cluster"]["name"] == "local":
        return render_local(job, run_dir)
    return render_sbatch(job, cfg["cluster"], run_dir)


def write_run_dir(run_dir: Path, cfg: Mapping[str, Any], plan: Plan, jobs: list[Job]) -> list[Path]:
    """Everything the jobs read. Returns the job scripts, in order."""
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    _write_atomic(run_dir / "config.yaml", yaml.safe_dump(dict(cfg), sort_keys=False, default_flow_style=False))
    _write_atomic(run_dir / "plan.json", json.dumps(plan.to_json_dict(), indent=2) + "\n")
    scripts = []
    for job in jobs:
        path = run_dir / job.script
        _write_atomic(path, render(job, cfg, run_dir), mode=0o755)
        scripts.append(path)
    return scripts


def record_jobs(run_dir: Path, submitted: list[dict[str, Any]]) -> None:
    """Append this submission's job ids to jobs.json (a resubmitted run keeps its history)."""
    path = run_dir / "jobs.json"
    history = json.loads(path.read_text()) if path.exists() else []
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    history += [{**entry, "submitted_at": stamp} for entry in submitted]
    _write_atomic(path, json.dumps(history, indent=2) + "\n")
