"""A run directory belongs to one run. When the directory this config would write into already holds a run, the
two may differ only in how and where that run is run, watched or continued (OPERATIONAL); anything else would
leave another run's scripts, config or checkpoints beside this one's, so it is refused with the keys that differ
and how to name this run. A run with checkpoints is also checked for what resuming needs: the same model and
weights, and a layout the checkpoints can be resharded to."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator, Mapping

import yaml

from common.checkpoints import damaged_checkpoints, latest_checkpoint
from common.config import Config, Stage
from common.typed import to_plain
from launcher.plan.findings import Findings
from launcher.plan.formulas import padded_vocab_size
from launcher.plan.sizes import Sizes

# Keys (and sections, ending in ".") that may change between invocations sharing a run directory: a dry run then
# the real one, a resubmission with another partition or time limit, more steps, another layout to resume with
# (checked against the checkpoints below), other tracking or profiling.
OPERATIONAL = (
    "dry_run",
    "stages",
    "results_dir",
    "run_name",
    "memory_check",
    "stack_check",
    "stack.",
    "cluster.",
    "logging.",
    "profile.",
    "telemetry.",
    "preflight.",
    "resilience.",
    "parallelism.",
    "training.train_steps",
    "training.log_interval",
    "training.val_interval",
    "training.val_steps",
    "training.checkpoint.",
    "training.data.num_workers",
    "data_preparation.workers",
    "data_preparation.chunk_bytes",
    "data_preparation.download.",
    "data_preparation.job.",
    "evaluation.",
)
SHOWN = 4  # differing keys named in the message


def check(cfg: Config, sizes: Sizes, found: Findings) -> None:
    assert cfg.run_name is not None  # normalized() names the run before the checks run
    run_dir = Path(cfg.results_dir).expanduser().absolute() / cfg.run_name
    before = _load(run_dir / "config.yaml")  # plain: it may come from another version of the recipes
    newest = latest_checkpoint(str(run_dir / "checkpoints"))
    _damaged_newest(run_dir, newest, cfg.stages, found)
    if Stage.export in cfg.stages and Stage.training not in cfg.stages and newest is None:
        found.problem(
            f"stages has export but not training, and {run_dir} has no complete checkpoint to export: "
            "check run_name (and results_dir), or add training to stages"
        )
    if before is None:
        return
    now = to_plain(cfg)
    data_only = all(stages == [Stage.data_preparation] for stages in (before.get("stages"), cfg.stages))
    differing = [key for key in _differing(before, now) if not _operational(key) and _matters(key, data_only)]
    if differing:
        found.problem(_collision(run_dir, differing, before, now, has_checkpoints=newest is not None))
    elif newest is not None and Stage.training in cfg.stages and sizes.tp:
        _resharding(run_dir, before, cfg, sizes.tp, found)


def _damaged_newest(run_dir: Path, newest: tuple[int, str] | None, stages: list[Stage], found: Findings) -> None:
    """A checkpoint directory newer than the newest complete one whose state file is missing or damaged (a disk
    that filled up, a truncated copy): resuming or exporting would silently go back to the older one."""
    if not {Stage.training, Stage.export} & set(stages):
        return
    damaged = damaged_checkpoints(str(run_dir / "checkpoints"))
    newer = [d for d in damaged if newest is None or d[0] > newest[0]]
    if not newer:
        return
    step, path, why = newer[-1]
    instead = f"iter_{newest[0]:07d}, the newest complete one" if newest else "nothing: no checkpoint is complete"
    found.problem(
        f"{path} is not a complete checkpoint: {why}; the run would go on from {instead}. Move it out of "
        f"{run_dir / 'checkpoints'} (or delete it) to go on from there, or restore it from a copy"
    )


def _matters(key: str, data_only: bool) -> bool:
    """Whether a key makes two invocations different runs: for data preparation alone (now and before: data_only),
    only the data_preparation keys; training's keys do not change the data."""
    return key.startswith("data_preparation.") or not data_only


def _operational(key: str) -> bool:
    return any(key == k or (k.endswith(".") and key.startswith(k)) for k in OPERATIONAL)


def _load(path: Path) -> dict[str, Any] | None:
    # libyaml's parser where PyYAML has it, as config_yaml writes the file with its emitter: the same data, ten times
    # faster (every run into an existing directory, every point of a sweep run again).
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        return yaml.load(path.read_text(), Loader=loader)
    except (OSError, yaml.YAMLError):
        return None


def _flat(section: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(section, Mapping):
        for key, value in section.items():
            yield from _flat(value, f"{prefix}{key}.")
    else:
        yield prefix[:-1], section


def _differing(before: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """Keys both configs have with different values (a key only one has comes from another version of the
    recipes, not from the user)."""
    old, new = dict(_flat(before)), dict(_flat(now))
    return [key for key in new if key in old and old[key] != new[key]]


def _value(flat_cfg: Mapping[str, Any], key: str) -> Any:
    return dict(_flat(flat_cfg)).get(key)


def _collision(
    run_dir: Path, keys: list[str], before: Mapping[str, Any], now: Mapping[str, Any], has_checkpoints: bool
) -> str:
    shown = ", ".join(f"{k}={_value(before, k)!r} there, {_value(now, k)!r} here" for k in keys[:SHOWN])
    more = f" and {len(keys) - SHOWN} more" if len(keys) > SHOWN else ""
    holds = "checkpoints of another run" if has_checkpoints else "another run"
    return (
        f"{run_dir} holds {holds}: {shown}{more}; give this run its own directory with "
        f"run_name={now['run_name']}_2 (any free name), or resume with that run's settings"
    )


def _resharding(run_dir: Path, before: Mapping[str, Any], cfg: Config, tp: int, found: Findings) -> None:
    """A layout change resumes by resharding the checkpoints, except where the tensors themselves differ: the
    padded vocabulary (it follows TP) and the optimizer state's form. `before`: the plain config.yaml there."""
    model = cfg.training.model
    try:
        saved_vocab = json.loads((run_dir / "plan.json").read_text())["padded_vocab_size"]
    except (OSError, ValueError, KeyError):
        saved_vocab = None
    vocab = padded_vocab_size(model.vocab_size, model.make_vocab_size_divisible_by, tp)
    if saved_vocab is not None and saved_vocab != vocab:
        found.problem(
            f"parallelism.tp={tp} pads the vocabulary to {vocab} rows but the checkpoints in "
            f"{run_dir} hold {saved_vocab} (saved with parallelism.tp={before['parallelism']['tp']}): "
            "resume with that TP, or start a new run (run_name=...)"
        )
    old, new = before["parallelism"]["use_distributed_optimizer"], cfg.parallelism.use_distributed_optimizer
    if old != new:
        found.problem(
            f"the checkpoints in {run_dir} hold the optimizer state of parallelism."
            f"use_distributed_optimizer={str(old).lower()}; resume with it, or start a new run "
            "(run_name=...)"
        )
