"""How much one evaluation reads and how it splits into pipeline-schedule calls: the plan checks it, the trainer and
the MLPerf log use it."""

from __future__ import annotations

from common.config import TrainingConfig


def eval_samples(train: TrainingConfig, global_batch_size: int) -> int:
    """Sequences per evaluation: training.val_samples, else val_steps global batches."""
    return train.val_samples or train.val_steps * global_batch_size


def eval_microbatches(samples: int, micro_batch_size: int, dp_size: int, per_call: int) -> list[int]:
    """Microbatches per data-parallel rank for each pipeline-schedule call of one evaluation: calls as large as
    a training step's, the last one taking the rest (the plan checked that samples split into microbatches)."""
    total = samples // (micro_batch_size * dp_size)
    return [per_call] * (total // per_call) + ([total % per_call] if total % per_call else [])
