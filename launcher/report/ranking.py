"""Measured runs ranked, beside the step-time model's prediction for each (`python -m launcher.report --rank RUN...`):
how well the order parallelism=auto predicted held up, e.g. over the run directories of a parallelism.auto.pick
sweep."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from common.run import RunDirError, load_run
from launcher.autoconf.steptime import default_constants, predict
from launcher.report.throughput import RunReport


def predicted_step_s(run_dir: Path | None) -> float | None:
    """The model's step time for a run directory (its config.yaml and plan.json); None without them (or with ones
    this version cannot read) or without a known GPU type."""
    if run_dir is None or not run_dir.is_dir():
        return None
    try:
        run = load_run(run_dir)
    except (OSError, RunDirError):
        return None
    if not run.plan.gpu_type:
        return None
    return predict(run.config, run.plan, default_constants()).total_s


def _ranks(values: Sequence[float]) -> list[int]:
    """0 for the smallest."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0] * len(values)
    for rank, i in enumerate(order):
        ranks[i] = rank
    return ranks


def concordant_pairs(measured: Sequence[float], predicted: Sequence[float]) -> tuple[int, int]:
    """(pairs of runs the model orders as measured, all pairs)."""
    n = len(measured)
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    same = sum(1 for i, j in pairs if (measured[i] - measured[j]) * (predicted[i] - predicted[j]) > 0)
    return same, len(pairs)


def spearman(measured: Sequence[float], predicted: Sequence[float]) -> float | None:
    n = len(measured)
    if n < 3:
        return None
    a, b = _ranks(measured), _ranks(predicted)
    return 1 - 6 * sum((x - y) ** 2 for x, y in zip(a, b)) / (n * (n * n - 1))


def format_ranking(reports: Sequence[RunReport], run_dirs: Sequence[Path | None]) -> str:
    """Runs fastest first (measured tokens/s/GPU), with the predicted step time and rank where the model applies."""
    rows = []
    for report, run_dir in zip(reports, run_dirs):
        per_gpu = report.tokens_per_s_per_gpu
        rows.append((report, per_gpu if per_gpu is not None else 1 / report.step_time_s, predicted_step_s(run_dir)))
    rows.sort(key=lambda r: -r[1])
    with_model = [(report, model_s) for report, _, model_s in rows if model_s is not None]
    predicted_rank = {id(r[0]): rank for rank, r in enumerate(sorted(with_model, key=lambda r: r[1]))}
    width = max(len(r[0].info.name) for r in rows)
    lines = [
        f"{'rank':>4}  {'run':<{width}}  {'layout':<16} {'step s':>8} {'tok/s/GPU':>10}  {'model step s':>12} "
        f"{'model rank':>10}"
    ]
    for rank, (report, _, model_s) in enumerate(rows):
        per_gpu = report.tokens_per_s_per_gpu
        lines.append(
            f"{rank:>4}  {report.info.name:<{width}}  {report.info.layout:<16} {report.step_time_s:>8.3f} "
            f"{'-' if per_gpu is None else f'{per_gpu:,.0f}':>10}  "
            f"{'-' if model_s is None else f'{model_s:.3f}':>12} "
            f"{predicted_rank.get(id(report), '-'):>10}"
        )
    if len(with_model) >= 2:
        measured = [report.step_time_s for report, _ in with_model]
        model = [model_s for _, model_s in with_model]
        same, pairs = concordant_pairs(measured, model)
        rho = spearman(measured, model)
        lines.append(
            f"model vs measured order: {same} of {pairs} pairs alike"
            + (f", Spearman {rho:+.2f}" if rho is not None else "")
            + " (step times; compare runs of one model, GBS and GPU count)"
        )
    return "\n".join(lines)
