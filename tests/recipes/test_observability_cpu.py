"""Tracking, profiling and telemetry on CPU: TensorBoard event files read back with TensorBoard's own reader
(every scalar for every step, also across a crash and resume), a W&B offline run read back with `wandb leet
inspect`, a torch profiler window, the forward/backward ranges megatron's timer hook opens, and the NVML sampler
against a stand-in NVML."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from launcher.config.compose import compose
from launcher.plan.build import build_plan
from common.checkpoints import TrainState
from recipes.observability import profiling, telemetry, tracking
from recipes.observability.observers import Observers
from recipes.trainer import metrics
from recipes.runtime.ranks import RankInfo

REPO = Path(__file__).resolve().parents[2]


def plan_for(*overrides):
    cfg = compose(list(overrides))
    return cfg, build_plan(cfg)


def record(plan, step: int, loss: float, val_loss: float | None = None) -> metrics.StepMetrics:
    return metrics.step_metrics(
        plan,
        step=step,
        loss=loss,
        lr=1e-3 * step,
        grad_norm=0.5,
        step_time_s=0.25,
        consumed_samples=8 * step,
        val_loss=val_loss,
        peak_memory_gib=1.5,
    )


def scalars_by_tag(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """What TensorBoard shows: its EventAccumulator over every event file (purges applied), all values kept."""
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={SCALARS: 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


# ----------------------------------------------------------------------------- TensorBoard
def test_scalars_cover_every_metric_and_leave_out_absent_ones():
    _, plan = plan_for()
    values = tracking.scalars(record(plan, 3, 7.5))
    assert values["train/loss"] == 7.5 and values["train/lr"] == pytest.approx(3e-3)
    assert values["perf/step_time_s"] == 0.25 and values["memory/peak_gib"] == 1.5
    assert values["perf/tokens_per_s"] == pytest.approx(8 * 2048 / 0.25)
    assert "val/loss" not in values and "perf/mfu" not in values  # no validation; no GPU peak in a CPU plan
    assert set(tracking.scalars(record(plan, 4, 7.0, val_loss=7.2))) - set(values) == {"val/loss"}


FIRST_SEGMENT = """
import os, sys
sys.path.insert(0, {repo!r})
from launcher.config.compose import compose
from launcher.plan.build import build_plan
from recipes.observability import tracking
from recipes.trainer import metrics
cfg = compose([]); plan = build_plan(cfg)
import time
real_time = time.time
time.time = lambda: real_time() - 3600  # started an hour before the resume (event files sort by start time)
tracker = tracking.Tracker({run_dir!r}, cfg, plan, resume_step=0)
for step in range(1, {killed_after} + 1):
    tracker.log(metrics.step_metrics(plan, step=step, loss=10.0 - 0.1 * step, lr=1e-3, grad_norm=0.5,
                                     step_time_s=0.25, consumed_samples=8 * step,
                                     val_loss=9.0 if step == 10 else None, peak_memory_gib=1.5))
os._exit(9)  # killed; the run resumes from its last checkpoint (or from scratch when it saved none)
"""


@pytest.mark.parametrize("killed_after,resume_step", [(13, 10), (5, 0)])
def test_tensorboard_has_every_step_once_across_a_crash_and_resume(tmp_path, killed_after, resume_step):
    cfg, plan = plan_for()
    crashed = subprocess.run(
        [sys.executable, "-c", FIRST_SEGMENT.format(repo=str(REPO), run_dir=str(tmp_path), killed_after=killed_after)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert crashed.returncode == 9, crashed.stderr
    before = scalars_by_tag(tmp_path / "tensorboard")
    assert [s for s, _ in before["train/loss"]] == list(range(1, killed_after + 1))

    resumed = tracking.Tracker(str(tmp_path), cfg, plan, resume_step=resume_step)
    for step in range(resume_step + 1, 21):
        resumed.log(record(plan, step, 20.0 + step, val_loss=8.0 if step == 20 else None))
    resumed.close()

    after = scalars_by_tag(tmp_path / "tensorboard")
    for tag in (
        "train/loss",
        "train/lr",
        "train/grad_norm",
        "train/consumed_samples",
        "perf/step_time_s",
        "perf/tokens_per_s",
        "perf/tokens_per_s_per_gpu",
        "perf/tflops_per_gpu",
        "memory/peak_gib",
    ):
        assert [s for s, _ in after[tag]] == list(range(1, 21)), tag
    loss = dict(after["train/loss"])
    # Steps up to the checkpoint from the killed run, every later one (re-run ones included) from the resumed run.
    assert [loss[s] for s in range(1, 21)] == pytest.approx(
        [10.0 - 0.1 * s if s <= resume_step else 20.0 + s for s in range(1, 21)]
    )
    assert after["val/loss"] == ([(10, 9.0)] if resume_step >= 10 else []) + [(20, 8.0)]


def test_tensorboard_records_config_and_plan_as_hyperparameters(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    cfg, plan = plan_for("training.train_steps=77")
    tracking.Tracker(str(tmp_path), cfg, plan, resume_step=0).close()
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    content = acc.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    hparams = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams
    assert hparams["config.training.train_steps"].number_value == 77
    assert hparams["plan.global_batch_size"].number_value == plan.global_batch_size
    assert hparams["config.parallelism.name"].string_value == cfg.parallelism.name
    assert {"config/text_summary", "plan/text_summary"} <= set(acc.Tags()["tensors"])


def test_tensorboard_off_writes_nothing(tmp_path):
    cfg, plan = plan_for("logging.tensorboard=false")
    tracker = tracking.Tracker(str(tmp_path), cfg, plan, resume_step=0)
    tracker.log(record(plan, 1, 5.0))
    tracker.close()
    assert not (tmp_path / "tensorboard").exists()


# ----------------------------------------------------------------------------- W&B
def test_wandb_mode_auto_goes_offline_without_a_server_or_a_key():
    assert tracking.wandb_mode("auto", reachable=lambda: True, has_key=lambda: True) == "online"
    assert tracking.wandb_mode("auto", reachable=lambda: False, has_key=lambda: True) == "offline"
    assert tracking.wandb_mode("auto", reachable=lambda: True, has_key=lambda: False) == "offline"
    assert tracking.wandb_mode("offline", reachable=lambda: True, has_key=lambda: True) == "offline"
    assert tracking.wandb_mode("online", reachable=lambda: False, has_key=lambda: False) == "online"


def wandb_history(run: Path) -> tuple[dict, dict[int, dict]]:
    """(config, step -> logged values) of an offline run, as W&B's own reader of the .wandb log shows them."""
    wandb_cli = Path(sys.executable).parent / "wandb"
    out = subprocess.run(
        [str(wandb_cli), "leet", "inspect", "--json", str(run)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    records = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    config = next(r["run"]["config"]["update"] for r in records if r["type"] == "run")
    history = {r["history"]["step"]["num"]: r["history"]["item"] for r in records if r["type"] == "history"}
    return config, history


WANDB_SEGMENTS = """
import json, sys
sys.path.insert(0, {repo!r})
from launcher.config.compose import compose
from launcher.plan.build import build_plan
from recipes.observability import tracking
from recipes.trainer import metrics
cfg = compose(["logging.wandb.enabled=true", "logging.wandb.mode=offline", "logging.tensorboard=false"])
plan = build_plan(cfg)
said = []
for resume_step, last in ((0, 5), (5, 8)):  # a run, then its resume from step 5
    tracker = tracking.Tracker({run_dir!r}, cfg, plan, resume_step=resume_step, say=said.append)
    for step in range(resume_step + 1, last + 1):
        tracker.log(metrics.step_metrics(plan, step=step, loss=10.0 - step, lr=1e-3, grad_norm=0.5, step_time_s=0.25,
                                         consumed_samples=8 * step, val_loss=3.0 if step == 8 else None))
    tracker.close()
print(json.dumps({{"said": said, "train_steps": cfg.training.train_steps, "gbs": plan.global_batch_size}}))
"""


def test_offline_runs_are_listed_in_the_order_they_started(tmp_path):
    names = [
        "offline-run-20261123_075817-abc-10",
        "offline-run-20261123_075817-abc-2",
        "offline-run-20261123_075818-abc",
        "offline-run-20261123_075817-abc",
    ]
    for name in names:
        (tmp_path / "wandb" / name).mkdir(parents=True)
    assert [Path(r).name for r in tracking.offline_runs(str(tmp_path))] == [
        "offline-run-20261123_075817-abc",
        "offline-run-20261123_075817-abc-2",
        "offline-run-20261123_075817-abc-10",
        "offline-run-20261123_075818-abc",
    ]


def test_wandb_offline_run_is_readable_and_a_resume_continues_the_same_run(tmp_path):
    pytest.importorskip("wandb", reason="wandb is not installed")
    # In a process of its own: W&B leaves threads behind, which would receive this process's signals.
    run = subprocess.run(
        [sys.executable, "-c", WANDB_SEGMENTS.format(repo=str(REPO), run_dir=str(tmp_path))],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "WANDB_SILENT": "true"},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])

    runs = tracking.offline_runs(str(tmp_path))
    assert len(runs) == 2
    run_id = (tmp_path / tracking.WANDB_ID_FILE).read_text().strip()
    # One W&B run, continued (a start within the same second as the previous one gets a -1 suffix).
    assert all(re.fullmatch(rf"offline-run-\d{{8}}_\d{{6}}-{run_id}(-\d+)?", Path(r).name) for r in runs), runs
    config, history = wandb_history(Path(runs[0]))
    assert sorted(history) == [1, 2, 3, 4, 5]
    assert history[3]["train/loss"] == 7.0 and history[3]["perf/step_time_s"] == 0.25
    assert config["config"]["training"]["train_steps"] == result["train_steps"]
    assert config["plan"]["global_batch_size"] == result["gbs"]
    _, history = wandb_history(Path(runs[1]))
    assert sorted(history) == [6, 7, 8] and history[8]["val/loss"] == 3.0
    assert result["said"][-1] == (
        f"wandb: offline run in {tmp_path / 'wandb'}; upload it from a machine with "
        f"internet: wandb sync {runs[0]} {runs[1]}"
    )


# ----------------------------------------------------------------------------- profiling
class RecordingBackend(profiling.RangeBackend):
    def __init__(self):
        super().__init__("nsys")
        self.events: list[tuple[str, str]] = []

    def open(self, name):
        self.events.append(("open", name))
        return name

    def close(self, handle):
        self.events.append(("close", handle))


def test_megatron_timer_calls_become_named_ranges():
    backend = RecordingBackend()
    timers = profiling.RangeTimers(backend)
    # The calls megatron-core's schedules make (schedules.py forward_step / backward_step / p2p communication).
    timers("forward-compute", log_level=2).start()
    timers("forward-recv", log_level=2).start()
    timers("forward-compute").stop()  # not strictly nested: ranges are start/end, not push/pop
    timers("forward-recv").stop()
    timers("backward-compute", log_level=2).start(barrier=False)
    timers("backward-compute").stop()
    timers("backward-compute").stop()  # an unmatched stop is ignored
    assert backend.events == [
        ("open", "forward"),
        ("open", "forward-recv"),
        ("close", "forward"),
        ("close", "forward-recv"),
        ("open", "backward"),
        ("close", "backward"),
    ]


def test_torch_profiler_window_writes_a_trace_with_the_named_ranges(tmp_path):
    cfg, _ = plan_for("profile.enabled=true", "profile.start_step=2", "profile.end_step=4")
    window = profiling.ProfileWindow(str(tmp_path), cfg.profile, rank=0, say=lambda m: None)
    timers = window.timers()
    model = torch.nn.Linear(64, 64)
    for step in range(1, 6):
        window.step_begins(step)
        timers("forward-compute", log_level=2).start()
        loss = model(torch.randn(8, 64)).square().mean()
        timers("forward-compute").stop()
        timers("backward-compute", log_level=2).start()
        loss.backward()
        timers("backward-compute").stop()
        with window.range("optimizer"):
            model.weight.data -= 0.01 * model.weight.grad
        window.step_ended(step)
    assert window.written == profiling.trace_path(str(tmp_path), 0, 2, 3)
    assert [p.name for p in (tmp_path / "profile").iterdir()] == ["rank0_steps2-3.pt.trace.json.gz"]
    trace = json.loads(gzip.decompress(Path(window.written).read_bytes()))
    names = [e.get("name") for e in trace["traceEvents"]]
    assert names.count("forward") == 2 and names.count("backward") == 2 and names.count("optimizer") == 2
    assert any(n == "aten::addmm" for n in names)  # the model's own ops were recorded


def test_a_run_that_stops_inside_the_window_still_writes_its_trace(tmp_path):
    cfg, _ = plan_for("profile.enabled=true", "profile.start_step=1", "profile.end_step=4")
    window = profiling.ProfileWindow(str(tmp_path), cfg.profile, rank=3, say=lambda m: None)
    window.step_begins(1)
    torch.ones(4).sum()
    window.step_ended(1)
    window.close()
    assert window.written == profiling.trace_path(str(tmp_path), 3, 1, 3)
    assert json.loads(gzip.decompress(Path(window.written).read_bytes()))["traceEvents"]


def test_nsys_window_opens_and_closes_the_cuda_profiler_capture(tmp_path, monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(torch.cuda.profiler, "start", lambda: calls.append("cudaProfilerStart"))
    monkeypatch.setattr(torch.cuda.profiler, "stop", lambda: calls.append("cudaProfilerStop"))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: calls.append("synchronize"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cfg, _ = plan_for("profile.enabled=true", "profile.tool=nsys", "profile.start_step=3", "profile.end_step=5")
    window = profiling.ProfileWindow(str(tmp_path), cfg.profile, rank=0, say=lambda m: None, backend=RecordingBackend())
    for step in range(1, 8):
        window.step_begins(step)
        calls.append(f"step {step}")
        window.step_ended(step)
    assert calls == [
        "step 1",
        "step 2",
        "synchronize",
        "cudaProfilerStart",
        "step 3",
        "step 4",
        "synchronize",
        "cudaProfilerStop",
        "step 5",
        "step 6",
        "step 7",
    ]


def test_only_the_chosen_ranks_profile():
    cfg, _ = plan_for("profile.enabled=true", "profile.ranks=[0,3]")
    assert [r for r in range(5) if profiling.profiled_here(cfg.profile, r)] == [0, 3]
    assert not profiling.profiled_here(plan_for()[0].profile, 0)  # disabled by default


# ----------------------------------------------------------------------------- telemetry
class NotSupported(Exception):
    pass


class FakeNvml:
    """The pynvml calls the sampler makes, for two GPUs known by UUID; GPU-b reports no power."""

    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1

    def __init__(self):
        self.gpus = {
            "GPU-a": dict(
                util=97,
                mem=40,
                used=30 * 2**30,
                total=80 * 2**30,
                power=650_000,
                temp=61,
                sm=1980,
                sm_max=1980,
                events=0x4,
            ),
            "GPU-b": dict(
                util=12,
                mem=3,
                used=2**30,
                total=80 * 2**30,
                power=None,
                temp=40,
                sm=1410,
                sm_max=1980,
                events=0x1 | 0x20,
            ),
        }
        self.shutdown = False

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        self.shutdown = True

    def nvmlDeviceGetHandleByUUID(self, uuid):
        return self.gpus[uuid]

    def nvmlDeviceGetHandleByIndex(self, index):
        return list(self.gpus.values())[index]

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=h["util"], memory=h["mem"])

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(used=h["used"], total=h["total"])

    def nvmlDeviceGetPowerUsage(self, h):
        if h["power"] is None:
            raise NotSupported()
        return h["power"]

    def nvmlDeviceGetTemperature(self, h, sensor):
        return h["temp"]

    def nvmlDeviceGetClockInfo(self, h, clock):
        return h["sm"]

    def nvmlDeviceGetMaxClockInfo(self, h, clock):
        return h["sm_max"]

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return h["events"]


def test_a_sample_has_one_row_per_gpu_with_every_metric(tmp_path):
    sampler = telemetry.Sampler(
        FakeNvml(), ["GPU-a", "GPU-b"], str(tmp_path / "n.csv"), "node7", 1.0, clock=lambda: 1234.5
    )
    assert sampler.activity == "startup"  # until the trainer's first step ends
    sampler.step, sampler.activity = 42, ""
    rows = [dict(zip(telemetry.COLUMNS, row)) for row in sampler.sample()]
    assert rows[0] == {
        "time": "1234.500",
        "node": "node7",
        "step": "42",
        "gpu": "0",
        "util_pct": "97",
        "mem_util_pct": "40",
        "mem_used_mib": "30720",
        "mem_total_mib": "81920",
        "power_w": "650.0",
        "temp_c": "61",
        "sm_clock_mhz": "1980",
        "sm_clock_max_mhz": "1980",
        "clock_events": "sw_power_cap",
        "activity": "",
    }
    assert rows[1]["power_w"] == "" and rows[1]["clock_events"] == "gpu_idle+sw_thermal_slowdown"
    assert rows[1]["gpu"] == "1" and rows[1]["sm_clock_mhz"] == "1410"
    sampler.activity = "checkpoint"
    assert [row[-1] for row in sampler.sample()] == ["checkpoint", "checkpoint"]


def test_a_uuid_nvml_does_not_know_falls_back_to_the_cuda_order(tmp_path):
    sampler = telemetry.Sampler(FakeNvml(), ["GPU-unknown", "GPU-a"], str(tmp_path / "n.csv"), "n", 1.0)
    assert [row[4] for row in sampler.sample()] == ["97", "97"]  # position 0 -> NVML index 0 (GPU-a); then GPU-a


def test_the_sampler_thread_writes_the_csv_the_report_reads_and_a_resume_appends(tmp_path):
    from launcher.report import telemetry as telemetry_report

    nvml = FakeNvml()
    for step in (5, 9):  # two starts of the same run (a resume) write into one file
        sampler = telemetry.start(str(tmp_path), 0.01, ["0", "1"], nvml=nvml, node="node7")
        sampler.step = step
        sampler.stop()
        assert nvml.shutdown
    path = Path(telemetry.csv_path(str(tmp_path), "node7"))
    lines = path.read_text().splitlines()
    assert lines[0] == ",".join(telemetry.COLUMNS) and lines.count(lines[0]) == 1
    rows = telemetry_report.read_csv(path)
    assert len(rows) >= 4 and {r.gpu for r in rows} == {0, 1}
    assert rows[0].util_pct == 97 and rows[1].util_pct == 12 and rows[1].power_w is None


def test_job_gpus_follow_cuda_visible_devices_when_cuda_cannot_name_them(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6")
    assert telemetry.job_gpu_ids(2) == ["4", "5"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert telemetry.job_gpu_ids(2) == ["0", "1"]


# ----------------------------------------------------------------------------- what the trainer calls
def test_observers_on_the_last_rank_track_profile_and_close(tmp_path):
    cfg, plan = plan_for(
        "telemetry.enabled=false", "profile.enabled=true", "profile.start_step=1", "profile.end_step=2"
    )
    observers = Observers(str(tmp_path), cfg, plan, RankInfo(0, 0, 1, "127.0.0.1", 0))
    model_config = SimpleNamespace(timers=None)
    observers.model_ready(model_config, resume_step=0)
    assert isinstance(model_config.timers, profiling.RangeTimers)
    for step in (1, 2):
        observers.step_starts(step)
        with observers.range("optimizer"):
            torch.ones(3).sum()
        observers.step_ends(step)
        observers.logged(record(plan, step, 5.0))
    observers.close()
    observers.close()  # twice is harmless
    assert (tmp_path / "profile" / "rank0_steps1-1.pt.trace.json.gz").exists()
    assert [s for s, _ in scalars_by_tag(tmp_path / "tensorboard")["train/loss"]] == [1, 2]


def test_observers_on_other_ranks_do_nothing(tmp_path):
    cfg, plan = plan_for("telemetry.enabled=false", "profile.enabled=true")
    observers = Observers(str(tmp_path), cfg, plan, RankInfo(1, 1, 4, "127.0.0.1", 0))
    model_config = SimpleNamespace(timers=None)
    observers.model_ready(model_config, resume_step=0)
    observers.logged(record(plan, 1, 5.0))
    observers.close()
    assert model_config.timers is None and not any(tmp_path.iterdir())


def test_telemetry_starts_on_local_rank_0_only_and_marks_checkpoints_and_validation(tmp_path, monkeypatch):
    started = []
    sampler = SimpleNamespace(step=0, activity="startup", stop=lambda: None)
    monkeypatch.setattr(telemetry, "missing_package", lambda cfg: None)
    monkeypatch.setattr(telemetry, "start", lambda run_dir, interval_s, gpus: started.append(gpus) or sampler)
    cfg, plan = plan_for("logging.tensorboard=false")
    observers = [Observers(str(tmp_path), cfg, plan, RankInfo(r, r, 2, "h", 0)) for r in (0, 1)]
    assert started == [["0"]]  # plan.gpus_per_node GPUs of this node, sampled by local rank 0 only
    observers[0].model_ready(SimpleNamespace(timers=None), resume_step=6)
    observers[0].save_starts(6)  # e.g. training.checkpoint.save_initial
    assert sampler.activity == "checkpoint"
    observers[0].save_ends(6)
    assert sampler.activity == "startup" and sampler.step == 6
    observers[0].step_ends(7)
    assert sampler.activity == "" and sampler.step == 7
    state = TrainState(step=7, consumed_samples=56)
    observers[0].evaluation_starts(state)
    assert sampler.activity == "validation"
    observers[0].evaluation_ends(state, 3.0, run_goes_on=True)
    with observers[0].range("optimizer"):
        assert sampler.activity == ""
    assert sampler.activity == ""
    for o in observers:
        o.close()


def test_missing_packages_stop_every_rank_with_one_line_each(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name in ("tensorboard", "wandb", "pynvml") else real(name, *a),
    )
    cfg, plan = plan_for("logging.wandb.enabled=true")
    with pytest.raises(SystemExit) as stop:
        Observers(str(tmp_path), cfg, plan, RankInfo(0, 0, 2, "h", 0))
    assert str(stop.value).splitlines() == [
        "error: logging.tensorboard=true needs the tensorboard package: pip install tensorboard, or set "
        "logging.tensorboard=false",
        "error: logging.wandb.enabled=true needs the wandb package: pip install wandb, or set "
        "logging.wandb.enabled=false",
        "error: telemetry.enabled=true needs NVML's Python bindings: pip install nvidia-ml-py, or set "
        "telemetry.enabled=false",
    ]
