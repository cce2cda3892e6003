"""The trainer's long-run component without a GPU (recipes/resilience/): the rank monitor's sections in the order
the loop opens them, a fault that fires once at its step and never after the restart it causes, and the events a
process records for the report (where the process before it got to, when it is back there)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from common import run_events
from common.checkpoints import TrainState
from common.config import FaultConfig, FaultKind, FaultPoint
from launcher.config.compose import compose
from recipes.resilience import faults, guard, monitor
from recipes.runtime.callbacks import FINISHED, Stop

REPO = Path(__file__).resolve().parents[2]


class FakeClient:
    def __init__(self):
        self.calls: list[str] = []

    def start_section(self, name):
        self.calls.append(f"+{name}")

    def end_section(self, name):
        self.calls.append(f"-{name}")

    def end_all_sections(self):
        self.calls.append("end all")

    def shutdown_workload_monitoring(self):
        self.calls.append("shutdown")


def test_the_first_step_belongs_to_the_start_and_saves_to_their_own_section():
    client = FakeClient()
    hangs = monitor.HangMonitor(client)
    for _ in range(3):
        hangs.step_begins()
        hangs.step_ended()
        with hangs.checkpointing():
            pass
    hangs.close()
    assert client.calls == [
        "+setup",
        "-setup",
        "+checkpointing",
        "-checkpointing",
        "+step",
        "-step",
        "+checkpointing",
        "-checkpointing",
        "+step",
        "-step",
        "+checkpointing",
        "-checkpointing",
        "end all",
        "shutdown",
    ]


def test_not_under_ft_launcher_there_is_no_monitor(monkeypatch):
    monkeypatch.delenv(monitor.SOCKET_VARIABLE, raising=False)
    assert monitor.HangMonitor.connect() is None


def test_a_fault_fires_once_on_its_rank_and_step(tmp_path):
    script = (
        "import sys; from recipes.resilience.faults import FaultInjector; from common import run_events; "
        "from common.config import FaultConfig; "
        "f = FaultInjector(sys.argv[1], FaultConfig(kind='crash', rank=0, step=3, during='step'), 0, "
        "run_events.read(sys.argv[1])); [f.at(s, 'step') for s in range(1, 6)]; print('ran through')"
    )
    first = subprocess.run([sys.executable, "-c", script, str(tmp_path)], cwd=REPO, capture_output=True, text=True)
    assert first.returncode == 1 and "rank 0 crashes (os._exit(1)) at step 3" in first.stdout
    assert "ran through" not in first.stdout
    again = subprocess.run([sys.executable, "-c", script, str(tmp_path)], cwd=REPO, capture_output=True, text=True)
    assert again.returncode == 0 and "ran through" in again.stdout  # the restart runs through
    assert [(e["kind"], e["step"]) for e in run_events.read(str(tmp_path)) if e["event"] == "fault"] == [("crash", 3)]
    other = faults.FaultInjector(
        str(tmp_path), FaultConfig(kind=FaultKind.hang, rank=1, step=3, during=FaultPoint.step), 0, []
    )
    assert not other.armed  # another rank's fault


def test_a_restarted_process_records_where_the_one_before_got_and_when_it_is_back(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in range(1, 58)))
    os.utime(tmp_path / "metrics.jsonl", (1_700_000_000, 1_700_000_000))
    g = guard.RunGuard(str(tmp_path), compose([]).resilience, 0, 1)  # no fault, no straggler detection
    g.training_starts(TrainState(step=40, consumed_samples=320))
    for step in range(41, 60):
        g.step_ends(step)
    g.stops(Stop(FINISHED, 59, 472))
    start, recovered, end = run_events.read(str(tmp_path))
    assert (start["event"], start["resumed_step"], start["last_step"], start["last_step_time"]) == (
        "start",
        40,
        57,
        1_700_000_000,
    )
    assert recovered["event"] == "recovered" and recovered["step"] == 57 and recovered["time_lost_s"] > 0
    assert end == {**end, "event": "end", "step": 59, "finished": True}
    assert guard.job_id({"SLURM_JOB_ID": "12"}) == "12" and guard.job_id({"JOB_ID": "7"}) == "7"
    assert guard.job_id({}) == "local"
