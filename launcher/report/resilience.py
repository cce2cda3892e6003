"""A run's restarts and slow GPUs (docs/long-runs.md), beside the telemetry table: from RUN/events.jsonl
(common/run_events.py) each restart's time, how it came (in the job by ft_launcher, or by the next job of a
chain), why (time limit, hang, crash), the step it resumed from, the steps and the time it lost; the chain's stop
when it stopped; and from metrics.jsonl the straggler reports (resilience.straggler_detection), naming the GPUs
(node, GPU) below the threshold."""

from __future__ import annotations

from dataclasses import dataclass
import json
from pathlib import Path
import time
from typing import Callable

import yaml

from common import run_events
from common.config import ResilienceConfig
from common.run import CONFIG_FILE, load_run_config
from common.typed import from_plain
from launcher.records import from_record

CONF = Path(__file__).resolve().parents[2] / "conf" / "resilience" / "default.yaml"
# conf/resilience/default.yaml's, for a run directory without config.yaml where that file cannot be read either.
HANG_TIMEOUT_S = 600.0
STRAGGLER_THRESHOLD = 0.7


@dataclass
class Restart:
    time: float
    job_id: str
    how: str  # "in the job (ft_launcher, restart N)" | "next job"
    why: str
    resumed_step: int
    steps_lost: int | None
    down_s: float | None  # from the last step before to the new process's start
    time_lost_s: float | None  # from the last step before to the same step again (or the first after it)


@dataclass(frozen=True)
class Event:
    """One line of events.jsonl (common/run_events.py lists the events and their fields). A field the event does not
    carry is None: older run directories lack some, so every field but `event` and `time` is optional."""

    event: str
    time: float
    job_id: str | int | None = None
    decision: str | None = None
    reason: str | None = None
    cycle: int | None = None
    process_start: float | None = None
    resumed_step: int | None = None
    last_step: int | None = None
    last_step_time: float | None = None
    time_lost_s: float | None = None
    step: int | None = None
    signal: str | None = None
    finished: bool | None = None
    message: str | None = None
    kind: str | None = None
    rank: int | None = None
    during: str | None = None

    @property
    def started_at(self) -> float:
        """When the training process began: process_start, else (older runs) when the event was recorded."""
        return self.process_start if self.process_start is not None else self.time


def read_events(run_dir: Path) -> list[Event]:
    return [from_record(Event, record) for record in run_events.read(str(run_dir))]


@dataclass
class _Settings:
    hang_timeout_s: float  # resilience.hang_timeout_s
    straggler_threshold: float  # resilience.straggler_detection.threshold


def _settings(run_dir: Path) -> _Settings:
    """The run's config.yaml's, else conf/resilience/default.yaml's (a run directory without config.yaml).
    RunDirError when config.yaml cannot be read."""
    if (run_dir / CONFIG_FILE).exists():
        resilience = load_run_config(run_dir).resilience
    else:
        try:
            resilience = from_plain(ResilienceConfig, yaml.safe_load(CONF.read_text()) or {}, path="resilience")
        except OSError:
            return _Settings(HANG_TIMEOUT_S, STRAGGLER_THRESHOLD)
    return _Settings(resilience.hang_timeout_s, resilience.straggler_detection.threshold)


def _cause(between: list[Event], start: Event, hang_timeout_s: float) -> str:
    """Why the process before `start` ended, from what it (or a job's check) recorded after it began."""
    for entry in reversed(between):
        kind = entry.event
        if kind == "stop":
            signal = entry.signal
            return (
                f"time limit ({signal} at step {entry.step})"
                if signal == "SIGUSR1"
                else f"stop signal ({signal} at step {entry.step})"
            )
        if kind == "fault":
            what = {"hang": "hang", "crash": "crash", "kill": "crash (killed)"}.get(str(entry.kind), "fault")
            where = " during its save" if entry.during == "save" else ""
            return f"{what}, injected at step {entry.step}{where} on rank {entry.rank}"
        if kind == "error":
            return f"crash: {entry.message} (rank {entry.rank})"
        if kind == "end":
            return "started again after training ended" if entry.finished else f"ended: {entry.reason}"
    if int(start.cycle or 0) > 0:
        # ft_launcher restarted the ranks: its monitor ends a silent rank after hang_timeout_s, a dead one at once.
        last = start.last_step_time
        silent = start.started_at - last if last else None
        if silent is not None and silent >= hang_timeout_s:
            return f"hang (no step for {silent:.0f} s, hang_timeout_s={hang_timeout_s:g})"
        return "crash (a rank died without a message)"
    return "job ended without a stop signal (killed, a node failed, or the time limit came without its warning)"


def restarts(run_dir: Path) -> list[Restart]:
    events = read_events(run_dir)
    hang_timeout = _settings(run_dir).hang_timeout_s
    starts = [i for i, e in enumerate(events) if e.event == "start"]
    found = []
    for previous, index in zip(starts, starts[1:]):
        start, before = events[index], events[previous]
        cycle = int(start.cycle or 0)
        same_job = start.job_id == before.job_id
        how = f"in the job (ft_launcher, restart {cycle})" if same_job and cycle else "next job"
        later = events[index + 1 : starts[starts.index(index) + 1]] if index != starts[-1] else events[index + 1 :]
        recovered = next((e for e in later if e.event == "recovered"), None)
        last = start.last_step
        resumed = int(start.resumed_step or 0)
        down = start.started_at - start.last_step_time if start.last_step_time else None
        found.append(
            Restart(
                time=start.time,
                job_id=str(start.job_id),
                how=how,
                why=_cause(events[previous + 1 : index], start, hang_timeout),
                resumed_step=resumed,
                steps_lost=max(0, last - resumed) if last is not None else None,
                down_s=down,
                time_lost_s=recovered.time_lost_s if recovered else None,
            )
        )
    return found


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def format_restarts(found: list[Restart]) -> list[str]:
    in_job = sum(r.how.startswith("in the job") for r in found)
    lines = [
        f"restarts: {len(found)} ({in_job} in the job by ft_launcher, {len(found) - in_job} by the next job)",
        f"{'when (UTC)':<19}  {'job':>8}  {'how':<35}  {'resumed':>7}  {'steps lost':>10}  {'down':>9}  "
        f"{'time lost':>9}  why",
    ]
    for r in found:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(r.time))
        lost = "-" if r.steps_lost is None else str(r.steps_lost)
        lines.append(
            f"{when:<19}  {r.job_id:>8}  {r.how:<35}  {r.resumed_step:>7}  {lost:>10}  "
            f"{_seconds(r.down_s):>9}  {_seconds(r.time_lost_s):>9}  {r.why}"
        )
    lines.append(
        "down: from the last step before to the new process's start; time lost: to the same step again "
        "(or, when no step was lost, to the first step after it)"
    )
    return lines


def stragglers(run_dir: Path, threshold: float) -> list[str]:
    """Each GPU's relative speed over the reports in metrics.jsonl; the ones below the threshold named."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    scores: dict[tuple[str, int], list[tuple[int, float, int]]] = {}
    reports = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("gpu_relative_perf"):
            reports.append(record["step"])
            for rank, node, gpu, score in record["gpu_relative_perf"]:
                scores.setdefault((node, gpu), []).append((record["step"], score, rank))
    if not scores:
        return []
    lines = [
        f"straggler detection: {len(scores)} GPUs, {len(reports)} reports (steps {reports[0]}-{reports[-1]}); "
        "relative speed 1.0 = the fastest GPU",
        f"{'node':<12} {'gpu':>3} {'rank':>5} {'last':>6} {'min':>6} {'reports below':>13}",
    ]
    flagged = []
    for (node, gpu), entries in sorted(scores.items()):
        last, low = entries[-1][1], min(s for _, s, _ in entries)
        below = sum(s < threshold for _, s, _ in entries)
        mark = "  <- flagged" if last < threshold else ""
        lines.append(f"{node:<12} {gpu:>3} {entries[-1][2]:>5} {last:>6.2f} {low:>6.2f} {below:>13}{mark}")
        if last < threshold:
            flagged.append(
                f"flagged: {node} GPU {gpu} (rank {entries[-1][2]}): relative speed {last:.2f} at step "
                f"{entries[-1][0]} is below resilience.straggler_detection.threshold={threshold:g}"
            )
    return lines + flagged


def report(run_dir: Path, say: Callable[[str], None] = print) -> None:
    """Prints the restarts, the chain's stop and the straggler table of a run directory, where it has them."""
    found = restarts(run_dir)
    if found:
        for line in format_restarts(found):
            say(line)
    stops = [e for e in read_events(run_dir) if e.event == "job" and e.decision == "stop"]
    if stops:
        reason = stops[-1].reason
        say(reason if reason is not None else "chain: stopped")
    threshold = _settings(run_dir).straggler_threshold
    for line in stragglers(run_dir, threshold):
        say(line)
