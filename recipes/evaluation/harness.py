"""lm-evaluation-harness on a Hugging Face model (the run's export, or evaluation.model): the configured tasks,
the held-out perplexity task on evaluation.heldout, with the hub off; lm-eval's results JSON and one row per task
and metric go into RUN_DIR/evaluation/."""

from __future__ import annotations

import json
import math
import os
from typing import Any, Callable

from common import lm_eval_index
from common.config import Config
from common.evaluation import HARNESS_RESULTS, HELDOUT_TASK, RESULTS_DIR, TASK_ROWS, EvalRow, offline_env, write_rows
from common.files import atomic_write
from recipes.evaluation.tasks import write_heldout_task


def model_dir(cfg: Config, run_dir: str) -> str:
    """The Hugging Face directory evaluated: evaluation.model, else where the export stage writes."""
    ev, ckpt = cfg.evaluation, cfg.training.checkpoint
    return str(ev.model or ckpt.export_dir or os.path.join(run_dir, "hf"))


def max_length(cfg: Config) -> int:
    """Tokens per request window: evaluation.heldout_max_length, else the length the model was trained at."""
    return int(cfg.evaluation.heldout_max_length or cfg.training.seq_length)


def task_list(cfg: Config, out_dir: str) -> tuple[list[str], list[str]]:
    """(the tasks lm-eval runs, the directories of local task YAMLs it reads): the configured tasks, then the
    held-out task written from evaluation.heldout."""
    ev = cfg.evaluation
    tasks, include = list(ev.tasks), [ev.include_path] if ev.include_path else []
    if ev.heldout:
        include.append(write_heldout_task(list(ev.heldout), ev.heldout_text_key, os.path.join(out_dir, "tasks")))
        tasks.append(HELDOUT_TASK)
    return tasks, include


def summary_rows(results: dict[str, Any], model: str) -> list[EvalRow]:
    """One row per task and metric of lm-eval's results (stderr None where lm-eval gives none)."""
    rows = []
    for task, metrics in sorted(results.get("results", {}).items()):
        for key, value in metrics.items():
            if "," not in key or "_stderr" in key or not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            metric, filtered = key.split(",", 1)
            stderr = metrics.get(f"{metric}_stderr,{filtered}")
            stderr = float(stderr) if isinstance(stderr, (int, float)) and math.isfinite(stderr) else None
            rows.append(
                EvalRow(
                    task=task,
                    metric=metric if filtered == "none" else f"{metric} ({filtered})",
                    value=float(value),
                    stderr=stderr,
                    model=model,
                )
            )
    return rows


def run_harness(cfg: Config, run_dir: str, device: str | None = None, say: Callable[[str], None] = print) -> str:
    """Evaluate; returns the rows' file. `device`: lm-eval's (None: the GPUs, the model sharded over them when
    there are several)."""
    out_dir = os.path.join(run_dir, RESULTS_DIR)
    os.makedirs(out_dir, exist_ok=True)
    tasks, include = task_list(cfg, out_dir)
    ev = cfg.evaluation
    if not tasks:
        raise SystemExit("evaluation: no tasks (evaluation.tasks is empty and evaluation.heldout names no file)")
    os.environ.update(offline_env(ev.data_dir))  # before datasets is imported: it reads them once
    import lm_eval
    from lm_eval.tasks import TaskManager

    local = lm_eval_index.local_tasks(ev.include_path)
    model = model_dir(cfg, run_dir)
    model_args: dict[str, Any] = {"pretrained": model, "dtype": ev.dtype, "max_length": max_length(cfg)}
    if device is None:
        import torch

        if torch.cuda.device_count() > 1:
            model_args["parallelize"] = True  # accelerate's device map: the layers spread over the node's GPUs
        else:
            device = "cuda"
    say(f"evaluation: {', '.join(tasks)} on {model} ({ev.dtype}, windows of {model_args['max_length']} tokens)")
    results = lm_eval.simple_evaluate(
        model="hf",
        model_args=model_args,
        tasks=tasks,
        num_fewshot=ev.num_fewshot,
        batch_size=ev.batch_size,
        limit=ev.limit,
        device=device,
        log_samples=False,
        # lm-eval's own tasks indexed only when some are asked for (indexing them takes most of a minute).
        task_manager=TaskManager(include_path=include or None, include_defaults=not set(ev.tasks) <= local),
    )
    if results is None:  # a rank other than the first under lm-eval's own data parallelism
        return ""
    atomic_write(os.path.join(out_dir, HARNESS_RESULTS), json.dumps(results, indent=2, default=str) + "\n")
    rows = summary_rows(results, model)
    path = os.path.join(out_dir, TASK_ROWS)
    write_rows(path, rows)
    for row in rows:
        stderr = f" ± {row.stderr:.4f}" if row.stderr is not None else ""
        say(f"  {row.task:<20} {row.metric:<24} {row.value:.4f}{stderr}")
    return path
