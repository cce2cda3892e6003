"""The model's side of the loop: one training step (forward and backward over the step's microbatches through
megatron-core's pipeline schedule, then the optimizer), one evaluation, and the parameter all-gathers they need
settled. Holds the model chunks, the optimizer, the LR schedule and the data iterators; the loop
(recipes/trainer/loop.py) only asks it to step, evaluate and report."""

from __future__ import annotations

import contextlib
from functools import partial
from typing import Any, Callable, ContextManager

from megatron.core import parallel_state as ps
from megatron.core.distributed import finalize_model_grads
import torch

from common.config import Config, DataFormat, ParallelismConfig, packs_sequences
from common.evaluation import eval_microbatches, eval_samples
from common.plan import Plan
from recipes.runtime.callbacks import Callback, Stop
from recipes.runtime.distributed import unwrap
from recipes.trainer import data


def loss_func(loss_mask, output_tensor):
    """Sum of per-token losses and the token count; megatron divides the gradients by the global count
    (calculate_per_token_loss), so every token of the global batch weighs the same."""
    losses = output_tensor.float().reshape(-1)
    mask = loss_mask.reshape(-1).float()
    loss = torch.sum(losses * mask)
    tokens = mask.sum()
    return loss, tokens.to(torch.int), {"lm loss": torch.stack([loss.detach(), tokens.detach()])}


def forward_step(data_iterator, model):
    chunk = unwrap(model)
    # A middle pipeline stage has no data iterator (its input comes from the previous stage) and looks up no key
    # in its empty batch, except with packed sequences: every stage reads their boundaries (packed_seq_params).
    batch: dict[str, Any] = next(data_iterator) if data_iterator is not None else {}
    tokens = batch["tokens"] if chunk.pre_process else None
    positions = batch["position_ids"] if chunk.pre_process else None
    labels = batch["labels"] if chunk.post_process else None
    output = model(tokens, positions, None, labels=labels, packed_seq_params=batch.get("packed_seq_params"))
    return output, partial(loss_func, batch["loss_mask"] if chunk.post_process else None)


def reduce_loss_and_tokens(losses_reduced) -> tuple[float, float] | None:
    """Token-weighted mean loss over the global batch and the number of tokens it was taken over (those of the
    loss mask: for fine-tuning the trained tokens, neither prompts nor padding), on last-stage ranks (None
    elsewhere)."""
    if not ps.is_pipeline_last_stage(ignore_virtual=True):
        return None
    total = torch.stack([entry["lm loss"] for entry in losses_reduced]).sum(dim=0)
    torch.distributed.all_reduce(total, group=ps.get_data_parallel_group(with_context_parallel=True))
    return (total[0] / total[1].clamp(min=1)).item(), total[1].item()


def reduce_loss(losses_reduced) -> float | None:
    """Token-weighted mean loss over the global batch, on last-stage ranks (None elsewhere)."""
    reduced = reduce_loss_and_tokens(losses_reduced)
    return None if reduced is None else reduced[0]


def overlaps_param_gather(par: ParallelismConfig) -> bool:
    """The distributed optimizer's parameter all-gather runs behind the next forward (parallelism keys)."""
    return bool(par.overlap_param_gather and par.use_distributed_optimizer)


def stages_needing_data(chunks: list, packing: bool = False) -> list[bool]:
    """Per model chunk: does it read batches (the first pipeline stage its tokens, the last its labels; with
    packed sequences every stage, for the samples' boundaries)."""
    return [packing or unwrap(c).pre_process or unwrap(c).post_process for c in chunks]


def reads_data(chunks: list, packing: bool = False) -> bool:
    """This rank reads the data: TP rank 0 of a stage that needs it; the rest of the TP group receives it."""
    return any(stages_needing_data(chunks, packing)) and ps.get_tensor_model_parallel_rank() == 0


def schedule_shape(plan: Plan, packing: bool) -> tuple[int, int]:
    """(sequence length, microbatch size) the pipeline schedule sizes its activations with: a microbatch of
    packed sequences is one THD sequence of mbs * seq tokens."""
    if packing:
        return plan.micro_batch_size * plan.seq_length, 1
    return plan.seq_length, plan.micro_batch_size


class Steps(Callback):
    """Training steps and evaluations of this rank's model chunks. `schedule` is megatron-core's pipeline schedule
    (evaluation runs it), `training_schedule` the one training steps run (CUDA graphs may wrap it); `ranges` names
    a stretch of work in the profile (the observers')."""

    packing = False  # packed fine-tuning sequences (set from the config in __init__)

    def __init__(
        self,
        chunks: list,
        optimizer,
        scheduler,
        config,
        plan: Plan,
        cfg: Config,
        schedule: Callable,
        training_schedule: Callable,
        datasets: tuple[Any, Any],
        consumed_samples: int,
        ranges: Callable[[str], ContextManager[None]],
    ):
        self.chunks, self.optimizer, self.scheduler, self.config = chunks, optimizer, scheduler, config
        self.plan, self.train_cfg = plan, cfg.training
        self.schedule, self.training_schedule = schedule, training_schedule
        self.ranges = ranges
        self._configure_overlap(cfg.parallelism)
        self.packing = packs_sequences(cfg)
        self.needs_data = stages_needing_data(chunks, self.packing)
        self.reads = reads_data(chunks, self.packing)
        self.sft = cfg.training.data.format == DataFormat.sft
        self.trained_tokens: float | None = None  # the loss mask's tokens of the last step (last stage)
        self.dp_rank = ps.get_data_parallel_rank()
        self.dp_size = ps.get_data_parallel_world_size()
        train_ds, self.valid_ds = datasets
        self.train_iters = self._iterators(train_ds if self.reads else None, consumed_samples)

    # ------------------------------------------------------------------ overlapped communication
    def _configure_overlap(self, par: ParallelismConfig) -> None:
        """Hooks the pipeline schedules call so gradient reduce-scatters and parameter all-gathers overlap
        compute (what Megatron-LM's training loop sets up)."""
        config = self.config
        one = len(self.chunks) == 1

        def per_chunk(name):
            fns = [getattr(c, name) for c in self.chunks]
            return fns[0] if one else fns

        config.grad_scale_func = self.optimizer.scale_loss
        if par.overlap_grad_reduce:
            config.no_sync_func = per_chunk("no_sync")
            config.grad_sync_func = per_chunk("start_grad_sync")
        self._param_sync_func = None
        if par.overlap_param_gather and par.align_param_gather and self.plan.pp > 1:
            self._param_sync_func = per_chunk("start_param_sync")
        config.param_sync_func = None  # enabled after the first step, with the forward pre-hooks
        config.finalize_model_grads_func = finalize_model_grads
        self.overlap_param_gather = overlaps_param_gather(par)
        self._pre_hooks_enabled = not self.overlap_param_gather
        if self.overlap_param_gather:
            # First step without the all-gather pre-hooks: a bad load or init then fails loudly on every rank
            # rather than being spread by the first gather.
            for chunk in self.chunks:
                chunk.disable_forward_pre_hook(param_sync=False)

    def _enable_pre_hooks(self) -> None:
        if not self._pre_hooks_enabled:
            for chunk in self.chunks:
                chunk.enable_forward_pre_hook()
            self.config.param_sync_func = self._param_sync_func
            self._pre_hooks_enabled = True

    @contextlib.contextmanager
    def synced_params(self):
        """Every parameter up to date (the overlapped all-gather finished) for evaluation and checkpoints."""
        toggle = self.overlap_param_gather and self._pre_hooks_enabled
        if toggle:
            for chunk in self.chunks:
                chunk.disable_forward_pre_hook(param_sync=True)
        try:
            yield
        finally:
            if toggle:
                for chunk in self.chunks:
                    chunk.enable_forward_pre_hook()

    # ------------------------------------------------------------------ data
    def _iterators(self, dataset, consumed_samples: int):
        shape = (self.plan.micro_batch_size, self.plan.seq_length)
        loader = None
        if dataset is not None:
            loader = data.make_loader(
                dataset,
                consumed_samples,
                self.plan.micro_batch_size,
                self.dp_rank,
                self.dp_size,
                self.train_cfg.data.num_workers,
            )
        source = data.MicrobatchSource(loader, shape, self.packing) if any(self.needs_data) else None
        iters: list[data.MicrobatchSource | data.ChunkView | None]
        if source is not None and sum(self.needs_data) > 1:  # packed sequences: every chunk of the rank reads
            views = iter(data.ChunkViews(source, sum(self.needs_data)).views())
            iters = [next(views) if needs else None for needs in self.needs_data]
        else:  # one source serves the single chunk on this rank that reads data (first or last pipeline stage)
            iters = [source if needs else None for needs in self.needs_data]
        return iters if len(iters) > 1 else iters[0]

    def stops(self, stop: Stop) -> None:
        """Shut the data-loader workers down before the interpreter's exit would wait for them."""
        data.close_sources(self.train_iters)
        self.train_iters = None

    # ------------------------------------------------------------------ steps
    def _run_schedule(self, iterators, num_microbatches: int, forward_only: bool):
        """Evaluation (forward only) runs the eager schedule, training steps the one CUDA graphs may wrap."""
        schedule = self.schedule if forward_only else self.training_schedule
        seq_length, micro_batch_size = schedule_shape(self.plan, self.packing)
        return schedule(
            forward_step_func=forward_step,
            data_iterator=iterators,
            model=self.chunks if len(self.chunks) > 1 else self.chunks[0],
            num_microbatches=num_microbatches,
            seq_length=seq_length,
            micro_batch_size=micro_batch_size,
            decoder_seq_length=seq_length,
            forward_only=forward_only,
        )

    def train_step(self) -> tuple[float | None, float]:
        """One optimizer step: (the global batch's mean loss on last-stage ranks, else None; the gradient norm)."""
        for chunk in self.chunks:
            chunk.zero_grad_buffer()
        self.optimizer.zero_grad()
        losses = self._run_schedule(self.train_iters, self.plan.num_microbatches, forward_only=False)
        with self.ranges("optimizer"):
            _, grad_norm, _ = self.optimizer.step()
        self.scheduler.step(increment=1)
        self._enable_pre_hooks()
        reduced = reduce_loss_and_tokens(losses)
        loss, self.trained_tokens = reduced if reduced is not None else (None, None)
        return loss, float(grad_norm) if grad_norm is not None else float("nan")

    def step_ends(self, step: int) -> dict[str, Any] | None:
        """A fine-tuning step's trained tokens (its loss mask's) for the metrics record, where the rank knows them
        (pretraining trains on every token: its tokens_per_s says it)."""
        if not self.sft or self.trained_tokens is None:
            return None
        return {"trained_tokens": int(self.trained_tokens)}

    def evaluate(self) -> float | None:
        """Mean loss over every token of the evaluation's sequences (the same ones each time)."""
        plan = self.plan
        samples = eval_samples(self.train_cfg, plan.global_batch_size)
        calls = eval_microbatches(samples, plan.micro_batch_size, self.dp_size, plan.num_microbatches)
        if not calls:
            return None
        with self.synced_params(), torch.no_grad():
            for chunk in self.chunks:
                chunk.eval()
            iters = self._iterators(self.valid_ds, 0)  # None on ranks that do not read
            losses = []
            for num_microbatches in calls:
                losses += self._run_schedule(iters, num_microbatches, forward_only=True)
            data.close_sources(iters)
            for chunk in self.chunks:
                chunk.train()
        return reduce_loss(losses)

    def lr(self) -> float:
        return self.scheduler.get_lr(self.optimizer.param_groups[0])

    def peak_memory_gib(self) -> float:
        """The largest peak allocation of any rank so far (a collective)."""
        peak = torch.tensor([torch.cuda.max_memory_allocated()], dtype=torch.float64, device="cuda")
        torch.distributed.all_reduce(peak, op=torch.distributed.ReduceOp.MAX)
        return peak.item() / 2**30
