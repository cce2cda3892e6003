"""training.optimizer and training.scheduler: AdamW and the learning-rate schedule."""

from __future__ import annotations

from typing import Any, Mapping

from launcher.plan.findings import Findings
from launcher.plan.sizes import Sizes


def check(cfg: Mapping[str, Any], sizes: Sizes, found: Findings) -> None:
    train = cfg["training"]
    opt, sched = train["optimizer"], train["scheduler"]
    lr, min_lr = opt["lr"], opt["min_lr"]
    if lr <= 0:
        found.problem(f"training.optimizer.lr={lr} must be positive")
    if min_lr < 0:
        found.problem(f"training.optimizer.min_lr={min_lr} must be 0 or more")
    elif lr > 0 and min_lr > lr:
        found.problem(f"training.optimizer.min_lr={min_lr} must not exceed training.optimizer.lr={lr}")
    for key in ("adam_beta1", "adam_beta2"):
        if not 0 <= opt[key] < 1:
            found.problem(f"training.optimizer.{key}={opt[key]} must be in [0, 1)")
    if opt["adam_eps"] <= 0:
        found.problem(f"training.optimizer.adam_eps={opt['adam_eps']} must be positive")
    for key in ("weight_decay", "clip_grad"):
        found.at_least(f"training.optimizer.{key}", opt[key], 0)
    found.at_least("training.scheduler.warmup_steps", sched["warmup_steps"], 0)
    if found.at_least("training.scheduler.decay_steps", sched.get("decay_steps"), 1, "or null: train_steps"):
        decay = sched.get("decay_steps") or train["train_steps"]
        if 0 <= sched["warmup_steps"] and decay >= 1 and sched["warmup_steps"] >= decay:
            found.problem(
                f"training.scheduler.warmup_steps={sched['warmup_steps']} must be smaller than the decay "
                f"horizon {decay} (training.scheduler.decay_steps, or train_steps when null)"
            )
    target = train.get("target_val_loss")
    if target is not None and target <= 0:
        found.problem(f"training.target_val_loss={target} must be positive (a log perplexity) or null")
