"""Submission: a chain of sbatch jobs linked by afterok, or the same stages run one after another here."""
from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from launcher.render import Job



class SubmitError(RuntimeError):
    pass


@dataclass
class Submitted:
    stage: str
    job_id: str
    script: str
    dependency: str | None

    def as_dict(self) -> dict[str, str | None]:
        return {"stage": self.stage, "job_id": self.job_id, "script": self.script, "dependency": self.dependency}


def sbatch_command(script: Path, dependency: str | None) -> list[str]:
    cmd = ["sbatch", "--parsable"]
    if dependency:
        cmd.append(f"--dependency={dependency}")
    cmd.append(str(script))
    return cmd


def chain_as_shell(jobs: list[Job], run_dir: Path) -> list[str]:
    """What submit_chain runs, as shell lines with the job ids in variables (shown by a dry run, and a way to
    submit the chain by hand)."""
    lines = []
    for index, job in enumerate(jobs, start=1):
        dependency = f"afterok:$JOB{index - 1}" if index > 1 else None
        lines.append(f"JOB{index}=$({' '.join(sbatch_command(run_dir / job.script, dependency))})")
    return lines


def sbatch(script: Path, dependency: str | None) -> str:
    proc = subprocess.run(sbatch_command(script, dependency), capture_output=True, text=True)
    if proc.returncode != 0:
        raise SubmitError(f"sbatch {script.name} failed: {(proc.stderr or proc.stdout).strip()}")
    # --parsable prints "jobid" or "jobid;cluster"
    job_id = proc.stdout.strip().split(";")[0]
    if not job_id.isdigit():
        raise SubmitError(f"sbatch {script.name} printed no job id: {proc.stdout.strip()!r}")
    return job_id


def submit_chain(jobs: list[Job], run_dir: Path) -> list[Submitted]:
    """Each job waits for the previous one with afterok (never singleton: names are not dependencies).
    If a later sbatch fails, the jobs already queued are cancelled so no half chain runs."""
    submitted: list[Submitted] = []
    for job in jobs:
        dependency = f"afterok:{submitted[-1].job_id}" if submitted else None
        try:
            job_id = sbatch(run_dir / job.script, dependency)
        except SubmitError as err:
            if submitted:
                ids = [s.job_id for s in submitted]
                subprocess.run(["scancel", *ids], capture_output=True, text=True)
                raise SubmitError(f"{err}; cancelled the jobs already queued for this run: {', '.join(ids)}") from err
            raise
        submitted.append(Submitted(job.stage, job_id, str(run_dir / job.script), dependency))
    return submitted


def run_here(jobs: list[Job], run_dir: Path, say: Callable[[str], None] = print) -> int:
    """Run the stages' scripts on this machine in order, output streaming to the console (the scripts tee it
    into logs/). Returns the first non-zero exit status, or 0."""
    for job in jobs:
        script = run_dir / job.script
        say(f"==> {job.stage}: bash {script}")
        proc = subprocess.Popen(["bash", str(script)])
        try:
            code = proc.wait()
        except KeyboardInterrupt:
            # The stage got the same Ctrl-C and stops on its own (training saves a checkpoint first): wait
            # for it rather than kill it half way.
            say(f"interrupted: waiting for stage {job.stage} to stop (Ctrl-C again to kill it)")
            try:
                proc.wait()
            except KeyboardInterrupt:
                proc.kill()
                proc.wait()
            say(f"stage {job.stage} stopped; run it again with: bash {script}")
            return 130
        if code != 0:
            say(f"error: stage {job.stage} failed with exit status {code}; log in {run_dir / 'logs'}")
            return code
    return 0
