"""How much one evaluation reads and how it splits into pipeline-schedule calls: the plan checks it, the trainer and
the MLPerf log use it."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Optional

from common.config import TrainingConfig
from common.files import atomic_write


def eval_samples(train: TrainingConfig, global_batch_size: int) -> int:
    """Sequences per evaluation: training.val_samples, else val_steps global batches."""
    return train.val_samples or train.val_steps * global_batch_size


def eval_microbatches(samples: int, micro_batch_size: int, dp_size: int, per_call: int) -> list[int]:
    """Microbatches per data-parallel rank for each pipeline-schedule call of one evaluation: calls as large as
    a training step's, the last one taking the rest (the plan checked that samples split into microbatches)."""
    total = samples // (micro_batch_size * dp_size)
    return [per_call] * (total // per_call) + ([total % per_call] if total % per_call else [])


# --------------------------------------------------------------------------- the evaluation stage's files
# Under the run directory (or, for evaluation.model alone, the evaluation's own run directory):
RESULTS_DIR = "evaluation"
# One EvalRow a line, as a JSON object; the report prints them.
TASK_ROWS = "tasks.jsonl"  # lm-eval's tasks (and the held-out perplexity task)
BLEND_ROWS = "blends.jsonl"  # the in-framework loss of evaluation.blends
# lm-eval's own results JSON, as it wrote it.
HARNESS_RESULTS = "lm_eval_results.json"
# The held-out perplexity task's name in lm-eval and in the rows.
HELDOUT_TASK = "heldout"
# What `python -m recipes.evaluation fetch` records in the data directory: the tasks it prepared there.
FETCHED = "fetched.json"
FETCH_COMMAND = "python -m recipes.evaluation fetch"


def offline_env(data_dir: str) -> dict[str, str]:
    """The evaluation job's environment: the hub off, the tasks' data from where `fetch` put it."""
    return {
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_CACHE": os.path.join(data_dir, "datasets"),
    }


@dataclasses.dataclass(frozen=True)
class EvalRow:
    """One result of the evaluation stage: a task's metric (lm-eval's, or `blend:<name>`'s loss), its standard
    error where lm-eval gives one, the model evaluated (a directory, or a checkpoint with its step), and for a
    blend's loss what it read and how long it took."""

    task: str
    metric: str
    value: float
    stderr: Optional[float] = None
    model: str = ""
    step: Optional[int] = None
    tokens: Optional[int] = None
    seconds: Optional[float] = None

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> "EvalRow":
        """A row as written; keys it does not know (from another version) are left out."""
        return cls(**{f.name: row[f.name] for f in dataclasses.fields(cls) if f.name in row})


def write_rows(path: str, rows: list[EvalRow]) -> None:
    atomic_write(path, "".join(json.dumps(dataclasses.asdict(row)) + "\n" for row in rows))


def read_rows(run_dir: str) -> list[EvalRow]:
    """The evaluation rows of a run directory: its tasks' then its blends' (none when it was not evaluated)."""
    rows: list[EvalRow] = []
    for name in (TASK_ROWS, BLEND_ROWS):
        path = os.path.join(run_dir, RESULTS_DIR, name)
        if os.path.isfile(path):
            with open(path) as f:
                rows += [EvalRow.from_json(json.loads(line)) for line in f if line.strip()]
    return rows


def fetched_tasks(data_dir: str) -> set[str]:
    """The tasks whose data `fetch` prepared in data_dir."""
    try:
        with open(os.path.join(data_dir, FETCHED)) as f:
            return set(json.load(f).get("tasks", {}))
    except (OSError, ValueError, AttributeError):
        return set()
