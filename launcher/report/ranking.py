"""Measured runs ranked, beside the step-time model's prediction for each (`python -m launcher.report --rank RUN...`):
how well the order parallelism=auto predicted held up, e.g. over the run directories of a parallelism.auto.pick
sweep. The same for measured rows (conf/perf/measured.yaml's form, bench/autoconf_cases.py --rank): per group of
rows that differ only in layout, measured order beside the rank parallelism=auto's own ranking gives, and whether
the predicted top 3 is the measured top 3."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from common.run import RunDirError, load_run
from launcher.autoconf import search
from launcher.autoconf.steptime import Check, default_constants, predict
from launcher.report.throughput import RunReport

TOP = 3  # the measured and predicted top this many must agree, in order


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


# --------------------------------------------------------------------------- measured rows
@dataclass
class RankedGroup:
    """Rows of one model proxy, dtype, GPU type and count, and batch: measured fastest first, with each row's rank in
    parallelism=auto's ranking of the group (0 = the pick)."""

    label: str
    measured: list[Check]  # fastest measured step first
    predicted_rank: dict[str, int]  # row name -> rank

    @property
    def predicted(self) -> list[Check]:
        return sorted(self.measured, key=lambda c: self.predicted_rank[c.name])

    @property
    def top_matches(self) -> bool:
        """The predicted top 3 is the measured top 3, in order (the whole order of a smaller group)."""
        return [c.name for c in self.predicted[:TOP]] == [c.name for c in self.measured[:TOP]]


def layout_of(check: Check) -> search.Layout:
    """The search's Layout of a measured row, so the search's own rank() orders the rows."""
    p = check.plan
    recompute = check.cfg.parallelism.recompute_granularity
    return search.Layout(p.tp, p.pp, p.cp, p.vp, p.micro_batch_size, recompute, bool(p.asymmetric_pipeline))


def _pinned(check: Check) -> tuple[str, ...]:
    """The row's overrides besides what the search chooses (the layout, the microbatch size, recomputation) and its
    shape (model, depth, dtype): what a row measured before a default changed pins. The loss kernel counts as chosen:
    the plan picks it by the tensor-parallel size, so it follows the layout (the step-time model has no term for it;
    the TP1 rows measured with the native kernel are up to 3.4% slower than the default's)."""
    chosen = ("parallelism", "training.micro_batch_size", "training.model.cross_entropy_fusion")
    shape = ("training=", "training.model.num_layers=", "dtype=")
    return tuple(
        sorted(o for o in check.overrides if not o.startswith(shape) and not any(r in o.split("=")[0] for r in chosen))
    )


def group_key(check: Check) -> tuple:
    """Rows of one key differ only in what the search chooses. Rows that pin another setting (FP8 param gather, the
    loss) are not layouts the search chooses among: they rank in their own group."""
    p = check.plan
    return (
        p.model,
        sum(p.layers_per_pipeline_stage),
        p.dtype,
        _pinned(check),
        p.gpu_type,
        p.num_gpus,
        p.global_batch_size,
    )


def rank_rows(checks: Sequence[Check]) -> list[RankedGroup]:
    """Groups of the measured rows (steptime.check_rows: predicted with auto.yaml's constants, which parallelism=auto
    uses) that differ only in what the search chooses, each ranked by search.rank: the same predicted step times,
    ties within 0.5% broken by the memory estimate, as parallelism=auto ranks its candidates."""
    groups: dict[tuple, list[Check]] = defaultdict(list)
    for check in checks:
        groups[group_key(check)].append(check)
    out = []
    for (model, layers, dtype, pinned, gpu, gpus, gbs), members in groups.items():
        ranked = search.rank([search.Ranked(layout_of(c), c.plan, c.cfg, c.predicted) for c in members])
        by_plan = {id(r.plan): i for i, r in enumerate(ranked)}
        label = f"{model} {layers}-layer {dtype}{''.join(f' {o}' for o in pinned)} on {gpus} {gpu} GPUs, GBS {gbs}"
        out.append(
            RankedGroup(
                label,
                sorted(members, key=lambda c: c.measured_step_s),
                {c.name: by_plan[id(c.plan)] for c in members},
            )
        )
    return out


def format_row_ranking(groups: Sequence[RankedGroup]) -> str:
    """Per group: measured rank, row, split, measured and predicted step time, predicted rank, the error (in
    tokens/s/GPU, as steptime's tables give it); then the top-3 verdict and the pairs the model orders as measured."""
    lines = []
    for g in groups:
        width = max(len(c.name) for c in g.measured)
        header = f"{'split':<8} {'step s':>7} {'model s':>7} {'model rank':>10} {'error':>7}"
        lines += [g.label, f"  {'rank':>4}  {'row':<{width}}  {header}"]
        for i, c in enumerate(g.measured):
            lines.append(
                f"  {i:>4}  {c.name:<{width}}  {c.split:<8} {c.measured_step_s:>7.3f} {c.predicted.total_s:>7.3f} "
                f"{g.predicted_rank[c.name]:>10} {c.error * 100:>+6.1f}%"
            )
        top = min(TOP, len(g.measured))
        verdict = "matches" if g.top_matches else "does NOT match"
        lines.append(f"  predicted top {top} {verdict} the measured top {top} in order")
        if not g.top_matches:
            lines.append(f"    predicted: {', '.join(c.name for c in g.predicted[:top])}")
            lines.append(f"    measured:  {', '.join(c.name for c in g.measured[:top])}")
        measured = [c.measured_step_s for c in g.measured]
        same, pairs = concordant_pairs(measured, [c.predicted.total_s for c in g.measured])
        rho = spearman(measured, [float(g.predicted_rank[c.name]) for c in g.measured])
        lines.append(f"  {same} of {pairs} pairs alike" + (f", Spearman {rho:+.2f}" if rho is not None else "") + "\n")
    matched = sum(g.top_matches for g in groups)
    lines.append(f"{matched} of {len(groups)} groups: predicted top {TOP} = measured top {TOP}, in order")
    return "\n".join(lines)
