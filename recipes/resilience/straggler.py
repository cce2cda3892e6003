"""resilience.straggler_detection: nvidia-resiliency-ext's straggler Detector times the CUDA kernels of every
training step on every rank; every interval_steps each rank's GPU speed relative to the fastest rank's (1.0: as
fast, 0.5: twice as slow) is gathered, printed by the logging rank, written into that step's metrics.jsonl
record (`gpu_relative_perf`: [rank, node, GPU, score] per rank) and, for the ranks below the threshold, recorded
in the run's events; the report names them (launcher/report/restarts.py)."""

from __future__ import annotations

import contextlib
import socket
from typing import Any, Iterator

import torch

from common.config import StragglerConfig

try:
    from nvidia_resiliency_ext.attribution.straggler import Detector
except ImportError:  # the plan's check names the package before anything runs (cluster=local); see enabled()
    Detector = None

MISSING = (
    "error: resilience.straggler_detection.enabled=true needs nvidia-resiliency-ext, which this Python "
    "cannot import: install it (pip install nvidia-resiliency-ext), or turn the detection off"
)


class StragglerReports:
    """The Detector on this rank (it is a process-wide singleton in nvidia-resiliency-ext)."""

    def __init__(self, cfg: StragglerConfig, rank: int, local_rank: int):
        if Detector is None:
            raise SystemExit(MISSING)
        self.interval, self.threshold = cfg.interval_steps, cfg.threshold
        self.rank, self.local_rank, self.node = rank, local_rank, socket.gethostname()
        # Relative scores only (each rank against the fastest), each rank's own: the gathering is ours.
        Detector.initialize(
            scores_to_compute=["relative_perf_scores"], gather_on_rank0=False, profiling_interval=1, node_name=self.node
        )

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        with Detector.detection_section("step", profile_cuda=True):
            yield

    def due(self, step: int) -> bool:
        return step % self.interval == 0

    def report(self) -> list[list[Any]]:
        """[rank, node, GPU, score] of every rank, on every rank (two collectives: call on every rank alike)."""
        report = Detector.generate_report()
        score = report.gpu_relative_perf_scores.get(self.rank, float("nan"))
        gathered: list[Any] = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(gathered, [self.rank, self.node, self.local_rank, round(score, 4)])
        return sorted(gathered)

    def slow(self, scores: list[list[Any]]) -> list[list[Any]]:
        return [entry for entry in scores if entry[3] < self.threshold]

    def close(self) -> None:
        with contextlib.suppress(Exception):
            Detector.shutdown()


def summary(step: int, scores: list[list[Any]], threshold: float) -> str:
    """One log line: the slowest GPU, the median, and every GPU below the threshold."""
    ordered = sorted(scores, key=lambda entry: entry[3])
    rank, node, gpu, low = ordered[0]
    median = ordered[len(ordered) // 2][3]
    below = [f"{n} GPU {g} (rank {r}) {s:.2f}" for r, n, g, s in ordered if s < threshold]
    return (
        f"straggler detection at step {step}: relative GPU speed min {low:.2f} ({node} GPU {gpu}, rank {rank}), "
        f"median {median:.2f} over {len(scores)} GPUs; "
        + (f"below {threshold:g}: " + ", ".join(below) if below else f"none below {threshold:g}")
    )
