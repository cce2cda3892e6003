"""GPU telemetry: on local rank 0 of every node, a thread samples the node's GPUs of the job through NVML
(nvidia-ml-py) every telemetry.interval_s seconds into RUN_DIR/telemetry/<node>.csv, one row per GPU and sample:
utilisation, memory, power, temperature, SM clock, clock event (throttle) reasons, the training step the
sample fell in and what else the trainer was doing (startup until its first step ends, checkpoint, validation).
`python -m launcher.report RUN_DIR` plots it and flags GPUs far below their peers.

NVML calls release the GIL (ctypes), so sampling a node's GPUs once a second costs the trainer nothing it would
notice; a thread (unlike a process) also ends with the trainer however it ends."""

from __future__ import annotations

import csv
import importlib.util
import os
import socket
import threading
import time
from functools import partial
from typing import Any, Callable, Sequence

import torch

from common.config import TelemetryConfig

COLUMNS = [
    "time",
    "node",
    "step",
    "gpu",
    "util_pct",
    "mem_util_pct",
    "mem_used_mib",
    "mem_total_mib",
    "power_w",
    "temp_c",
    "sm_clock_mhz",
    "sm_clock_max_mhz",
    "clock_events",
    "activity",
]

# NVML clock event reasons (nvmlClocksEventReason*; the older name is "throttle reasons"), as bits.
CLOCK_EVENTS = [
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
]


def clock_event_names(mask: int) -> str:
    """'sw_power_cap+hw_slowdown'; '' when the clocks run free."""
    return "+".join(name for bit, name in CLOCK_EVENTS if mask & bit)


def node_name() -> str:
    return socket.gethostname().split(".")[0]


def csv_path(run_dir: str, node: str) -> str:
    return os.path.join(run_dir, "telemetry", f"{node}.csv")


def missing_package(telemetry: TelemetryConfig) -> str | None:
    if telemetry.enabled and importlib.util.find_spec("pynvml") is None:
        return (
            "telemetry.enabled=true needs NVML's Python bindings: pip install nvidia-ml-py, or set "
            "telemetry.enabled=false"
        )
    return None


def job_gpu_ids(count: int) -> list[str]:
    """NVML identifiers of this process's CUDA devices 0..count-1 (those the node's ranks use). By UUID, because
    NVML ignores CUDA_VISIBLE_DEVICES and may number GPUs differently from CUDA; by NVML index when CUDA cannot
    say."""
    try:
        uuids = [str(torch.cuda.get_device_properties(i).uuid) for i in range(count)]
        return [u if u.startswith(("GPU-", "MIG-")) else f"GPU-{u}" for u in uuids]
    except Exception:
        visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
        return visible[:count] if visible else [str(i) for i in range(count)]


def _read(call: Callable[[], Any], scale: float = 1.0, digits: int = 1) -> str:
    """A metric as text, or '' where the GPU does not report it (NVML raises NotSupported and alike)."""
    try:
        value = call()
    except Exception:
        return ""
    return f"{value * scale:.{digits}f}" if digits else str(int(value * scale))


class Sampler:
    """The sampling thread; the trainer sets `step` after every step, and `activity` until its first step ends
    (startup), while it saves a checkpoint or validates: those samples are not the steps' and the report leaves
    them out."""

    def __init__(
        self,
        nvml: Any,
        gpu_ids: Sequence[str],
        path: str,
        node: str,
        interval_s: float,
        clock: Callable[[], float] = time.time,
    ):
        self.nvml = nvml
        self.path = path
        self.node = node
        self.interval_s = interval_s
        self.clock = clock
        self.step = 0
        self.activity = "startup"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        nvml.nvmlInit()
        self.handles = [self._handle(gpu_id, position) for position, gpu_id in enumerate(gpu_ids)]

    def _handle(self, gpu_id: str, position: int):
        if gpu_id.isdigit():
            return self.nvml.nvmlDeviceGetHandleByIndex(int(gpu_id))
        try:
            return self.nvml.nvmlDeviceGetHandleByUUID(gpu_id)
        except Exception:  # a UUID form NVML does not take: the CUDA order, which matches NVML's on one model
            return self.nvml.nvmlDeviceGetHandleByIndex(position)

    def _clock_events(self, handle) -> int:
        get = (
            getattr(self.nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
            or self.nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        return int(get(handle))

    def sample(self) -> list[list[str]]:
        """One row per GPU, in COLUMNS order."""
        nvml, now, step, activity = self.nvml, self.clock(), self.step, self.activity
        rows = []
        for index, handle in enumerate(self.handles):
            util = _try(partial(nvml.nvmlDeviceGetUtilizationRates, handle))
            memory = _try(partial(nvml.nvmlDeviceGetMemoryInfo, handle))
            events = _try(partial(self._clock_events, handle))
            rows.append(
                [
                    f"{now:.3f}",
                    self.node,
                    str(step),
                    str(index),
                    "" if util is None else str(util.gpu),
                    "" if util is None else str(util.memory),
                    "" if memory is None else f"{memory.used / 2**20:.0f}",
                    "" if memory is None else f"{memory.total / 2**20:.0f}",
                    _read(partial(nvml.nvmlDeviceGetPowerUsage, handle), scale=1e-3),
                    _read(partial(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU), digits=0),
                    _read(partial(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM), digits=0),
                    _read(partial(nvml.nvmlDeviceGetMaxClockInfo, handle, nvml.NVML_CLOCK_SM), digits=0),
                    "" if events is None else clock_event_names(events),
                    activity,
                ]
            )
        return rows

    def start(self) -> "Sampler":
        self._thread = threading.Thread(target=self._run, name="gpu-telemetry", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        new = not os.path.exists(self.path) or os.path.getsize(self.path) == 0
        # Appended (a resumed run continues the same file) and flushed per sample: a crash loses one row at most.
        with open(self.path, "a", newline="") as f:
            writer = csv.writer(f)
            if new:
                writer.writerow(COLUMNS)
            while True:
                started = time.monotonic()
                writer.writerows(self.sample())
                f.flush()
                if self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - started))):
                    break

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        try:
            self.nvml.nvmlShutdown()
        except Exception:
            pass


def _try(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except Exception:
        return None


def start(
    run_dir: str, interval_s: float, gpu_ids: Sequence[str], nvml: Any = None, node: str | None = None
) -> Sampler:
    """Sample the GPUs `gpu_ids` every `interval_s` seconds (telemetry.interval_s) into this node's CSV."""
    if nvml is None:
        import pynvml  # nvidia-ml-py, an optional package: only telemetry.enabled needs it

        nvml = pynvml
    node = node or node_name()
    return Sampler(nvml, gpu_ids, csv_path(run_dir, node), node, interval_s).start()
