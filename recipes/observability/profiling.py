"""The profiling window (profile.enabled): steps start_step .. end_step - 1 on the chosen ranks.

- tool=torch: torch.profiler records CPU and CUDA activity over the window and writes
  RUN_DIR/profile/rank<R>_steps<A>-<B>.pt.trace.json.gz (TensorBoard's profiler plugin, Perfetto, chrome://tracing).
- tool=nsys: the launcher started the chosen ranks under `nsys profile --capture-range=cudaProfilerApi`; the
  window opens and closes the capture with cudaProfilerStart/Stop.

Named ranges mark forward and backward (through megatron-core's `config.timers` hook, which its schedules call
around every microbatch's compute and pipeline communication), the optimizer step and checkpoint saves: NVTX
ranges for nsys, record_function ranges for the torch profiler."""

from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Iterator

import torch

from common.config import ProfileConfig
from common.run import trace_path

# megatron-core timer names -> range names.
RANGE_NAMES = {"forward-compute": "forward", "backward-compute": "backward"}


def window(profile_cfg: ProfileConfig) -> tuple[int, int]:
    """(first, last) profiled step, as numbered in the log."""
    return profile_cfg.start_step, profile_cfg.end_step - 1


def profiled_here(profile_cfg: ProfileConfig, rank: int) -> bool:
    return profile_cfg.enabled and rank in profile_cfg.ranks


class _Range:
    """One named range that can be opened and closed from different places (megatron's timer start/stop)."""

    def __init__(self, name: str, backend: "RangeBackend"):
        self.name = name
        self.backend = backend
        self.handles: list[Any] = []

    def start(self, barrier: bool = False) -> None:
        self.handles.append(self.backend.open(self.name))

    def stop(self, barrier: bool = False) -> None:
        if self.handles:
            self.backend.close(self.handles.pop())


class RangeBackend:
    """open(name) -> handle, close(handle). NVTX start/end ranges (not push/pop: megatron's timers need not nest
    strictly) or the torch profiler's record_function."""

    def __init__(self, tool: str):
        self.tool = tool

    def open(self, name: str) -> Any:
        if self.tool == "nsys":
            return torch.cuda.nvtx.range_start(name)
        handle = torch.autograd.profiler.record_function(name)
        handle.__enter__()
        return handle

    def close(self, handle: Any) -> None:
        if self.tool == "nsys":
            torch.cuda.nvtx.range_end(handle)
        else:
            handle.__exit__(None, None, None)


class RangeTimers:
    """Stands in for megatron's Timers in TransformerConfig.timers: `timers(name, log_level=...)` returns an object
    with start()/stop(); here they open and close a named range."""

    def __init__(self, backend: RangeBackend):
        self.backend = backend
        self._ranges: dict[str, _Range] = {}

    def __call__(self, name: str, log_level: int | None = None) -> _Range:
        if name not in self._ranges:
            self._ranges[name] = _Range(RANGE_NAMES.get(name, name), self.backend)
        return self._ranges[name]


class ProfileWindow:
    """Opens the profiler before the window's first step and closes it after its last one, on this rank only."""

    def __init__(
        self,
        run_dir: str,
        profile_cfg: ProfileConfig,
        rank: int,
        say: Callable[[str], None] = print,
        backend: RangeBackend | None = None,
    ):
        self.run_dir = run_dir
        self.cfg = profile_cfg
        self.rank = rank
        self.say = say
        self.tool = profile_cfg.tool
        self.first, self.last = window(profile_cfg)
        self.backend = backend or RangeBackend(self.tool)
        self._torch_profiler: Any = None  # a torch.profiler.profile while one records (torch is taken as untyped)
        self.active = False
        self.written: str | None = None

    def timers(self) -> RangeTimers:
        return RangeTimers(self.backend)

    @contextlib.contextmanager
    def range(self, name: str) -> Iterator[None]:
        handle = self.backend.open(name)
        try:
            yield
        finally:
            self.backend.close(handle)

    def step_begins(self, step: int) -> None:
        if step == self.first and not self.active:
            self._start()

    def step_ended(self, step: int) -> None:
        if self.active and step >= self.last:
            self._stop(step)

    def close(self) -> None:
        """A run that stops inside the window still gets its profile."""
        if self.active:
            self._stop(None)

    def _start(self) -> None:
        os.makedirs(os.path.join(self.run_dir, "profile"), exist_ok=True)
        if self.tool == "nsys":
            torch.cuda.synchronize()
            torch.cuda.profiler.start()  # cudaProfilerStart: nsys opens its capture range
        else:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self._torch_profiler = torch.profiler.profile(
                activities=activities,
                record_shapes=self.cfg.record_shapes,
                with_stack=self.cfg.with_stack,
            )
            self._torch_profiler.start()
        self.active = True

    def _stop(self, step: int | None) -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        last = self.last if step is None else step
        if self.tool == "nsys":
            torch.cuda.profiler.stop()
            self.say(
                f"profile: rank {self.rank} steps {self.first}-{last} captured by nsys "
                f"({os.path.join(self.run_dir, 'profile', f'nsys_rank{self.rank}.nsys-rep')} when the run ends)"
            )
        else:
            self._torch_profiler.stop()
            path = trace_path(self.run_dir, self.rank, self.first, last)
            # Written under a temporary name (ending in .gz, which makes torch compress it), then renamed.
            partial = os.path.join(os.path.dirname(path), f".partial_{os.getpid()}_{os.path.basename(path)}")
            self._torch_profiler.export_chrome_trace(partial)
            os.replace(partial, path)
            self._torch_profiler = None
            self.written = path
            self.say(f"profile: rank {self.rank} steps {self.first}-{last} -> {path}")
        self.active = False
