"""The tasks' data, prepared on a machine with internet (a login node) into a directory the evaluation job reads
with the hub off: each task is built once by lm-eval with the datasets cache pointed there, which downloads what
it loads, and recorded in DIR/fetched.json, which the plan reads to refuse a task whose data is missing. Tasks
already recorded are skipped (a re-run after a failure continues); --dry-run prints what would be fetched."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Callable

from common import lm_eval_index
from common.evaluation import FETCH_COMMAND, FETCHED, fetched_tasks
from common.files import atomic_write


class FetchError(ValueError):
    """One line naming what is wrong and the fix."""


@dataclass
class Planned:
    task: str
    source: str  # the hub data set it loads, where the index says
    fetched: bool


def _task_manager(include_path: str | None):
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=include_path or None)


def plan_fetch(tasks: list[str], data_dir: str, include_path: str | None = None) -> list[Planned]:
    """What fetching `tasks` into data_dir does, one entry per task, in order, from lm-eval's task files
    (common/lm_eval_index.py). Raises FetchError for a name lm-eval does not know, nothing fetched."""
    if not tasks:
        raise FetchError("fetch: no tasks; name them with --tasks lambada_openai,boolq,...")
    index = lm_eval_index.known(include_path)
    if index is None:
        raise FetchError("fetch: lm-eval is not installed here: pip install 'lm-eval[hf]==0.4.13'")
    unknown = [t for t in tasks if t not in index]
    if unknown:
        raise FetchError(
            f"fetch: unknown lm-eval task{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}: see `lm_eval ls "
            "tasks` for the names (a task of your own: --include-path DIR)"
        )
    done = fetched_tasks(data_dir)
    planned = []
    for task in tasks:
        source = lm_eval_index.dataset_of(index[task])
        planned.append(Planned(task, source or "its member tasks' data sets", task in done))
    return planned


def fetch(
    tasks: list[str],
    data_dir: str,
    include_path: str | None = None,
    dry_run: bool = False,
    force: bool = False,
    say: Callable[[str], None] = print,
) -> list[Planned]:
    """Fetch the tasks' data into data_dir (or, with dry_run, print the plan and write nothing)."""
    data_dir = os.path.abspath(os.path.expanduser(data_dir))
    planned = plan_fetch(tasks, data_dir, include_path)
    todo = [p for p in planned if force or not p.fetched]
    say(f"fetch into {data_dir}: {len(todo)} of {len(planned)} tasks to fetch")
    for p in planned:
        state = "fetch" if p in todo else "already fetched"
        say(f"  {p.task:<24} {p.source:<48} {state}")
    if dry_run:
        say("dry run: nothing was downloaded or written")
        return planned
    os.makedirs(data_dir, exist_ok=True)
    os.environ["HF_DATASETS_CACHE"] = os.path.join(data_dir, "datasets")
    os.environ.pop("HF_DATASETS_OFFLINE", None)
    os.environ.pop("HF_HUB_OFFLINE", None)
    manager = _task_manager(include_path)
    for number, p in enumerate(todo, start=1):
        start = time.perf_counter()
        say(f"[{number}/{len(todo)}] {p.task} ...")
        manager.load_task_or_group([p.task])  # builds the task: its data sets are downloaded into the cache
        _record(data_dir, p.task)
        say(f"[{number}/{len(todo)}] {p.task} fetched in {time.perf_counter() - start:.0f} s")
    say(f"done: set evaluation.data_dir={data_dir} (the evaluation job reads it with the hub off)")
    return planned


def _record(data_dir: str, task: str) -> None:
    path = os.path.join(data_dir, FETCHED)
    try:
        with open(path) as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        manifest = {}
    manifest.setdefault("tasks", {})[task] = {"fetched_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
    atomic_write(path, json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def command(tasks: list[str], data_dir: str) -> str:
    """The fetch command line for these tasks, as the plan's errors print it."""
    return f"{FETCH_COMMAND} --tasks {','.join(tasks)} --data-dir {data_dir}"
