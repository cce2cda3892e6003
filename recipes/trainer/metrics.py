"""Per-step numbers: throughput and MFU (REFERENCE.md's formulas), the NeMo-compatible progress line, and
metrics.jsonl."""

from __future__ import annotations

from dataclasses import asdict, dataclass
import json
import os
from typing import TextIO

from common.checkpoints import TrainState
from common.plan import Plan
from recipes.runtime.callbacks import Callback, Stop


@dataclass
class StepMetrics:
    step: int
    loss: float
    lr: float
    grad_norm: float
    step_time_s: float
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    tflops_per_gpu: float
    mfu: float | None
    mfu_peak_flops: float | None
    consumed_samples: int
    val_loss: float | None = None
    # Fine-tuning: the tokens the loss was taken over (the loss mask's: no prompt, no padding) and their rate
    trained_tokens: int | None = None
    trained_tokens_per_s: float | None = None
    peak_memory_gib: float | None = None  # the largest of any rank's peak allocation so far
    # resilience.straggler_detection's report of this step: [rank, node, GPU, relative speed] per rank
    gpu_relative_perf: list | None = None


def step_metrics(
    plan: Plan,
    *,
    step: int,
    loss: float,
    lr: float,
    grad_norm: float,
    step_time_s: float,
    consumed_samples: int,
    val_loss: float | None = None,
    trained_tokens: int | None = None,
    peak_memory_gib: float | None = None,
    gpu_relative_perf: list | None = None,
) -> StepMetrics:
    tokens = plan.global_batch_size * plan.seq_length
    flops_per_gpu = plan.global_batch_size * plan.model_flops_per_sample / step_time_s / plan.num_gpus
    peak = plan.peak_flops_per_gpu
    return StepMetrics(
        step=step,
        loss=loss,
        lr=lr,
        grad_norm=grad_norm,
        step_time_s=step_time_s,
        tokens_per_s=tokens / step_time_s,
        tokens_per_s_per_gpu=tokens / step_time_s / plan.num_gpus,
        tflops_per_gpu=flops_per_gpu / 1e12,
        mfu=(flops_per_gpu / peak) if peak else None,
        mfu_peak_flops=peak,
        consumed_samples=consumed_samples,
        val_loss=val_loss,
        trained_tokens=trained_tokens,
        trained_tokens_per_s=None if trained_tokens is None else trained_tokens / step_time_s,
        peak_memory_gib=peak_memory_gib,
        gpu_relative_perf=gpu_relative_perf,
    )


def progress_line(m: StepMetrics, train_steps: int) -> str:
    """The key=value fields NeMo's progress bar prints (reduced_train_loss, global_step, consumed_samples,
    train_step_timing in s), so tools that parse NeMo logs read ours too."""
    parts = [
        f"step {m.step}/{train_steps}",
        f"reduced_train_loss={m.loss:.4f}",
        f"global_step={m.step}",
        f"consumed_samples={m.consumed_samples}",
        f"train_step_timing in s={m.step_time_s:.4f}",
        f"lr={m.lr:.3e}",
        f"grad_norm={m.grad_norm:.3f}",
        f"tokens_per_s={m.tokens_per_s:.0f}",
        f"tflops_per_gpu={m.tflops_per_gpu:.1f}",
    ]
    if m.trained_tokens_per_s is not None:
        parts.append(f"trained_tokens_per_s={m.trained_tokens_per_s:.0f}")
    if m.mfu is not None:
        parts.append(f"mfu={m.mfu:.3f}")
    if m.val_loss is not None:
        parts.append(f"val_loss={m.val_loss:.4f}")
    if m.peak_memory_gib is not None:
        parts.append(f"peak_memory_gib={m.peak_memory_gib:.1f}")
    return " | ".join(parts)


class MetricsFile(Callback):
    """RUN/metrics.jsonl, one JSON object per logged step, written by the logging rank. Opened when training starts
    (after the guard read where the process before got to): a resumed run drops the records past the step it
    resumed from, so the file stays one record per step."""

    def __init__(self, path: str):
        self.path = path
        self._file: TextIO | None = None

    def training_starts(self, state: TrainState) -> None:
        if os.path.exists(self.path):
            kept = []
            with open(self.path) as f:
                for line in f:
                    try:
                        if json.loads(line)["step"] <= state.step:
                            kept.append(line if line.endswith("\n") else line + "\n")
                    except (ValueError, KeyError):
                        continue  # a line cut by a crash
            with open(self.path, "w") as f:
                f.writelines(kept)
        self._file = open(self.path, "a")

    def logged(self, record: StepMetrics) -> None:
        fields = {k: v for k, v in asdict(record).items() if v is not None or k in ("mfu", "mfu_peak_flops")}
        if self._file is None:
            raise RuntimeError(f"{self.path}: a step was logged before training started")
        self._file.write(json.dumps(fields) + "\n")
        self._file.flush()

    def stops(self, stop: Stop) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
