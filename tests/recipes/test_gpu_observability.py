"""Watching a run on this machine's GPUs (2, or 1 where that is all there is), through
`python main.py ... cluster=local`: one run with the preflight stage, TensorBoard, W&B offline (when wandb is
installed), a torch profiler window and telemetry, killed after a checkpoint and resumed; then the preflight
with a threshold no machine reaches, and profile.tool=nsys.

OBSERVABILITY_ARTIFACTS=<dir> copies the plots, the trace and preflight.json there to look at."""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
from pathlib import Path
import shutil
import signal
import subprocess
import sys

import pytest

from test_gpu_training import REPO, interrupt_at_step, main_py, read_metrics

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(1800)]
HAVE_WANDB = importlib.util.find_spec("wandb") is not None
# The tiny model made wide enough that a step keeps the GPUs busy (utilisation is what telemetry checks), with a
# small vocabulary so its checkpoints (about 0.5B parameters) stay quick to write.
BUSY_MODEL = [
    "training.model.num_layers=8",
    "training.model.hidden_size=2048",
    "training.model.ffn_hidden_size=7168",
    "training.model.num_attention_heads=16",
    "training.model.num_query_groups=8",
    "training.model.kv_channels=128",
    "training.model.vocab_size=32768",
    "training.seq_length=4096",
    "training.micro_batch_size=2",
    "training.global_batch_size=16",
]
STEPS, CHECKPOINT_EVERY, KILL_AFTER = 40, 20, 26
PROFILE = [
    "profile.enabled=true",
    "profile.tool=torch",
    "profile.start_step=4",
    "profile.end_step=6",
    "profile.ranks=[0]",
]


def gpus() -> int:
    import torch

    return min(2, torch.cuda.device_count())


def overrides(results: Path, name: str, *extra: str) -> list[str]:
    return [
        "training=llama31/tiny",
        "cluster=local",
        f"results_dir={results}",
        f"run_name={name}",
        "parallelism=tp1",
        f"parallelism.num_gpus={gpus()}",
        *BUSY_MODEL,
        *extra,
    ]


def keep(*paths: Path) -> None:
    target = os.environ.get("OBSERVABILITY_ARTIFACTS")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        for path in paths:
            if path.exists():
                shutil.copy(path, Path(target) / path.name)


@pytest.fixture(scope="module")
def observed(tmp_path_factory) -> dict:
    """The run every test below reads: preflight, then training with everything on, killed (SIGKILL) after the
    step-20 checkpoint at step 26, then the same command again."""
    results = tmp_path_factory.mktemp("observed")
    extra = [
        "stages=[preflight,training]",
        f"training.train_steps={STEPS}",
        f"training.checkpoint.interval={CHECKPOINT_EVERY}",
        "training.val_interval=10",
        "training.log_interval=1",
        "telemetry.interval_s=0.5",
        # A synchronous save: the step-20 checkpoint is complete before step 21, so the kill at step 26 always
        # falls after it (an asynchronous one may still be writing then; a kill during one is
        # test_gpu_resilience.py's).
        "training.checkpoint.async_save=false",
        *PROFILE,
    ]
    if HAVE_WANDB:
        extra += ["logging.wandb.enabled=true", "logging.wandb.mode=offline"]
    run_dir = results / "observed"
    first = interrupt_at_step(overrides(results, "observed", *extra), run_dir, KILL_AFTER, signal.SIGKILL)
    killed_at = len((run_dir / "metrics.jsonl").read_text().splitlines())
    assert KILL_AFTER <= killed_at < STEPS, first[-3000:]
    assert (run_dir / "checkpoints" / "iter_0000020").is_dir()
    second = main_py(*overrides(results, "observed", *extra))
    return {"run_dir": run_dir, "first": first, "second": second.stdout + second.stderr, "killed_at": killed_at}


def test_preflight_prints_a_bandwidth_table_and_passes(observed):
    lines = [
        line
        for line in observed["first"].splitlines()
        if line.startswith("preflight") or "GB/s" in line or "MiB" in line
    ]
    print("\n" + "\n".join(lines))
    assert any(line.startswith("preflight: passed") for line in lines), observed["first"][-3000:]
    report = json.loads((observed["run_dir"] / "preflight.json").read_text())
    assert report["passed"]
    if gpus() > 1:
        assert len(report["results"]) >= 2 and report["threshold_gbps"]
        print(
            f"bus bandwidth at the largest size: {report['results'][-1]['busbw_gbps']:.1f} GB/s "
            f"(threshold {report['threshold_gbps']} GB/s, {report['threshold_source']})"
        )
    keep(observed["run_dir"] / "preflight.json")


def test_tensorboard_has_every_scalar_for_every_step_once_after_the_resume(observed):
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    from recipes.observability.tracking import SCALARS as TAGS

    run_dir = observed["run_dir"]
    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={SCALARS: 0})
    acc.Reload()
    tags = acc.Tags()["scalars"]
    metrics = read_metrics(run_dir)
    assert sorted(metrics) == list(range(1, STEPS + 1))
    # Every number metrics.jsonl has for every step (MFU only when the plan knows the GPU's peak).
    per_step = [tag for key, tag in TAGS.items() if key != "val_loss" and metrics[1].get(key) is not None]
    assert len(per_step) >= 9 and set(per_step) <= set(tags), tags
    for tag in per_step:
        steps = [e.step for e in acc.Scalars(tag)]
        assert steps == list(range(1, STEPS + 1)), (tag, steps)
    assert [e.step for e in acc.Scalars("val/loss")] == list(range(10, STEPS + 1, 10))
    # Steps 21 to the kill ran twice; TensorBoard shows the resumed run's values, as metrics.jsonl does.
    loss = {e.step: e.value for e in acc.Scalars("train/loss")}
    worst = max(abs(loss[s] - metrics[s]["loss"]) for s in range(1, STEPS + 1))
    print(
        f"\nTensorBoard: {len(per_step)} scalars x steps 1-{STEPS} once each (killed after step "
        f"{observed['killed_at']}, resumed from 20); val/loss every 10 steps; max |TB - metrics.jsonl| loss "
        f"{worst:.1e}"
    )
    assert worst < 1e-4


@pytest.mark.skipif(not HAVE_WANDB, reason="wandb is not installed (pip install wandb; it is optional)")
def test_wandb_offline_run_is_readable(observed):
    from recipes.observability.tracking import offline_runs

    run_dir = observed["run_dir"]
    runs = offline_runs(str(run_dir))
    assert len(runs) == 2, runs  # the killed start and the resumed one, one W&B run id
    # `python -m wandb`: the console script need not sit next to this interpreter (pip --target, --user).
    out = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", runs[-1]],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    history = {}
    for line in out.stdout.splitlines():
        record = json.loads(line) if line.startswith("{") else {}
        if record.get("type") == "history":
            history[record["history"]["step"]["num"]] = record["history"]["item"]
    assert sorted(history) == list(range(21, STEPS + 1)), sorted(history)
    assert all("train/loss" in item and "perf/tokens_per_s" in item for item in history.values())
    assert "wandb sync" in observed["second"]
    print(
        f"\nW&B offline: {runs[-1]} holds steps 21-{STEPS}; upload with: "
        + next(line for line in observed["second"].splitlines() if "wandb sync" in line).split(": ", 2)[-1]
    )


def test_torch_profile_window_of_two_steps_has_kernels(observed):
    trace_path = observed["run_dir"] / "profile" / "rank0_steps4-5.pt.trace.json.gz"
    assert trace_path.exists(), list((observed["run_dir"] / "profile").iterdir())
    events = json.loads(gzip.decompress(trace_path.read_bytes()))["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    ranges = {e["name"] for e in events if e.get("cat") == "user_annotation"}
    print(
        f"\ntorch trace {trace_path.name}: {trace_path.stat().st_size / 2**20:.1f} MiB, {len(events)} events, "
        f"{len(kernels)} kernels; ranges: {sorted(ranges)[:12]}"
    )
    assert len(kernels) > 100
    assert {"forward", "backward", "optimizer"} <= ranges
    keep(trace_path)


def test_telemetry_has_every_gpu_busy_during_steps_and_the_report_plots_it(observed):
    from launcher.report import telemetry as telemetry_report

    run_dir = observed["run_dir"]
    rows = telemetry_report.load(run_dir)
    steady = telemetry_report.during_steps(rows)
    summaries = telemetry_report.summarize(steady)
    print("\n" + telemetry_report.format_table(summaries, {}))
    assert [s.gpu for s in summaries] == list(range(gpus()))
    for s in summaries:
        assert s.samples >= 5 and s.util_pct > 50, s
        assert s.sm_clock_mhz and s.power_w and s.temp_c and s.mem_used_gib > 1
    report = subprocess.run(
        [sys.executable, "-m", "launcher.report", str(run_dir)], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert report.returncode == 0, report.stderr
    assert "telemetry plot:" in report.stdout and (run_dir / "telemetry.png").exists()
    print(report.stdout)
    keep(run_dir / "telemetry.png", run_dir / "report.png")


def test_a_preflight_threshold_above_the_machine_stops_the_chain_before_training(tmp_path):
    if gpus() < 2:
        pytest.skip("needs 2 GPUs (one GPU has no communication to measure)")
    result = main_py(
        *overrides(
            tmp_path,
            "too_slow",
            "stages=[preflight,training]",
            "preflight.min_busbw_gbps=100000",
            "telemetry.enabled=false",
        ),
        check=False,
    )
    output = result.stdout + result.stderr
    failed = [line for line in output.splitlines() if line.startswith("preflight: FAILED:")]
    print("\n" + "\n".join(failed))
    assert result.returncode != 0
    assert len(failed) == 1 and "preflight.min_busbw_gbps" in failed[0]
    assert "==> training" not in output and not (tmp_path / "too_slow" / "metrics.jsonl").exists()
    assert "error: stage preflight failed" in output


def test_nsys_profiles_the_window_or_says_it_is_missing(tmp_path):
    run = overrides(
        tmp_path,
        "nsys",
        "training.train_steps=8",
        "training.scheduler.warmup_steps=2",
        "profile.enabled=true",
        "profile.tool=nsys",
        "profile.start_step=3",
        "profile.end_step=5",
        "profile.ranks=[0]",
        "training.val_interval=0",
        "training.checkpoint.save_at_end=false",
    )
    if shutil.which("nsys") is None:
        result = main_py(*run, check=False)
        print("\n" + result.stderr.strip())
        assert result.returncode == 2
        assert "profile.tool=nsys needs Nsight Systems, but nsys is not on this machine's PATH" in result.stderr
        return
    main_py(*run)
    report = tmp_path / "nsys" / "profile" / "nsys_rank0.nsys-rep"
    assert report.exists() and report.stat().st_size > 0
    print(f"\nnsys: {report} ({report.stat().st_size / 2**20:.1f} MiB)")
