"""MLPerf runs in the report: the `:::MLLOG` lines of a run directory (RUN_DIR/mllog.txt, else its job logs) or
of a bare log become each run's time to train (run_stop - run_start, in minutes), status, samples and steps to
the target and evaluation curve; several runs of a benchmark (seeds) give its score, the olympic mean the rules
define, and a plot of eval accuracy against samples.

The score follows mlperf-logging's result summarizer (result_summarizer.py, _compute_strong_score_standalone and
_compute_olympic_average): runs that did not reach the target are dropped; with none dropped the fastest and the
slowest converged runs are left out, with one dropped only the fastest (the dropped run counts as the slowest);
more than one dropped run leaves the benchmark without a score. The mean is over what remains.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

from common.config import MLPerfConfig
from common.run import CONFIG_FILE, load_run_config
from launcher.records import from_record
from launcher.report import figures

_MLLOG = re.compile(r":::MLLOG (\{.*\})")
MAX_DROPPED_RUNS = 1  # result_summarizer.py: max_dropped_scores (1 for every benchmark but unet3d)
SHOWN_PROBLEMS = 3  # compliance problems printed per run; the checker itself lists them all


@dataclass(frozen=True)
class MLLogEvent:
    """One `:::MLLOG {...}` line: the event's key, its value (a number, a string or None) and its metadata."""

    key: str
    value: Any = None
    time_ms: float | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class MLPerfRun:
    name: str
    events: list[MLLogEvent]
    ruleset: str | None = None  # from the run directory's config; None for a bare log
    target: float | None = None
    result_runs: int | None = None  # runs the benchmark's score needs (mlperf.result_runs)
    compliance: list[str] | None = None  # the compliance checker's problems; None: not checked
    checked_ruleset: str | None = None  # the ruleset the checker used
    source: Path | None = None  # the file the MLLOG lines came from

    def _first(self, key: str) -> MLLogEvent | None:
        return next((e for e in self.events if e.key == key), None)

    def value(self, key: str) -> Any:
        event = self._first(key)
        return None if event is None else event.value

    @property
    def benchmark(self) -> str | None:
        return self.value("submission_benchmark")

    @property
    def status(self) -> str | None:
        stop = self._first("run_stop")
        return None if stop is None else stop.metadata.get("status")

    @property
    def converged(self) -> bool:
        return self.status == "success"

    @property
    def time_to_train_min(self) -> float | None:
        start, stop = self._first("run_start"), self._first("run_stop")
        if start is None or stop is None or start.time_ms is None or stop.time_ms is None:
            return None
        return (float(stop.time_ms) - float(start.time_ms)) / 60000

    @property
    def evals(self) -> list[tuple[int, float]]:
        """(samples_count, eval_accuracy) of every evaluation, in order."""
        return [
            (int(e.metadata.get("samples_count", 0)), float(e.value)) for e in self.events if e.key == "eval_accuracy"
        ]

    @property
    def samples(self) -> int | None:
        """Training sequences when the run stopped (train_samples, else the last evaluation's samples_count)."""
        trained = self.value("train_samples")
        if trained is not None:
            return int(trained)
        return self.evals[-1][0] if self.evals else None

    @property
    def steps(self) -> int | None:
        gbs = self.value("global_batch_size")
        return self.samples // int(gbs) if self.samples is not None and gbs else None


# --------------------------------------------------------------------------- reading
def parse_mllog(text: str) -> list[MLLogEvent]:
    """Every MLLOG event of a log, in order (lines may carry a prefix, e.g. a rank label; a line cut short by a
    killed job is skipped)."""
    events = []
    for line in text.splitlines():
        match = _MLLOG.search(line)
        if match:
            try:
                event = json.loads(match.group(1))
            except json.JSONDecodeError:
                continue
            if isinstance(event, dict) and "key" in event:
                events.append(_event(event))
    return events


def _event(record: dict[str, Any]) -> MLLogEvent:
    """The event of a parsed MLLOG object; metadata that is missing or null reads as empty."""
    event = from_record(MLLogEvent, record)
    return event if isinstance(event.metadata, dict) else replace(event, metadata={})


def split_runs(events: list[MLLogEvent]) -> list[list[MLLogEvent]]:
    """One event list per run: a log holds several when a job was started again (each begins with cache_clear
    or, without one, init_start)."""
    runs: list[list[MLLogEvent]] = []
    for event in events:
        key = event.key
        started = bool(runs) and any(e.key in ("cache_clear", "init_start") for e in runs[-1])
        if (
            not runs
            or (key == "cache_clear" and started)
            or (key == "init_start" and any(e.key == "init_start" for e in runs[-1]))
        ):
            runs.append([])
        runs[-1].append(event)
    return [r for r in runs if any(e.key == "run_start" for e in r)]


def _mllog_source(path: Path) -> tuple[Path | None, MLPerfConfig | None]:
    """(the file holding the MLLOG lines, the run directory's mlperf config section: None for a bare log, a run
    directory without config.yaml or a run that is no MLPerf benchmark). RunDirError when config.yaml cannot be
    read."""
    if not path.is_dir():
        return (path if path.exists() else None), None
    section = load_run_config(path).mlperf if (path / CONFIG_FILE).exists() else None
    candidates = [path / (section.log_file if section else "mllog.txt")]
    logs = path / "logs"
    if logs.is_dir():
        candidates += sorted(
            [*logs.glob("training*.log"), *logs.glob("training_*.out")], key=lambda p: p.stat().st_mtime
        )
    for candidate in candidates:
        if candidate.exists() and ":::MLLOG" in candidate.read_text(errors="replace"):
            return candidate, section
    return None, section


def load_runs(path: Path, check: bool = True) -> list[MLPerfRun]:
    """The MLPerf runs of a run directory or a log file ([] when it has no MLLOG run)."""
    source, section = _mllog_source(path)
    if source is None:
        return []
    parts = split_runs(parse_mllog(source.read_text(errors="replace")))
    runs = [
        MLPerfRun(
            path.name if len(parts) == 1 else f"{path.name}#{k + 1}",
            events,
            ruleset=section.ruleset if section else None,
            target=section.rules.target if section else None,
            result_runs=section.result_runs if section else None,
            source=source,
        )
        for k, events in enumerate(parts)
    ]
    if check and len(parts) == 1:
        run = runs[0]
        division = section.division if section else "closed"
        run.checked_ruleset = run.ruleset or (latest_ruleset(run.benchmark, division) if run.benchmark else None)
        run.compliance = compliance_problems(source, run.benchmark, run.checked_ruleset, division)
    return runs


# --------------------------------------------------------------------------- checking
def latest_ruleset(benchmark: str, division: str = "closed") -> str | None:
    """The newest training ruleset of the installed mlperf-logging that has rules for `benchmark`."""
    try:
        from mlperf_logging import compliance_checker
    except ImportError:
        return None
    root = Path(compliance_checker.__file__).parent
    versions = [
        p.name.split("_", 1)[1] for p in root.glob("training_*.*.*") if (p / f"{division}_{benchmark}.yaml").exists()
    ]
    return max(versions, key=lambda v: tuple(int(x) for x in v.split(".")), default=None)


def compliance_problems(
    log: Path, benchmark: str | None, ruleset: str | None, division: str = "closed"
) -> list[str] | None:
    """The problems mlperf-logging's compliance checker finds in `log` ([] when it passes); None when the
    checker is not installed or has no rules for the benchmark."""
    ruleset = ruleset or (latest_ruleset(benchmark, division) if benchmark else None)
    if ruleset is None:
        return None
    import logging

    try:
        from mlperf_logging.compliance_checker import mlp_compliance
    except ImportError:
        return None
    mlp_compliance.enqueued_configs.clear()  # module state a failed earlier check may have left
    checker = mlp_compliance.make_checker("training", ruleset, quiet=False, werror=False)
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)  # the checker logs every message itself; they are returned instead
    try:
        checker.check_file(str(log), f"training_{ruleset}/common.yaml")
    finally:
        logging.disable(previous)
    messages = [*checker.overwritable.values(), *checker.not_overwritable]
    return [m.splitlines()[0] for m in messages]


# --------------------------------------------------------------------------- the score
@dataclass
class Score:
    minutes: float | None
    counted: int
    runs: int
    converged: int
    why: str


def olympic_score(runs: Sequence[MLPerfRun]) -> Score:
    """The benchmark's score from its runs, as the result summarizer computes it."""
    times = sorted(r.time_to_train_min for r in runs if r.converged and r.time_to_train_min is not None)
    dropped = len(runs) - len(times)
    if dropped > MAX_DROPPED_RUNS:
        return Score(
            None,
            0,
            len(runs),
            len(times),
            f"{dropped} of {len(runs)} runs did not reach the target; the rules drop at most {MAX_DROPPED_RUNS}",
        )
    counted = times[MAX_DROPPED_RUNS : len(times) - (MAX_DROPPED_RUNS - dropped)]
    if not counted:
        return Score(
            None, 0, len(runs), len(times), f"{len(runs)} runs leave none once the fastest and the slowest are dropped"
        )
    left_out = (
        "the fastest and the slowest run" if dropped == 0 else "the fastest run and the one that did not converge"
    )
    return Score(
        sum(counted) / len(counted),
        len(counted),
        len(runs),
        len(times),
        f"olympic mean of {len(counted)} of {len(runs)} runs ({left_out} left out)",
    )


# --------------------------------------------------------------------------- output
def _fmt(value: Any, spec: str = "") -> str:
    return "-" if value is None else format(value, spec)


def format_section(runs: Sequence[MLPerfRun]) -> str:
    """Per benchmark: a row per run, the evaluation curves and the score."""
    lines: list[str] = []
    by_benchmark: dict[str, list[MLPerfRun]] = {}
    for run in runs:
        by_benchmark.setdefault(run.benchmark or "unknown benchmark", []).append(run)
    for benchmark, group in by_benchmark.items():
        target = next((r.target for r in group if r.target is not None), None)
        ruleset = next((r.ruleset for r in group if r.ruleset), None)
        head = f"MLPerf {benchmark}" + (f", target {target}" if target is not None else "")
        lines += [head + (f" (rules training_{ruleset})" if ruleset else "") + ":", ""]
        rows = [["run", "seed", "status", "time to train", "samples", "steps", "evals", "last eval", "compliance"]]
        for r in group:
            last = r.evals[-1][1] if r.evals else None
            rows.append(
                [
                    r.name,
                    _fmt(r.value("seed")),
                    r.status or "running?",
                    _fmt(r.time_to_train_min, ".2f") + " min" if r.time_to_train_min is not None else "-",
                    _fmt(r.samples, ","),
                    _fmt(r.steps, ","),
                    str(len(r.evals)),
                    _fmt(last, ".4f"),
                    _compliance_cell(r.compliance),
                ]
            )
        lines += _table(rows)
        lines.append(
            "samples, steps: training sequences and steps when the run stopped (at the target when it "
            "converged); time to train = run_stop - run_start"
        )
        for r in group:
            curve = ", ".join(f"{s:,}: {a:.4f}" for s, a in r.evals) or "none"
            lines.append(f"eval curve {r.name} (samples: log perplexity): {curve}")
        for r in group:
            problems = r.compliance or []
            lines += [f"compliance {r.name}: {problem}" for problem in problems[:SHOWN_PROBLEMS]]
            if len(problems) > SHOWN_PROBLEMS:
                lines.append(
                    f"compliance {r.name}: ... {len(problems) - SHOWN_PROBLEMS} more: python -m "
                    f"mlperf_logging.compliance_checker --ruleset {r.checked_ruleset} {r.source}"
                )
        score = olympic_score(group)
        needed = next((r.result_runs for r in group if r.result_runs), None)
        note = f"; a result needs {needed} runs, here {len(group)}" if needed and needed != len(group) else ""
        value = f"{score.minutes:.2f} min" if score.minutes is not None else "none"
        lines += [f"score: {value}: {score.why}{note}", ""]
    return "\n".join(lines).rstrip()


def _compliance_cell(problems: list[str] | None) -> str:
    if problems is None:
        return "not checked"
    return "passed" if not problems else f"{len(problems)} problem" + ("s" if len(problems) > 1 else "")


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    out = [
        "  ".join(cell.ljust(w) if c in (0, 2, 8) else cell.rjust(w) for c, (cell, w) in enumerate(zip(row, widths)))
        for row in rows
    ]
    out.insert(1, "  ".join("-" * w for w in widths))
    return out


def plot(runs: Sequence[MLPerfRun], path: Path) -> Path:
    """Eval accuracy (log perplexity) against training samples, one line per run, the target dashed."""
    plt = figures.pyplot()
    fig, ax = plt.subplots(figsize=(9, 5))
    for r in runs:
        if r.evals:
            ax.plot(*zip(*r.evals), marker="o", markersize=3, label=f"{r.name} ({r.status or 'running?'})")
    for target in sorted({r.target for r in runs if r.target is not None}):
        ax.axhline(target, linestyle="--", color="gray", linewidth=1, label=f"target {target}")
    ax.set_xlabel("training samples")
    ax.set_ylabel("eval accuracy (log perplexity)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return figures.save(fig, path)


def sizes_from_mllog(text: str) -> dict[str, int]:
    """gbs, seq and gpus a bare log's MLLOG states (for its throughput row)."""
    values: dict[str, Any] = {e.key: e.value for e in parse_mllog(text)}
    out = {}
    if values.get("global_batch_size"):
        out["gbs"] = int(values["global_batch_size"])
    if values.get("max_sequence_length"):
        out["seq"] = int(values["max_sequence_length"])
    if values.get("number_of_nodes") and values.get("accelerators_per_node"):
        out["gpus"] = int(values["number_of_nodes"]) * int(values["accelerators_per_node"])
    return out
