"""The trainer's own evaluation over evaluation.blends (the evaluation stage's eval_loss job, python -m
recipes.evaluate), from the run's newest complete checkpoint, at the run's
layout (every rank of the training job's shape runs it): the model as training builds it, its weights from the
checkpoint, each blend's first sequences read in order (InOrderSequences, as training.data.valid_blend is read),
the loss through megatron-core's forward-only pipeline schedule and reduced over every token, as the trainer's
validation does. No export: a 405B run reports held-out loss. The last rank writes the rows."""

from __future__ import annotations

import dataclasses
import os
import time

import torch
from megatron.core.pipeline_parallel import get_forward_backward_func

from common.checkpoints import latest_checkpoint
from common.config import Config
from common.evaluation import BLEND_ROWS, RESULTS_DIR, EvalRow, eval_microbatches, eval_samples, write_rows
from common.plan import Plan
from common.run import load_run_or_exit
from recipes.runtime.distributed import unwrap
from recipes.trainer import checkpoint, data, distributed, settings
from recipes.trainer.model import build_model_chunks
from recipes.trainer.steps import forward_step, reads_data, reduce_loss, stages_needing_data


def blend_samples(cfg: Config, plan: Plan, samples: int | None) -> int:
    """Sequences a blend's evaluation reads: its own count, else as many as the trainer's validation."""
    return samples or eval_samples(cfg.training, plan.global_batch_size)


def _loss(chunks: list, plan: Plan, dataset, samples: int, schedule, workers: int) -> float | None:
    dp_rank, dp_size = _dp()
    calls = eval_microbatches(samples, plan.micro_batch_size, dp_size, plan.num_microbatches)
    needs = stages_needing_data(chunks)
    loader = None
    if dataset is not None:
        loader = data.make_loader(dataset, 0, plan.micro_batch_size, dp_rank, dp_size, num_workers=workers)
    source = data.MicrobatchSource(loader, (plan.micro_batch_size, plan.seq_length)) if any(needs) else None
    iters = [source if need else None for need in needs]
    losses = []
    with torch.no_grad():
        for num_microbatches in calls:
            losses += schedule(
                forward_step_func=forward_step,
                data_iterator=iters if len(iters) > 1 else iters[0],
                model=chunks if len(chunks) > 1 else chunks[0],
                num_microbatches=num_microbatches,
                seq_length=plan.seq_length,
                micro_batch_size=plan.micro_batch_size,
                decoder_seq_length=plan.seq_length,
                forward_only=True,
            )
    if source is not None:
        source.close()
    return reduce_loss(losses)


def _dp() -> tuple[int, int]:
    from megatron.core import parallel_state as ps

    return ps.get_data_parallel_rank(), ps.get_data_parallel_world_size()


def run_loss(run_dir: str) -> int:
    """Every rank: the loss of each of evaluation.blends; the exit status."""
    run = load_run_or_exit(run_dir)
    cfg = run.config
    # Evaluation runs the eager schedule, as the trainer's validation does.
    plan = dataclasses.replace(run.plan, cuda_graphs="none")
    blends = cfg.evaluation.blends
    newest = latest_checkpoint(os.path.join(run_dir, "checkpoints"))
    if newest is None:
        raise SystemExit(f"evaluation.blends: {run_dir}/checkpoints holds no complete checkpoint; train first")
    step, path = newest
    info = distributed.initialize(plan, cfg.seed)
    is_last = info.rank == info.world_size - 1

    def say(message: str) -> None:
        if is_last:
            print(f"[evaluation] {message}", flush=True)

    try:
        config = settings.transformer_config(cfg, plan, grad_accum_fusion=False)
        chunks = build_model_chunks(config, cfg, plan)
        checkpoint.load_model_weights(path, chunks, say)
        for chunk in chunks:
            unwrap(chunk).eval()
        schedule = get_forward_backward_func()
        rows = []
        for blend in blends:
            samples = blend_samples(cfg, plan, blend.samples)
            key = f"evaluation.blends: {blend.name}"
            reads = reads_data(chunks)
            dataset = data.InOrderSequences(list(blend.prefixes), plan.seq_length, samples, key) if reads else None
            say(f"{blend.name}: {samples} sequences of {plan.seq_length} tokens from step {step}'s weights ...")
            start = time.perf_counter()
            loss = _loss(chunks, plan, dataset, samples, schedule, cfg.training.data.num_workers)
            seconds = time.perf_counter() - start
            if is_last and loss is not None:
                tokens = samples * plan.seq_length
                say(f"{blend.name}: loss {loss:.4f} over {samples} sequences ({tokens} tokens, {seconds:.1f} s)")
                rows.append(
                    EvalRow(
                        task=f"blend:{blend.name}",
                        metric="loss",
                        value=loss,
                        model=path,
                        step=step,
                        tokens=tokens,
                        seconds=round(seconds, 3),
                    )
                )
        if is_last:
            out = os.path.join(run_dir, RESULTS_DIR)
            os.makedirs(out, exist_ok=True)
            write_rows(os.path.join(out, BLEND_ROWS), rows)
    finally:
        distributed.shutdown()
    return 0
