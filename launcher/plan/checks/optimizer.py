"""training.optimizer and training.scheduler: AdamW and the learning-rate schedule."""

from __future__ import annotations

from common.config import Config
from launcher.plan.findings import Findings
from launcher.plan.sizes import Sizes


def check(cfg: Config, sizes: Sizes, found: Findings) -> None:
    train = cfg.training
    opt, sched = train.optimizer, train.scheduler
    lr, min_lr = opt.lr, opt.min_lr
    if min_lr > lr:
        found.problem(f"training.optimizer.min_lr={min_lr} must not exceed training.optimizer.lr={lr}")
    decay = sched.decay_steps or train.train_steps
    if sched.warmup_steps >= decay:
        found.problem(
            f"training.scheduler.warmup_steps={sched.warmup_steps} must be smaller than the decay "
            f"horizon {decay} (training.scheduler.decay_steps, or train_steps when null)"
        )
