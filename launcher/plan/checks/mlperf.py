"""MLPerf Training runs, host side: this run's settings against the benchmark's rules (the `mlperf` section that
`training=mlperf/<benchmark>` brings), before anything is written.

A setting that differs from the rules is a note, not an error: small runs (smoke tests, tuning) change them on
purpose, and the note says that such a run is no benchmark result. Starting a benchmark that is defined from a
checkpoint with random weights is an error unless `mlperf.allow_random_init=true`.
"""

from __future__ import annotations

import math
from typing import Any

from common.config import Config, LoraConfig, MLPerfConfig, MLPerfRules, PeftConfig, TrainingConfig
from launcher.plan.findings import Findings
from launcher.plan.sizes import Sizes

# Compliance rulesets mlperf-logging has for each benchmark (compliance_checker/training_<ruleset>/).
RULESETS = {
    "llama31_8b": ("5.1.0", "6.0.0", "6.1.0"),
    "llama31_405b": ("5.1.0", "6.0.0"),
    "llama2_70b_lora": ("5.0.0", "5.1.0", "6.0.0", "6.1.0"),
}


def check(cfg: Config, sizes: Sizes, found: Findings) -> None:
    """An MLPerf run's settings against the benchmark's rules; nothing for other runs."""
    ml = cfg.mlperf
    if ml is None:
        return
    known = RULESETS.get(ml.benchmark, ())
    if ml.ruleset not in known:
        found.problem(
            f"mlperf.ruleset={ml.ruleset} has no compliance rules for {ml.benchmark}: use one of "
            f"{', '.join(known) or '(none known)'}"
        )
    if sizes.global_batch_size:
        for key, have, want, why in deviations(cfg.training, ml.rules, sizes.global_batch_size):
            found.warning(
                f"mlperf {ml.benchmark}: {key}={have} differs from the benchmark's {want} ({why}): "
                "this run is not a valid MLPerf result"
            )
    for key, have, want, why in peft_deviations(cfg.peft, ml.rules):
        found.warning(
            f"mlperf {ml.benchmark}: {key}={have} differs from the benchmark's {want} ({why}): "
            "this run is not a valid MLPerf result"
        )
    init = initial_weights_problem(ml, cfg.training)
    if init:
        found.problem_unless_dry_run(init)


def expected_settings(rules: MLPerfRules, gbs: int) -> dict[str, tuple[Any, str]]:
    """training.* key -> (the value the benchmark needs at this global batch size, where the rule comes from)."""
    want: dict[str, tuple[Any, str]] = {
        "seq_length": (rules.seq_length, "max_sequence_length"),
        "val_samples": (rules.eval_samples, "eval_samples"),
        "val_interval": (
            math.ceil(rules.eval_every_samples / gbs),
            f"an evaluation every {rules.eval_every_samples} sequences at GBS {gbs}",
        ),
        "val_skip": (
            eval_skip(rules, gbs),
            f"the first floor({rules.eval_skip_per_gbs:g} x GBS + {rules.eval_skip_base}) evaluations are skipped",
        ),
        "target_val_loss": (rules.target, "the quality target"),
        "optimizer.adam_beta1": (rules.adam_beta1, "opt_adamw_beta_1"),
        "optimizer.adam_beta2": (rules.adam_beta2, "opt_adamw_beta_2"),
        "optimizer.adam_eps": (rules.adam_eps, "opt_adamw_epsilon"),
        "optimizer.weight_decay": (rules.weight_decay, "opt_adamw_weight_decay"),
        "optimizer.clip_grad": (rules.clip_grad, "opt_gradient_clip_norm"),
    }
    reference_gbs = rules.reference_gbs
    if reference_gbs:  # LR, warmup and the schedule's horizon scale with the batch size
        # A benchmark whose rules scale with the batch size gives all three (conf/training/mlperf/llama31_405b.yaml).
        assert rules.lr_at_reference_gbs is not None and rules.warmup_steps_at_reference_gbs is not None
        want["optimizer.lr"] = (
            round(rules.lr_at_reference_gbs * gbs / reference_gbs, 8),
            f"opt_base_learning_rate x {reference_gbs} = GBS {gbs} x {rules.lr_at_reference_gbs}",
        )
        want["scheduler.warmup_steps"] = (
            math.ceil(rules.warmup_steps_at_reference_gbs * reference_gbs / gbs),
            f"opt_learning_rate_warmup_steps at GBS {gbs}",
        )
        want["scheduler.decay_steps"] = (
            math.ceil(rules.max_steps * reference_gbs / gbs),
            f"the schedule's horizon at GBS {gbs}, warmup + opt_learning_rate_decay_steps",
        )
    else:
        want["scheduler.decay_steps"] = (rules.max_steps, "max_steps")
    return want


def eval_skip(rules: MLPerfRules, gbs: int) -> int:
    """Evaluations of the cadence that do not run at the start: floor(eval_skip_per_gbs x GBS + eval_skip_base)
    (Llama 2 70B LoRA: floor(0.125 x GBS + 2)); 0 for the benchmarks without the rule. Exact in binary for 0.125."""
    return math.floor(rules.eval_skip_per_gbs * gbs + rules.eval_skip_base)


def eval_samples_counts(every: int, skip: int, gbs: int, last_step: int) -> list[int]:
    """Training samples at each evaluation of a run that trains `last_step` steps without reaching the target:
    every `every` samples (a step count of ceil(every / GBS)) except the first `skip`, and after the last step."""
    interval = math.ceil(every / gbs)
    steps = [s for s in range(interval, last_step + 1, interval) if s // interval > skip]
    if not steps or steps[-1] != last_step:
        steps.append(last_step)
    return [s * gbs for s in steps]


def peft_deviations(peft: PeftConfig, rules: MLPerfRules) -> list[tuple[str, Any, Any, str]]:
    """(peft key, its value, the benchmark's value, rule) for a LoRA benchmark's adapters."""
    if rules.lora_rank is None:
        return []
    if not isinstance(peft, LoraConfig):
        return [("peft", peft.method, "lora", "the benchmark fine-tunes with LoRA")]
    want: list[tuple[str, Any, Any, str]] = [
        ("peft.rank", peft.rank, rules.lora_rank, "lora_rank"),
        ("peft.alpha", peft.alpha, rules.lora_alpha, "lora_alpha"),
        ("peft.dropout", peft.dropout, rules.lora_dropout, "the reference's lora_dropout"),
        (
            "peft.target_modules",
            "[" + ",".join(str(t) for t in peft.target_modules) + "]",
            "[" + ",".join(rules.lora_targets or []) + "]",
            "the reference's adapted layers",
        ),
    ]
    return [w for w in want if w[2] is not None and not _same(w[1], w[2])]


def deviations(training: TrainingConfig, rules: MLPerfRules, gbs: int) -> list[tuple[str, Any, Any, str]]:
    """(training key, its value, the benchmark's value, rule) for every setting that differs from the rules."""
    out = []
    for key, (want, why) in expected_settings(rules, gbs).items():
        have = _lookup(training, key)
        if not _same(have, want):
            out.append((f"training.{key}", have, want, why))
    return out


def initial_weights_problem(ml: MLPerfConfig, training: TrainingConfig) -> str | None:
    """A benchmark that starts from a checkpoint, given none (and random weights not allowed explicitly)."""
    ckpt = training.checkpoint
    if not ml.rules.starts_from_checkpoint or ml.allow_random_init:
        return None
    if ckpt.init_from or ckpt.init_from_hf:
        return None
    base = ml.rules.base_model or "meta-llama/Llama-3.1-405B"
    return (
        f"mlperf {ml.benchmark} starts from Meta's checkpoint (init_checkpoint_step 0): set "
        f"training.checkpoint.init_from_hf=<directory of {base}> (or "
        "training.checkpoint.init_from=<checkpoint directory>), or mlperf.allow_random_init=true for a smoke test"
    )


def _lookup(section: Any, dotted: str) -> Any:
    """The value at a dotted key under a config section: `optimizer.lr` of training."""
    for part in dotted.split("."):
        section = getattr(section, part)
    return section


def _same(have: Any, want: Any) -> bool:
    if isinstance(have, (int, float)) and isinstance(want, (int, float)) and not isinstance(have, bool):
        return math.isclose(have, want, rel_tol=1e-9, abs_tol=0.0)
    return have == want
