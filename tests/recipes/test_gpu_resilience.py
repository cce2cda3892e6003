"""Long runs on one GPU (docs/long-runs.md): a rank that hangs or crashes at step 60 under ft_launcher
(resilience.in_job_restarts=2) is restarted in the same job from its newest checkpoint, and a run killed with
SIGKILL while its asynchronous save is being written resumes from the checkpoint before; every time, the per-step
losses equal an uninterrupted run's bit for bit (training.deterministic=true, the tiny model on mock data). The
faults come from resilience.inject_fault. The tests print how long detection and the restart took (times are
printed, never asserted).

nvidia-resiliency-ext must import (ft_launcher); with it installed into a directory:

    PYTHONPATH=/tmp/nvrx python -m pytest -m gpu -s tests/recipes/test_gpu_resilience.py
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.gpu, pytest.mark.timeout(3600)]

STEPS = 100
TINY = [
    "training=llama31/tiny",
    "cluster=local",
    f"training.train_steps={STEPS}",
    "training.checkpoint.interval=20",
    "training.val_interval=0",
    "training.deterministic=true",
    "training.data.mock=true",
    "telemetry.enabled=false",
    "logging.tensorboard=false",
]
HANG_TIMEOUT_S = 30


def main_py(results: Path, name: str, *extra: str, check: bool = True) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(REPO / "main.py"), *TINY, f"results_dir={results}", f"run_name={name}", *extra]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1800)
    (results / f"{name}.out").write_text(proc.stdout + proc.stderr)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-6000:]}")
    return proc


def losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}


def events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[Path, dict[int, float]]:
    results = tmp_path_factory.mktemp("resilience")
    main_py(results, "straight")
    straight = losses(results / "straight")
    assert sorted(straight) == list(range(1, STEPS + 1))
    return results, straight


def needs_nvrx() -> None:
    if importlib.util.find_spec("nvidia_resiliency_ext") is None:
        pytest.skip("nvidia-resiliency-ext is not importable (ft_launcher): put it on PYTHONPATH")


def restart_times(run: list[dict]) -> str:
    """When the fault happened, when the restarted process began, when it was back at the step reached."""
    fault = next(e for e in run if e["event"] == "fault")
    start = next(e for e in run if e["event"] == "start" and e.get("cycle") == 1)
    recovered = next((e for e in run if e["event"] == "recovered" and e["time"] > start["time"]), None)
    first = next(e for e in run if e["event"] == "start")
    detected = start["process_start"] - fault["time"]
    back = (recovered["time"] - start["process_start"]) if recovered else float("nan")
    return (
        f"fault at step {fault['step']}; the restarted process began {detected:.1f} s later (detection, "
        f"stopping the ranks, the restart; hang_timeout_s={HANG_TIMEOUT_S}); it was back at step "
        f"{recovered['step'] if recovered else '?'} {back:.1f} s after that (start-up, loading iter_"
        f"{start['resumed_step']:07d}, the lost steps); time lost in all "
        f"{recovered['time_lost_s'] if recovered else float('nan'):.1f} s; first start-up "
        f"{first['time'] - first['process_start']:.1f} s"
    )


@pytest.mark.parametrize("kind", ["hang", "crash"])
def test_a_hang_or_a_crash_is_restarted_in_the_job_and_ends_bitwise_equal(kind, reference):
    needs_nvrx()
    results, straight = reference
    name = f"injected_{kind}"
    proc = main_py(
        results,
        name,
        "resilience.in_job_restarts=2",
        f"resilience.hang_timeout_s={HANG_TIMEOUT_S}",
        f"resilience.inject_fault.kind={kind}",
        "resilience.inject_fault.step=60",
    )
    output = proc.stdout + proc.stderr
    # What ft_launcher said about each restart: the failure message when a restart did not go as expected.
    said = re.compile(r"section|restart|cycle|timeout|error|fail", re.IGNORECASE)
    restarts = "\n".join(line for line in output.splitlines() if said.search(line))[-4000:]
    run = events(results / name)
    starts = [e for e in run if e["event"] == "start"]
    assert [(e["cycle"], e["resumed_step"]) for e in starts] == [(0, 0), (1, 40)], f"{starts}\n{restarts}"
    assert [e["kind"] for e in run if e["event"] == "fault"] == [kind]  # once: not again after the restart
    ours = losses(results / name)
    assert sorted(ours) == list(range(1, STEPS + 1))
    different = [s for s in ours if ours[s] != straight[s]]
    print(f"\n{kind}: {restart_times(run)}; steps whose loss differs from the uninterrupted run: {different}")
    print(restarts)
    assert not different
    report = subprocess.run(
        [sys.executable, "-m", "launcher.report", str(results / name)], cwd=REPO, capture_output=True, text=True
    )
    print(report.stdout[report.stdout.find("restarts:") :])
    assert "in the job (ft_launcher, restart 1)" in report.stdout


def test_a_kill_during_an_async_save_resumes_from_the_checkpoint_before(reference):
    results, straight = reference
    name = "killed_saving"
    kill = [
        "training.checkpoint.async_save=true",
        "resilience.inject_fault.kind=kill",
        "resilience.inject_fault.during=save",
        "resilience.inject_fault.step=60",
    ]
    first = main_py(results, name, *kill, check=False)
    assert first.returncode != 0, (first.stdout + first.stderr)[-3000:]
    ckpts = results / name / "checkpoints"
    left = sorted(p.name for p in ckpts.iterdir())
    print(f"\nafter SIGKILL while the step-60 save was in flight: {left}")
    assert "iter_0000040" in left and "iter_0000060" not in left
    assert any(n.startswith(".partial_iter_0000060") for n in left)  # what the save had written: never loaded
    again = main_py(results, name, *kill)
    assert "resuming from" in again.stdout + again.stderr and "iter_0000040" in again.stdout + again.stderr
    ours = losses(results / name)
    different = [s for s in ours if ours[s] != straight[s]]
    print(f"steps whose loss differs from the uninterrupted run: {different}")
    assert sorted(ours) == list(range(1, STEPS + 1)) and not different
    assert not any(p.name.startswith(".partial") for p in ckpts.iterdir())
    saves = [e for e in events(results / name) if e["event"] == "checkpoint"]
    print(
        "saves (step, blocking s, complete s, async): "
        + ", ".join(f"({e['step']}, {e['blocking_s']}, {e['complete_s']}, {e['async']})" for e in saves)
    )
