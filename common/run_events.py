"""RUN/events.jsonl: what happened to a run over its jobs and restarts, one JSON object per line, appended by the
trainer (its last rank), by each job of a chain before it trains (common/job_chain.py) and by main.py when it
submits a chain. The report reads it back into the table of restarts (launcher/report/restarts.py). Plain Python:
both sides and the job scripts' check use it.

Every record has `event` and `time` (seconds since the epoch); the events and their other fields:

    chain      main.py submitted a chain of `jobs` jobs (resilience.job_restarts + 1)
    job        a job of the chain began: `job_id`, `checkpoint_step` (newest complete checkpoint, -1: none),
               `decision` (train | finished | stop) and `reason` when it does not train
    start      a training process began (the first one of a job, or one restarted in the job by ft_launcher):
               `job_id`, `cycle` (ft_launcher's restart count), `process_start`, `resumed_step`, and what the
               process before it left: `last_step` and `last_step_time` (its newest logged step and when)
    recovered  the restarted process is back at `step`, the step the one before it had reached
    checkpoint a checkpoint of `step` is complete: `blocking_s` (what the save held training for), `async`,
               `complete_s` (from the save's start to the checkpoint being complete)
    stop       training stopped on a stop signal (`signal`) at `step` after saving
    end        training ended at `step`: `finished` (train_steps or the validation target) or not (`reason`,
               e.g. diverged)
    error      a rank raised `message` at `step` (it then exits, and the launcher restarts or ends the job)
    fault      an injected fault (resilience.inject_fault): `kind`, `rank`, `step`
    straggler  a straggler report named ranks below the threshold: `step`, `ranks` [[rank, node, gpu, score]]
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

EVENTS_FILE = "events.jsonl"


def events_path(run_dir: str) -> str:
    return os.path.join(run_dir, EVENTS_FILE)


def record(run_dir: str, event: str, **fields: Any) -> dict[str, Any]:
    """Append one event. One write of one line in append mode: lines from the trainer, a job's check and main.py
    never interleave; fsync'd, because the process that writes it may be killed a moment later."""
    entry = {"event": event, "time": round(time.time(), 3), **fields}
    fd = os.open(events_path(run_dir), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(entry) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    return entry


def read(run_dir: str) -> list[dict[str, Any]]:
    """Every event, in the order written; a line cut by a crash is skipped."""
    path = events_path(run_dir)
    if not os.path.exists(path):
        return []
    events = []
    with open(path) as f:
        for line in f:
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict) and "event" in entry:
                events.append(entry)
    return events
