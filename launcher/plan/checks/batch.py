"""training: batch, sequence, steps and evaluation sizes, against the layout."""

from __future__ import annotations

from common.config import Config
from launcher.plan.findings import Findings
from launcher.plan.sizes import Sizes


def check(cfg: Config, sizes: Sizes, found: Findings) -> None:
    _sequence(cfg, sizes, found)
    _skip(cfg, found)
    if sizes.dp and sizes.micro_batch_size and sizes.global_batch_size:
        _batch(cfg, sizes, found)


def _skip(cfg: Config, found: Findings) -> None:
    train = cfg.training
    if train.val_skip and not train.val_interval:
        found.problem(
            f"training.val_skip={train.val_skip} skips evaluations of a run that never evaluates "
            "(training.val_interval=0): set training.val_interval, or training.val_skip=0"
        )


def _sequence(cfg: Config, sizes: Sizes, found: Findings) -> None:
    seq, tp, cp = cfg.training.seq_length, sizes.tp, sizes.cp
    if not (tp and cp):
        return
    if cp > 1 and seq % (2 * cp):
        found.problem(f"training.seq_length={seq} must be divisible by 2 x parallelism.cp={2 * cp}")
    elif cfg.parallelism.sequence_parallel and tp > 1 and (seq // cp) % tp:
        found.problem(
            f"training.seq_length / parallelism.cp = {seq // cp} must be divisible by parallelism.tp={tp} "
            "for sequence parallelism"
        )


def _batch(cfg: Config, sizes: Sizes, found: Findings) -> None:
    """Runs where the layout gives a data-parallel size and both batch sizes are valid."""
    mbs, gbs, dp, pp, microbatches = (
        sizes.micro_batch_size,
        sizes.global_batch_size,
        sizes.dp,
        sizes.pp,
        sizes.num_microbatches,
    )
    assert mbs and gbs and dp and pp  # check() calls this only then; a data-parallel size needs pp
    if microbatches is None:
        found.problem(
            f"training.global_batch_size={gbs} is not divisible by training.micro_batch_size={mbs} x "
            f"data-parallel size {dp} (= num_gpus {sizes.num_gpus} / (tp {sizes.tp} x pp {pp} x cp "
            f"{sizes.cp})); use a multiple of {mbs * dp}"
        )
        return
    if sizes.vp and microbatches < pp:
        found.problem(
            f"the interleaved pipeline needs at least parallelism.pp={pp} microbatches per step; "
            f"training.global_batch_size={gbs} gives {microbatches}"
        )
    _evaluation(cfg.training.val_samples, sizes, found)


def _evaluation(val_samples: int | None, sizes: Sizes, found: Findings) -> None:
    """training.val_samples: whole microbatches on every data-parallel rank, read in schedule calls of at most
    num_microbatches each; the interleaved pipeline needs every call's count divisible by pp."""
    if val_samples is None:
        return
    mbs, dp, pp, microbatches = sizes.micro_batch_size, sizes.dp, sizes.pp, sizes.num_microbatches
    assert mbs and dp and pp and microbatches  # _batch calls this only then
    per_rank = mbs * dp
    if val_samples % per_rank:
        found.problem(
            f"training.val_samples={val_samples} is not a multiple of training.micro_batch_size="
            f"{mbs} x data-parallel size {dp}; use a multiple of {per_rank}"
        )
        return
    last_call = (val_samples // per_rank) % microbatches
    if sizes.vp and last_call % pp:
        found.problem(
            f"training.val_samples={val_samples} leaves a last evaluation call of {last_call} "
            f"microbatch(es) per rank, which the interleaved pipeline cannot run (it needs a multiple of "
            f"parallelism.pp={pp}); use a multiple of {per_rank * pp}"
        )
