"""The evaluation stage's rows (RUN_DIR/evaluation/: lm-eval's tasks and the held-out perplexity task, the
in-framework loss of evaluation.blends) as a table per run, and `--compare`: several runs' rows side by side, one
line per task and metric, one column per run."""

from __future__ import annotations

from pathlib import Path

from common.evaluation import EvalRow, read_rows


def rows_of(path: Path) -> list[EvalRow]:
    return read_rows(str(path)) if path.is_dir() else []


def _value(row: EvalRow | None) -> str:
    if row is None:
        return "-"
    return f"{row.value:.4f}" + (f" ± {row.stderr:.4f}" if isinstance(row.stderr, (int, float)) else "")


def _table(header: list[str], lines: list[list[str]]) -> str:
    widths = [max(len(cell) for cell in column) for column in zip(header, *lines)]
    out = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [header, *lines]]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)


def format_rows(path: Path, rows: list[EvalRow]) -> str:
    """One run's evaluation: task, metric, value ± stderr (and the checkpoint step of a blend's loss)."""
    lines = [[row.task, row.metric, _value(row), str(row.step) if row.step is not None else ""] for row in rows]
    return f"evaluation of {path.name}\n" + _table(["task", "metric", "value", "step"], lines)


def labels(paths: list[Path]) -> list[str]:
    """Column names: the run directories' names, or their paths where two share a name."""
    names = [p.name for p in paths]
    return [str(p) if names.count(p.name) > 1 else p.name for p in paths]


def format_compare(paths: list[Path], runs: list[list[EvalRow]]) -> str:
    """Runs' rows side by side: one line per (task, metric) any of them has, in the order first met; '-' where a
    run lacks it."""
    keys: list[tuple[str, str]] = []
    by_run = []
    for rows in runs:
        table = {}
        for row in rows:
            key = (row.task, row.metric)
            table[key] = row
            if key not in keys:
                keys.append(key)
        by_run.append(table)
    lines = [[task, metric, *[_value(table.get((task, metric))) for table in by_run]] for task, metric in keys]
    return _table(["task", "metric", *labels(paths)], lines)
