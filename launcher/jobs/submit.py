"""Submission records, the two ways a chain of jobs is submitted (each queued waiting for the one before, or each
submitted from here once the one before succeeded), and the stages run one after another on this machine (each
platform's own client calls live in launcher/platforms/)."""

from __future__ import annotations

import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from launcher.jobs.render import Job


class SubmitError(RuntimeError):
    def __init__(self, message: str, submitted: list["Submitted"] | None = None):
        super().__init__(message)
        self.submitted = submitted or []  # jobs submitted before the error, still to be recorded


@dataclass
class Submitted:
    stage: str
    job_id: str
    script: str
    dependency: str | None

    def as_dict(self) -> dict[str, str | None]:
        return {"stage": self.stage, "job_id": self.job_id, "script": self.script, "dependency": self.dependency}


def run_client(cmd: list[str], what: str, cwd: Path | None = None) -> str:
    """A platform client's command; its output, or SubmitError with what it printed."""
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
    if proc.returncode != 0:
        raise SubmitError(f"{what} failed: {(proc.stderr or proc.stdout).strip()}")
    return proc.stdout


def submit_chained(
    jobs: list[tuple[Job, bool]],
    run_dir: Path,
    submit_one: Callable[[Path, str | None, bool], tuple[str, str | None]],
    cancel: str,
    cancelled: str,
) -> list[Submitted]:
    """For schedulers whose jobs wait for each other: submit_one(script, previous job id, after_any) queues a job
    waiting for the previous one (to succeed, or with after_any to end however it ended: the repeats of a chained
    training job) and returns (job id, its dependency as recorded). If a later submission fails, the jobs
    already queued are removed with `cancel` so no half chain runs."""
    submitted: list[Submitted] = []
    for job, after_any in jobs:
        previous = submitted[-1].job_id if submitted else None
        try:
            job_id, dependency = submit_one(run_dir / job.script, previous, after_any)
        except SubmitError as err:
            if submitted:
                ids = [s.job_id for s in submitted]
                subprocess.run([cancel, *ids], capture_output=True, text=True)
                raise SubmitError(f"{err}; {cancelled} the jobs already queued for this run: {', '.join(ids)}") from err
            raise
        submitted.append(Submitted(job.stage, job_id, str(run_dir / job.script), dependency))
    return submitted


def submit_in_order(
    jobs: list[Job],
    run_dir: Path,
    submit_one: Callable[[Job, str | None], str],
    wait_one: Callable[[Job, str], str | None],
    say: Callable[[str], None] = print,
) -> list[Submitted]:
    """For platforms without job dependencies: submit each job once the one before it has succeeded, waiting
    here. submit_one(job, previous_id) returns the new job id; wait_one(job, job_id) returns None on success or
    why it did not succeed. A failure (or Ctrl-C while waiting) stops the chain: later jobs are not submitted."""
    submitted: list[Submitted] = []
    for index, job in enumerate(jobs):
        previous = submitted[-1].job_id if submitted else None
        try:
            job_id = submit_one(job, previous)
        except SubmitError as err:
            raise SubmitError(str(err), submitted=submitted) from err
        submitted.append(
            Submitted(job.stage, job_id, str(run_dir / job.script), f"succeeded:{previous}" if previous else None)
        )
        if index == len(jobs) - 1:
            break
        rest = ", ".join(j.stage for j in jobs[index + 1 :])
        say(
            f"submitted {job.stage}: job {job_id}; waiting for it to succeed before submitting {rest} "
            "(Ctrl-C stops waiting; the job keeps running)"
        )
        try:
            failure = wait_one(job, job_id)
        except KeyboardInterrupt:
            failure = "is still running: stopped waiting (Ctrl-C)"
        if failure:
            raise SubmitError(f"{job.stage} (job {job_id}) {failure}; not submitted: {rest}", submitted=submitted)
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
            # Only reporting and exiting is left: more Ctrl-C would only cut that short with a traceback.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            say(f"stage {job.stage} stopped; run it again with: bash {script}")
            return 130
        if code != 0:
            say(f"error: stage {job.stage} failed with exit status {code}; log in {run_dir / 'logs'}")
            return code
    return 0
