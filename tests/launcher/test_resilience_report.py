"""The report's restarts and straggler tables (launcher/report/resilience.py) from a run directory's events and
metrics, as the trainer and the chain's checks write them: a time limit, an injected hang restarted in the job,
a crash with a message, a job killed without a word; and a slow GPU in the straggler reports."""

from __future__ import annotations

import json
from pathlib import Path

from launcher.config.compose import compose
from launcher.jobs.rundir import config_yaml
from launcher.report import resilience

T0 = 1_800_000_000.0


def write_events(run_dir: Path, events: list[dict]) -> None:
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))


def write_config(run_dir: Path, *overrides: str) -> None:
    """config.yaml as python main.py <overrides> writes it."""
    (run_dir / "config.yaml").write_text(config_yaml(compose(overrides)))


def test_each_restart_with_how_why_and_what_it_cost(tmp_path):
    write_config(tmp_path, "resilience.hang_timeout_s=60")
    write_events(
        tmp_path,
        [
            {"event": "chain", "time": T0, "jobs": 4},
            {"event": "job", "time": T0 + 1, "job_id": "11", "checkpoint_step": -1, "decision": "train"},
            {
                "event": "start",
                "time": T0 + 20,
                "job_id": "11",
                "cycle": 0,
                "process_start": T0 + 2,
                "resumed_step": 0,
                "last_step": None,
                "last_step_time": None,
            },
            {"event": "fault", "time": T0 + 100, "kind": "hang", "rank": 3, "step": 60, "during": "step"},
            {
                "event": "start",
                "time": T0 + 190,
                "job_id": "11",
                "cycle": 1,
                "process_start": T0 + 170,
                "resumed_step": 50,
                "last_step": 59,
                "last_step_time": T0 + 99,
            },
            {"event": "recovered", "time": T0 + 230, "step": 59, "time_lost_s": 131.0},
            {
                "event": "error",
                "time": T0 + 300,
                "rank": 0,
                "message": "RuntimeError: CUDA error: an illegal memory access",
            },
            {
                "event": "start",
                "time": T0 + 330,
                "job_id": "11",
                "cycle": 2,
                "process_start": T0 + 310,
                "resumed_step": 100,
                "last_step": 104,
                "last_step_time": T0 + 299,
            },
            {
                "event": "start",
                "time": T0 + 500,
                "job_id": "11",
                "cycle": 3,
                "process_start": T0 + 480,
                "resumed_step": 100,
                "last_step": 130,
                "last_step_time": T0 + 400,
            },
            {"event": "stop", "time": T0 + 3500, "step": 700, "signal": "SIGUSR1"},
            {"event": "job", "time": T0 + 3600, "job_id": "12", "checkpoint_step": 700, "decision": "train"},
            {
                "event": "start",
                "time": T0 + 3630,
                "job_id": "12",
                "cycle": 0,
                "process_start": T0 + 3610,
                "resumed_step": 700,
                "last_step": 700,
                "last_step_time": T0 + 3499,
            },
            {"event": "recovered", "time": T0 + 3640, "step": 701, "time_lost_s": 141.0},
            {
                "event": "start",
                "time": T0 + 7300,
                "job_id": "13",
                "cycle": 0,
                "process_start": T0 + 7290,
                "resumed_step": 1300,
                "last_step": 1312,
                "last_step_time": T0 + 7100,
            },
        ],
    )
    found = resilience.restarts(tmp_path)
    lines = resilience.format_restarts(found)
    print("\n" + "\n".join(lines))
    assert [(r.how, r.resumed_step, r.steps_lost) for r in found] == [
        ("in the job (ft_launcher, restart 1)", 50, 9),
        ("in the job (ft_launcher, restart 2)", 100, 4),
        ("in the job (ft_launcher, restart 3)", 100, 30),
        ("next job", 700, 0),
        ("next job", 1300, 12),
    ]
    assert [r.why for r in found] == [
        "hang, injected at step 60 on rank 3",
        "crash: RuntimeError: CUDA error: an illegal memory access (rank 0)",
        "hang (no step for 80 s, hang_timeout_s=60)",
        "time limit (SIGUSR1 at step 700)",
        "job ended without a stop signal (killed, a node failed, or the time limit came without its warning)",
    ]
    assert [r.time_lost_s for r in found] == [131.0, None, None, 141.0, None]
    assert found[0].down_s == 71.0
    assert lines[0] == "restarts: 5 (3 in the job by ft_launcher, 2 by the next job)"


def test_the_slow_gpu_is_named(tmp_path, capsys):
    write_config(tmp_path, "resilience.hang_timeout_s=600", "resilience.straggler_detection.threshold=0.7")
    records = [{"step": s, "loss": 2.0} for s in range(1, 201)]
    for step, slow in ((100, 0.95), (200, 0.52)):
        records[step - 1]["gpu_relative_perf"] = [
            [0, "gpu-a", 0, 1.0],
            [1, "gpu-a", 1, 0.98],
            [2, "gpu-b", 0, 0.99],
            [3, "gpu-b", 1, slow],
        ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    resilience.report(tmp_path)
    out = capsys.readouterr().out
    print(out)
    assert "straggler detection: 4 GPUs, 2 reports (steps 100-200)" in out
    assert (
        "flagged: gpu-b GPU 1 (rank 3): relative speed 0.52 at step 200 is below "
        "resilience.straggler_detection.threshold=0.7"
    ) in out
    assert out.count("<- flagged") == 1
