"""training.data and training.tokenizer: the blend, and for real data that its files are there, intact and made
with training's tokenizer (data_prep/checks.py reads their headers and done markers)."""

from __future__ import annotations

import os
from typing import Any

from common.config import AttentionBackend, Config, DataConfig, DataFormat, Stage
from launcher.plan.findings import Findings
from launcher.plan.sizes import Sizes

BLEND_FORMS = "[weight, prefix, weight, prefix, ...] or [prefix, ...]"


def blend_prefixes(blend: Any) -> list[str] | None:
    """The prefixes of a blend, [prefix, ...] or [weight, prefix, weight, prefix, ...]; None for anything else."""
    if not isinstance(blend, (list, tuple)) or not blend:
        return None
    if all(isinstance(x, str) for x in blend):
        return list(blend)
    if len(blend) % 2 == 0 and all(_is_number(w) and isinstance(p, str) for w, p in zip(blend[::2], blend[1::2])):
        return list(blend[1::2])
    return None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _named_blends(data: DataConfig) -> tuple[tuple[str, list[Any] | None], ...]:
    """(key under training.data, value) of the training blend and the validation blend."""
    return ("blend", data.blend), ("valid_blend", data.valid_blend)


def missing_data(data: DataConfig) -> list[str]:
    """One line per blend (training.data.blend, valid_blend) whose .bin/.idx files are not there (real data)."""
    if data.mock:
        return []
    lines = []
    for key, blend in _named_blends(data):
        missing = [p for p in blend_prefixes(blend) or [] if not _prepared(p)]
        if missing:
            lines.append(
                f"training.data.{key}: no .bin/.idx for {', '.join(missing)}; run the data_preparation "
                "stage first or fix the prefixes"
            )
    return lines


def _prepared(prefix: str) -> bool:
    return os.path.exists(prefix + ".bin") and os.path.exists(prefix + ".idx")


def check(cfg: Config, sizes: Sizes, found: Findings) -> None:
    data = cfg.training.data
    _split(data.split, found)
    if data.format == DataFormat.sft:
        _sft(cfg, found)
    if data.mock:
        for key, blend in _named_blends(data):
            if blend:
                found.problem(
                    f"training.data.mock=true ignores training.data.{key}: set training.data.mock=false "
                    f"to train on it, or training.data.{key}=null"
                )
        return
    if not _blends(data, found):
        return
    # data_prep's readers load for real data only: every mock-data run does without their import
    from data_prep.checks import prepared_data_problems
    from data_prep.tokenizer import tokenizer_problem

    tokenizer = cfg.training.tokenizer
    problem = tokenizer_problem(tokenizer.type, tokenizer.path, key="training.tokenizer")
    if problem:
        found.problem(problem)
    else:
        _vocabulary(cfg, found)
    if Stage.data_preparation in cfg.stages:
        return  # the chain prepares the data before training reads it
    for line in missing_data(data):
        found.problem_unless_dry_run(line)
    for key, blend in _named_blends(data):
        present = [p for p in blend_prefixes(blend) or [] if _prepared(p)]
        for line in prepared_data_problems(f"training.data.{key}", present, tokenizer):
            found.problem(line)
        if data.format == DataFormat.sft:
            _sft_files(f"training.data.{key}", present, cfg, found)


def _sft(cfg: Config, found: Findings) -> None:
    """Fine-tuning data: what the trainer can do with it so far."""
    data = cfg.training.data
    if data.mock:
        found.problem(
            "training.data.format=sft needs prepared samples: set training.data.mock=false and training.data.blend "
            "to the outputs of data_preparation=sft_jsonl or govreport_mlperf"
        )
    if data.blend and not all(isinstance(item, str) for item in data.blend):
        found.problem(
            f"training.data.blend weights are not used for training.data.format=sft (every sample of every prefix "
            f"is trained on, in the seed's order): list the prefixes only; got {data.blend}"
        )
    if data.packing:
        _packing(cfg, found)


def _packing(cfg: Config, found: Findings) -> None:
    """Packed sequences (THD with cu_seqlens through Transformer Engine's attention): what the trainer refuses."""
    cp, train, dtype = cfg.parallelism.cp, cfg.training, cfg.dtype
    if cp is not None and cp > 1:
        found.problem(
            f"parallelism.cp={cp} with training.data.packing=true: context parallelism over packed sequences needs "
            f"every sample padded to a multiple of 2 x cp, which the trainer does not do; set "
            "training.data.packing=false or parallelism.cp=1"
        )
    if train.cuda_graphs != "none":
        found.problem(
            f"training.cuda_graphs={train.cuda_graphs} with training.data.packing=true: each microbatch has its own "
            "number of samples (cu_seqlens), which a captured graph cannot follow; set training.cuda_graphs=none "
            "or training.data.packing=false"
        )
    if dtype.fp8 and dtype.fp8_dot_product_attention:
        found.problem(
            "dtype.fp8_dot_product_attention=true with training.data.packing=true: FP8 attention has no kernel for "
            "packed sequences (THD); set dtype.fp8_dot_product_attention=false or training.data.packing=false"
        )
    if train.model.attention_backend == AttentionBackend.unfused:
        found.problem(
            "training.model.attention_backend=unfused with training.data.packing=true: packed sequences need "
            "Transformer Engine's fused or flash attention (THD with cu_seqlens); set "
            "training.model.attention_backend=auto or training.data.packing=false"
        )


def _sft_files(key: str, prefixes: list[str], cfg: Config, found: Findings) -> None:
    """Prepared fine-tuning data: its loss mask is there, and (truncation off) no sample is longer than a sequence."""
    from data_prep.checks import longer_samples_problem
    from data_prep.shards import LOSS_MASK

    missing = [p for p in prefixes if not _prepared(p + LOSS_MASK)]
    if missing:
        found.problem(
            f"{key}: {missing[0]} has no loss mask ({LOSS_MASK[1:]}.bin/.idx): it is not fine-tuning data; "
            "prepare it with data_preparation=sft_jsonl or govreport_mlperf, or set training.data.format=pretrain"
        )
    if not cfg.training.data.truncate:
        problem = longer_samples_problem(key, prefixes, cfg.training.seq_length)
        if problem:
            found.problem(problem)


def _vocabulary(cfg: Config, found: Findings) -> None:
    """Every token id the tokenizer can give needs an embedding row: the trainer refuses a larger vocabulary on the
    ranks, after the queue wait."""
    from data_prep.tokenizer import vocabulary_size

    tokenizer, vocab = cfg.training.tokenizer, cfg.training.model.vocab_size
    size = vocabulary_size(tokenizer.type, tokenizer.path)
    if size is not None and size > vocab:
        found.problem(
            f"training.tokenizer.path={tokenizer.path} has {size:,} token ids but training.model.vocab_size="
            f"{vocab}: set training.model.vocab_size={size} (or more), or use the model's tokenizer"
        )


def _blends(data: DataConfig, found: Findings) -> bool:
    blend, valid = data.blend, data.valid_blend
    if not blend:
        found.problem(f"training.data.mock=false needs training.data.blend: {BLEND_FORMS} from data preparation")
        return False
    if blend_prefixes(blend) is None:
        found.problem(f"training.data.blend must be {BLEND_FORMS}; got {blend}")
        return False
    weights = blend[::2] if not isinstance(blend[0], str) else []
    if any(w < 0 for w in weights) or (weights and not any(w > 0 for w in weights)):
        found.problem(f"training.data.blend weights {weights} must be 0 or more with at least one above 0")
        return False
    if valid is not None and (blend_prefixes(valid) is None or not isinstance(valid[0], str)):
        found.problem(f"training.data.valid_blend must be null or [prefix, ...] (read in order); got {valid}")
        return False
    return True


def _split(split: str, found: Findings) -> None:
    parts = split.split(",")
    try:
        shares = [float(p) for p in parts]
    except ValueError:
        shares = []
    if len(shares) != 3 or any(s < 0 for s in shares) or sum(shares) <= 0:
        found.problem(f'training.data.split={split!r} must be three shares train,validation,test, e.g. "99,1,0"')
