"""GPU telemetry in the report: RUN_DIR/telemetry/<node>.csv (written by recipes/observability/telemetry.py)
summarised per GPU over the training steps, GPUs whose utilisation or SM clock stays far below their peers flagged,
and RUN_DIR/telemetry.png with every metric over time."""

from __future__ import annotations

import csv
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
import statistics
from typing import Any, Callable, Iterable, Mapping, Sequence

import yaml

from common.config import MISSING, TelemetryConfig
from common.run import CONFIG_FILE, load_run_config
from common.typed import from_plain
from launcher.report import figures

CONF = Path(__file__).resolve().parents[2] / "conf" / "observability.yaml"
# Above this many GPUs the plot draws each node's median and the flagged GPUs, not every GPU.
PLOT_EVERY_GPU_UP_TO = 16
# Samples farther apart than this many typical intervals belong to different stretches of sampling (a killed run
# and its resume): the plot breaks its lines and shading there instead of joining them across the silence.
GAP_INTERVALS = 5


@dataclass(frozen=True)
class Sample:
    """One row of a telemetry CSV: a GPU at one moment. Blank numbers are None."""

    time: float
    node: str
    gpu: int
    step: float | None
    util_pct: float | None
    mem_util_pct: float | None
    mem_used_mib: float | None
    mem_total_mib: float | None
    power_w: float | None
    temp_c: float | None
    sm_clock_mhz: float | None
    sm_clock_max_mhz: float | None
    clock_events: str = ""  # the throttle reasons, joined by "+"
    activity: str = ""  # "checkpoint", "validation", ... while not stepping; empty while stepping

    @property
    def gpu_id(self) -> tuple[str, int]:
        return self.node, self.gpu


# The CSV columns parsed as numbers: every float field of Sample.
NUMERIC = tuple(f.name for f in fields(Sample) if f.name not in ("node", "gpu", "clock_events", "activity"))


@dataclass
class GpuSummary:
    node: str
    gpu: int
    samples: int
    util_pct: float | None
    mem_util_pct: float | None
    mem_used_gib: float | None  # the most used
    power_w: float | None
    temp_c: float | None  # the hottest
    sm_clock_mhz: float | None
    clock_events: dict[str, float] = field(default_factory=dict)  # reason -> share of the samples

    @property
    def name(self) -> str:
        return f"{self.node} GPU {self.gpu}"


def _sample(raw: dict[str, str]) -> Sample | None:
    """The row as a Sample; None when a number does not parse, a column is missing or it has no time."""
    try:
        numbers = {key: float(raw[key]) if raw.get(key) else None for key in NUMERIC}  # a missing column: None
        time = numbers.pop("time")
        if time is None:
            return None
        return Sample(
            time=time,
            node=raw["node"],
            gpu=int(raw["gpu"]),
            clock_events=raw.get("clock_events") or "",
            activity=raw.get("activity") or "",
            **numbers,
        )
    except (KeyError, ValueError):
        return None


def read_csv(path: Path) -> list[Sample]:
    """Rows with numbers parsed ('' stays None); a line cut short by a killed job is skipped."""
    rows = []
    with open(path, newline="") as f:
        for raw in csv.DictReader(f):
            if None in raw or any(v is None for v in raw.values()):
                continue  # too many or too few fields
            sample = _sample(raw)
            if sample is not None:
                rows.append(sample)
    return rows


def load(run_dir: Path) -> list[Sample]:
    rows: list[Sample] = []
    for path in sorted((run_dir / "telemetry").glob("*.csv")):
        rows += read_csv(path)
    return rows


def during_steps(rows: Sequence[Sample]) -> list[Sample]:
    """Samples taken while steps ran: from the end of step 1 (start-up and the first step's compilation left out)
    until the last step finished, per node, without those taken during a checkpoint save or validation. Falls back
    to every sample after step 1, then to all of them."""
    chosen = []
    for node in sorted({r.node for r in rows}):
        mine = [(r, r.step) for r in rows if r.node == node and r.step is not None and not r.activity]
        last = max((step for _, step in mine), default=0)
        steady = [r for r, step in mine if 1 <= step < last]
        chosen += steady or [r for r, step in mine if step >= 1] or [r for r in rows if r.node == node]
    return chosen


def _mean(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def summarize(rows: Sequence[Sample]) -> list[GpuSummary]:
    summaries = []
    for node, gpu in sorted({r.gpu_id for r in rows}):
        mine = [r for r in rows if r.gpu_id == (node, gpu)]
        events: dict[str, float] = {}
        for r in mine:
            for reason in filter(None, r.clock_events.split("+")):
                events[reason] = events.get(reason, 0.0) + 1 / len(mine)
        memory = [r.mem_used_mib for r in mine if r.mem_used_mib is not None]
        temps = [r.temp_c for r in mine if r.temp_c is not None]
        summaries.append(
            GpuSummary(
                node,
                gpu,
                len(mine),
                _mean(r.util_pct for r in mine),
                _mean(r.mem_util_pct for r in mine),
                max(memory) / 1024 if memory else None,
                _mean(r.power_w for r in mine),
                max(temps) if temps else None,
                _mean(r.sm_clock_mhz for r in mine),
                events,
            )
        )
    return summaries


def flag(summaries: Sequence[GpuSummary], util_fraction: float, clock_fraction: float) -> dict[str, str]:
    """GPU name -> why it stands out: mean utilisation or SM clock below the fraction of the median over all the
    run's GPUs (two GPUs or more)."""
    flagged: dict[str, str] = {}
    for attr, what, fraction, unit in (
        ("util_pct", "utilisation", util_fraction, "%"),
        ("sm_clock_mhz", "SM clock", clock_fraction, " MHz"),
    ):
        values = [(s, getattr(s, attr)) for s in summaries if getattr(s, attr) is not None]
        if len(values) < 2:
            continue
        median = statistics.median(v for _, v in values)
        for s, value in values:
            if value < fraction * median:
                reason = (
                    f"{what} {value:.0f}{unit} is below {fraction:.0%} of the median {median:.0f}{unit} over all GPUs"
                )
                flagged[s.name] = f"{flagged[s.name]}; {reason}" if s.name in flagged else reason
    return flagged


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else f"{value:{spec}}"


def format_table(summaries: Sequence[GpuSummary], flagged: Mapping[str, str]) -> str:
    header = [
        "node",
        "gpu",
        "samples",
        "util %",
        "mem util %",
        "mem GiB",
        "power W",
        "max temp C",
        "SM MHz",
        "clock events (share of samples)",
        "",
    ]
    rows = [header]
    for s in summaries:
        events = ", ".join(f"{k} {v:.0%}" for k, v in sorted(s.clock_events.items(), key=lambda kv: -kv[1]))
        rows.append(
            [
                s.node,
                str(s.gpu),
                str(s.samples),
                _fmt(s.util_pct, ".1f"),
                _fmt(s.mem_util_pct, ".1f"),
                _fmt(s.mem_used_gib, ".1f"),
                _fmt(s.power_w, ".0f"),
                _fmt(s.temp_c, ".0f"),
                _fmt(s.sm_clock_mhz, ".0f"),
                events or "-",
                "<- flagged" if s.name in flagged else "",
            ]
        )
    widths = [max(len(r[c]) for r in rows) for c in range(len(header))]
    left = {0, 9, 10}
    return "\n".join(
        "  ".join(
            cell.ljust(w) if c in left else cell.rjust(w) for c, (cell, w) in enumerate(zip(row, widths))
        ).rstrip()
        for row in rows
    )


def thresholds(run_dir: Path) -> tuple[float, float]:
    """(utilisation fraction, SM clock fraction) from the run's config.yaml, else conf/observability.yaml (a
    run directory without one: telemetry copied from elsewhere). RunDirError when config.yaml cannot be read."""
    if (run_dir / CONFIG_FILE).exists():
        telemetry = load_run_config(run_dir).telemetry
    else:
        telemetry = _conf_telemetry()
    if MISSING in (telemetry.flag_utilization_below, telemetry.flag_sm_clock_below):
        raise ValueError(
            f"no telemetry.flag_utilization_below / flag_sm_clock_below in {run_dir}/config.yaml or {CONF}"
        )
    return telemetry.flag_utilization_below, telemetry.flag_sm_clock_below


def _conf_telemetry() -> TelemetryConfig:
    """conf/observability.yaml's telemetry section; keys it lacks (or all, where it cannot be read) are MISSING."""
    try:
        group = yaml.safe_load(CONF.read_text()) or {}
    except OSError:
        group = {}
    return from_plain(TelemetryConfig, group.get("telemetry") or {}, path="telemetry")


PANELS = (
    ("util_pct", "utilisation %"),
    ("sm_clock_mhz", "SM clock MHz"),
    ("power_w", "power W"),
    ("temp_c", "temperature C"),
    ("mem_used_mib", "memory used MiB"),
)


def sampling_stretches(times: Iterable[float]) -> list[tuple[float, float]]:
    """(first, last) of each stretch of continuous sampling: a new one starts after a silence of more than
    GAP_INTERVALS typical intervals."""
    ordered = sorted(set(times))
    if len(ordered) < 2:
        return [(t, t) for t in ordered]
    typical = statistics.median(b - a for a, b in zip(ordered, ordered[1:]))
    stretches, first = [], ordered[0]
    for a, b in zip(ordered, ordered[1:]):
        if b - a > GAP_INTERVALS * typical:
            stretches.append((first, a))
            first = b
    return stretches + [(first, ordered[-1])]


def broken_at_gaps(
    xy: Sequence[tuple[float, float]], stretches: Sequence[tuple[float, float]]
) -> list[tuple[float, float]]:
    """The points with a NaN between two that fall in different stretches: matplotlib leaves a gap there."""

    def stretch_of(x: float) -> int:
        return next((i for i, (first, last) in enumerate(stretches) if first <= x <= last), -1)

    out: list[tuple[float, float]] = []
    for point in xy:
        if out and stretch_of(out[-1][0]) != stretch_of(point[0]):
            out.append((float("nan"), float("nan")))
        out.append(point)
    return out


def plot(rows: Sequence[Sample], path: Path, flagged: Mapping[str, str], steady: Sequence[Sample]) -> Path:
    plt = figures.pyplot()
    start = min(r.time for r in rows)
    gpus = sorted({r.gpu_id for r in rows})
    fig, axes = plt.subplots(len(PANELS), 1, figsize=(10, 2.2 * len(PANELS)), sharex=True)
    series: list[tuple[str, list[Sample], dict[str, Any]]] = []
    if len(gpus) <= PLOT_EVERY_GPU_UP_TO:
        for node, gpu in gpus:
            name = f"{node} GPU {gpu}"
            flagged_style = {"linewidth": 2.5, "linestyle": "--"}
            series.append(
                (
                    name + (" (flagged)" if name in flagged else ""),
                    [r for r in rows if r.gpu_id == (node, gpu)],
                    flagged_style if name in flagged else {"linewidth": 1.0},
                )
            )
    else:  # each node's median over its GPUs, plus every flagged GPU
        for node in sorted({n for n, _ in gpus}):
            by_time: dict[float, list[Sample]] = {}
            for r in rows:
                if r.node == node:
                    by_time.setdefault(r.time, []).append(r)
            medians = [_median_sample(samples) for _, samples in sorted(by_time.items())]
            series.append((f"{node} (median)", medians, {"linewidth": 0.8, "alpha": 0.6}))
        for name in flagged:
            node, gpu_index = name.rsplit(" GPU ", 1)
            series.append(
                (
                    name + " (flagged)",
                    [r for r in rows if r.gpu_id == (node, int(gpu_index))],
                    {"linewidth": 2.5, "linestyle": "--"},
                )
            )
    stretches = sampling_stretches([r.time - start for r in rows])
    shaded = sampling_stretches([r.time - start for r in steady]) if steady else []
    for ax, (key, label) in zip(axes, PANELS):
        for name, points, style in series:
            xy = [(r.time - start, value) for r in points if (value := getattr(r, key)) is not None]
            if xy:
                ax.plot(*zip(*broken_at_gaps(xy, stretches)), label=name, **style)
        for span in shaded:
            ax.axvspan(*span, alpha=0.06)  # the samples the table summarises
        ax.set_ylabel(label, fontsize="small")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize="x-small", ncol=4, loc="lower right")
    axes[0].set_title(
        f"GPU telemetry of {path.parent.name} (shaded: the samples the table summarises)", fontsize="small"
    )
    axes[-1].set_xlabel("seconds since the first sample")
    return figures.save(fig, path, dpi=100)


def _median_sample(samples: Sequence[Sample]) -> Sample:
    """The samples of one moment (a node's GPUs) as one: each plotted metric their median (0 where none has it)."""
    medians = {
        key: statistics.median([v for s in samples if (v := getattr(s, key)) is not None] or [0]) for key, _ in PANELS
    }
    return replace(samples[0], **medians)


def report(run_dir: Path, say: Callable[[str], None] = print, png: Path | None = None) -> dict[str, str] | None:
    """Prints the telemetry table and flags, writes RUN_DIR/telemetry.png (or `png`); returns the flags (None: no
    telemetry)."""
    rows = load(run_dir)
    if not rows:
        return None
    steady = during_steps(rows)
    summaries = summarize(steady)
    util_fraction, clock_fraction = thresholds(run_dir)
    flagged = flag(summaries, util_fraction, clock_fraction)
    steps = [r.step for r in steady if r.step is not None]
    nodes = {s.node for s in summaries}
    say(
        f"telemetry: {len(summaries)} GPUs on {len(nodes)} node{'s' if len(nodes) > 1 else ''}, "
        + (f"samples during steps {int(min(steps))}-{int(max(steps))}" if steps else "all samples")
    )
    say(format_table(summaries, flagged))
    for name, why in flagged.items():
        say(f"flagged: {name}: {why}")
    if not flagged:
        say("telemetry: no GPU far below its peers")
    try:
        say(f"telemetry plot: {plot(rows, png or run_dir / 'telemetry.png', flagged, steady)}")
    except ImportError:
        say("telemetry plot: skipped, matplotlib is not installed")
    return flagged
