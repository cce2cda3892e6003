"""The trainer: builds the model, optimizer, data and checkpointer of a run directory on this rank, then steps,
asking its components when to act (recipes/trainer/cadence.py: the checkpointer when to save, the evaluation
policy when to validate, the GC policy when to collect) and telling its observers (tracking, profiling,
telemetry, MLPerf logging) what happened. The training entry (recipes/train.py) imports it once the stack check
passed."""

from __future__ import annotations

import contextlib
from functools import partial
import os
import time
from typing import Any

from megatron.core import parallel_state as ps
from megatron.core.distributed import finalize_model_grads
from megatron.core.optimizer import get_megatron_optimizer
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
from megatron.core.pipeline_parallel import get_forward_backward_func
import torch
import yaml

from common.checkpoints import latest_checkpoint
from common.plan import Plan, PlanFileError, load_plan
from recipes.hf import importer
from recipes.observability.observers import Observers
from recipes.resilience.guard import RunGuard, record_failure
from recipes.trainer import cadence, checkpoint, data, distributed, graphs, metrics, settings, wgrad_fallback
from recipes.trainer.model import build_model_chunks, count_parameters, init_userbuffers, unwrap, wrap_data_parallel
from recipes.trainer.ranks import rank_info
from recipes.trainer.stop_signals import StopSignal


def _load_run(run_dir: str) -> tuple[dict[str, Any], Plan]:
    with open(os.path.join(run_dir, "config.yaml")) as f:
        cfg = yaml.safe_load(f)
    try:
        plan = load_plan(run_dir)
    except PlanFileError as err:
        raise SystemExit(f"error: {err}") from None
    return cfg, plan


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
    batch = next(data_iterator) if (chunk.pre_process or chunk.post_process) else None
    tokens = batch["tokens"] if chunk.pre_process else None
    positions = batch["position_ids"] if chunk.pre_process else None
    labels = batch["labels"] if chunk.post_process else None
    output = model(tokens, positions, None, labels=labels)
    return output, partial(loss_func, batch["loss_mask"] if chunk.post_process else None)


def reduce_loss(losses_reduced) -> float | None:
    """Token-weighted mean loss over the global batch, on last-stage ranks (None elsewhere)."""
    if not ps.is_pipeline_last_stage(ignore_virtual=True):
        return None
    total = torch.stack([entry["lm loss"] for entry in losses_reduced]).sum(dim=0)
    torch.distributed.all_reduce(total, group=ps.get_data_parallel_group(with_context_parallel=True))
    return (total[0] / total[1].clamp(min=1)).item()


class Trainer:
    def __init__(self, run_dir: str):
        # Weight gradients accumulate straight into the DDP buffers (apex's kernel, or the stand-in). The training
        # entry installed it before megatron was imported; this covers a Trainer made another way.
        wgrad_fallback.install()
        self.run_dir = run_dir
        self.cfg, self.plan = _load_run(run_dir)
        cfg, plan = self.cfg, self.plan
        # Hang detection (under ft_launcher), the injected fault, straggler reports, the run's events; first, so
        # that a rank hanging while it starts is found too.
        self.guard = RunGuard(run_dir, cfg, rank_info().rank, rank_info().world_size)
        self.train_cfg = cfg["training"]
        # Hugging Face weights to start from: located (a hub id downloaded once, by rank 0) and checked against
        # training.model on every rank before CUDA or NCCL start.
        hf_weights = importer.source_for_run(cfg, run_dir, rank_info().rank)
        deterministic = settings.apply_determinism(cfg, os.environ)
        # Tracking, profiling, GPU telemetry, MLPerf logging; a missing package stops every rank here.
        self.observers = Observers(run_dir, cfg, plan, rank_info())
        self.info = distributed.initialize(plan, cfg["seed"])
        if deterministic:
            self.say("deterministic mode: " + " ".join(f"{k}={v}" for k, v in settings.DETERMINISTIC_ENV.items()))
        self.is_last_rank = self.info.rank == self.info.world_size - 1
        # MLPerf runs: MLLOG from the last rank (cache_clear and init_start now); nothing for other runs.
        self.observers.init_starts()

        self.config = settings.transformer_config(cfg, plan, grad_accum_fusion=True)
        if plan.tp_comm_overlap:
            init_userbuffers(cfg, plan)
        chunks = build_model_chunks(self.config, cfg, plan)
        self.say(
            f"model: {count_parameters(chunks) / 1e6:.1f}M parameters on rank 0 "
            f"({plan.num_parameters / 1e9:.2f}B in all)"
        )
        self.chunks = wrap_data_parallel(chunks, self.config, settings.ddp_config(cfg, plan))
        self.optimizer = get_megatron_optimizer(settings.optimizer_config(cfg), self.chunks)
        self.scheduler = OptimizerParamScheduler(self.optimizer, **settings.scheduler_kwargs(cfg))
        self.forward_backward = get_forward_backward_func()
        self._configure_overlap()
        # CUDA graphs (training.cuda_graphs) for training steps only: evaluation keeps the eager schedule.
        self.graphs = graphs.CudaGraphs.for_trainer(
            plan, self.config, self.chunks, self.optimizer, self._overlap_param_gather, self.say
        )
        self.train_forward_backward = self.graphs.training_schedule(self.forward_backward)

        # State: resume from this run's checkpoints, else optionally initialise from another checkpoint.
        ckpt_cfg = self.train_cfg["checkpoint"]
        self.checkpointer = checkpoint.Checkpointer(
            os.path.join(run_dir, "checkpoints"),
            ckpt_cfg["keep_last"],
            ckpt_cfg["async_save"],
            cadence.SavePolicy.from_config(ckpt_cfg),
        )
        state = None
        if ckpt_cfg["load"]:
            state = self.checkpointer.load_latest(self.chunks, self.optimizer, self.scheduler, self.say)
        if state is None:
            state = checkpoint.TrainState(step=0, consumed_samples=0)
            if ckpt_cfg.get("init_from"):
                checkpoint.load_model_weights(ckpt_cfg["init_from"], self.chunks, self.say)
            elif hf_weights:
                importer.load_hf_weights(
                    hf_weights,
                    self.chunks,
                    cfg["training"]["model"],
                    plan.padded_vocab_size,
                    self.say,
                    show_progress=self.info.rank == 0,
                )
            if ckpt_cfg.get("init_from") or hf_weights:
                # The optimizer's fp32 master weights were copied from the random init: copy them again.
                self.optimizer.reload_model_params()
        self.state = state
        if state.step:
            self.say(f"resumed at step {state.step} ({state.consumed_samples} samples consumed)")
        self.observers.training_starts(self.config, state.step)
        self.guard.training_starts(state.step, self.info.local_rank)  # before the metrics writer drops later steps

        # Data: read on TP rank 0 of the stages that need it, broadcast to the rest of the TP group.
        needs_data = [unwrap(c).pre_process or unwrap(c).post_process for c in self.chunks]
        reads = any(needs_data) and ps.get_tensor_model_parallel_rank() == 0
        self.tokenizer = data.build_tokenizer(cfg)
        train_ds, self.valid_ds = data.build_datasets(cfg, plan, self.tokenizer, reads, data.dataset_cache_dir(run_dir))
        self.dp_rank = ps.get_data_parallel_rank()
        self.dp_size = ps.get_data_parallel_world_size()
        self.needs_data = needs_data
        self.train_iters = self._iterators(train_ds if reads else None, state.consumed_samples)
        # The loop's other policies: when to validate (and whether to watch a target loss), when to collect.
        self.evaluation = cadence.EvalPolicy.from_config(self.train_cfg)
        self.gc_policy = cadence.GCPolicy()
        self.metrics_writer = None
        if self.is_last_rank:
            self.metrics_writer = metrics.MetricsWriter(os.path.join(run_dir, "metrics.jsonl"), state.step)

    # ------------------------------------------------------------------ setup helpers
    def say(self, message: str) -> None:
        if self.info.rank == 0:
            print(f"[recipes] {message}", flush=True)

    def _configure_overlap(self) -> None:
        """Hooks the pipeline schedules call so gradient reduce-scatters and parameter all-gathers overlap
        compute (what Megatron-LM's training loop sets up)."""
        par = self.cfg["parallelism"]
        config = self.config
        one = len(self.chunks) == 1

        def per_chunk(name):
            fns = [getattr(c, name) for c in self.chunks]
            return fns[0] if one else fns

        config.grad_scale_func = self.optimizer.scale_loss
        if par["overlap_grad_reduce"]:
            config.no_sync_func = per_chunk("no_sync")
            config.grad_sync_func = per_chunk("start_grad_sync")
        self._param_sync_func = None
        if par["overlap_param_gather"] and par["align_param_gather"] and self.plan.pp > 1:
            self._param_sync_func = per_chunk("start_param_sync")
        config.param_sync_func = None  # enabled after the first step, with the forward pre-hooks
        config.finalize_model_grads_func = finalize_model_grads
        self._overlap_param_gather = bool(par["overlap_param_gather"] and par["use_distributed_optimizer"])
        self._pre_hooks_enabled = not self._overlap_param_gather
        if self._overlap_param_gather:
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
    def _synced_params(self):
        """Every parameter up to date (the overlapped all-gather finished) for evaluation and checkpoints."""
        toggle = self._overlap_param_gather and self._pre_hooks_enabled
        if toggle:
            for chunk in self.chunks:
                chunk.disable_forward_pre_hook(param_sync=True)
        try:
            yield
        finally:
            if toggle:
                for chunk in self.chunks:
                    chunk.enable_forward_pre_hook()

    def close_data(self) -> None:
        """Shut the data-loader workers down before the interpreter's exit would wait for them."""
        data.close_sources(self.train_iters)
        self.train_iters = None
        self.gc_policy.stop()

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
                self.train_cfg["data"]["num_workers"],
            )
        # One source serves the single chunk on this rank that reads data (first or last pipeline stage).
        source = data.MicrobatchSource(loader, shape) if any(self.needs_data) else None
        iters = [source if needs else None for needs in self.needs_data]
        return iters if len(iters) > 1 else iters[0]

    # ------------------------------------------------------------------ steps
    def _run_schedule(self, iterators, num_microbatches: int, forward_only: bool):
        schedule = self.forward_backward if forward_only else self.train_forward_backward
        return schedule(
            forward_step_func=forward_step,
            data_iterator=iterators,
            model=self.chunks if len(self.chunks) > 1 else self.chunks[0],
            num_microbatches=num_microbatches,
            seq_length=self.plan.seq_length,
            micro_batch_size=self.plan.micro_batch_size,
            decoder_seq_length=self.plan.seq_length,
            forward_only=forward_only,
        )

    def train_step(self) -> tuple[float | None, float]:
        self.graphs.before_step()
        for chunk in self.chunks:
            chunk.zero_grad_buffer()
        self.optimizer.zero_grad()
        losses = self._run_schedule(self.train_iters, self.plan.num_microbatches, forward_only=False)
        self.graphs.after_step()
        with self.observers.range("optimizer"):
            _, grad_norm, _ = self.optimizer.step()
        self.scheduler.step(increment=1)
        self._enable_pre_hooks()
        return reduce_loss(losses), float(grad_norm) if grad_norm is not None else float("nan")

    def evaluate(self) -> float | None:
        """Mean loss over every token of the evaluation's sequences (the same ones each time)."""
        plan = self.plan
        samples = data.eval_samples(self.train_cfg, plan.global_batch_size)
        calls = data.eval_microbatches(samples, plan.micro_batch_size, self.dp_size, plan.num_microbatches)
        if not calls:
            return None
        reads = self.valid_ds is not None
        with self._synced_params(), torch.no_grad():
            for chunk in self.chunks:
                chunk.eval()
            iters = self._iterators(self.valid_ds if reads else None, 0)
            losses = []
            for num_microbatches in calls:
                losses += self._run_schedule(iters, num_microbatches, forward_only=True)
            data.close_sources(iters)
            for chunk in self.chunks:
                chunk.train()
        return reduce_loss(losses)

    def save(self) -> None:
        with self._synced_params(), self.observers.range("checkpoint"), self.guard.checkpointing():
            self.checkpointer.save(
                self.chunks, self.optimizer, self.scheduler, self.state, self.say, in_flight=self.guard.save_in_flight
            )

    def _last_good_checkpoint(self) -> str:
        latest = latest_checkpoint(self.checkpointer.root)
        return latest[1] if latest else "none saved yet"

    # ------------------------------------------------------------------ loop
    def train(self) -> int:
        state, train_steps = self.state, self.train_cfg["train_steps"]
        stop = StopSignal()
        self.gc_policy.start()
        if self.checkpointer.due_before_training(state.step):
            self.save()
        self.observers.run_starts(state.consumed_samples, resume_step=state.step)
        last_time = time.perf_counter()
        stopped = False
        while state.step < train_steps:
            self.observers.step_begins(state.step + 1)
            with self.guard.step(state.step + 1):
                loss, grad_norm = self.train_step()
            state.step += 1
            state.consumed_samples += self.plan.global_batch_size
            now = time.perf_counter()
            step_time, last_time = now - last_time, now
            self.observers.step_ended(state.step)
            self.checkpointer.poll()
            gpu_perf = self.guard.after_step(state.step)

            diverged = cadence.divergence(loss, grad_norm)
            if diverged:
                self._stop_diverged(diverged)
                self.guard.ended(state.step, finished=False, reason=f"diverged: {diverged}")
                return 3
            evaluated = self.evaluation.due(state.step)
            val_loss = self._validate() if evaluated else None
            self._log_step(loss, grad_norm, step_time, val_loss, evaluated, gpu_perf)
            reached = self._target_reached(val_loss)
            self.gc_policy.after_step(state.step)

            end = cadence.step_end(
                state.step, train_steps, reached, signal_agreed=lambda: distributed.any_rank(stop.received is not None)
            )
            if evaluated:
                self.observers.evaluation_ended(state.consumed_samples, val_loss, run_goes_on=end.run_goes_on)
            if not end.run_goes_on:
                self.observers.run_stops(end.reached, state.consumed_samples)
            if self.checkpointer.due(state.step, end):
                self.save()
            if end.stopping:
                with self.guard.checkpointing():
                    self.checkpointer.wait()
                self.guard.stopped(state.step, stop.received)
                stopped = True
                self.say(
                    f"stopped by signal at step {state.step}; checkpoint saved. Run the same command again to continue."
                )
                break
            if end.reached:
                self.say(
                    f"validation loss reached training.target_val_loss={self.evaluation.target} at step {state.step}"
                )
                break
            last_time = time.perf_counter()  # checkpoint and eval time stays out of the next step's timing
        with self.guard.checkpointing():
            self.checkpointer.close()
        if not stopped:  # train_steps or the target: the chain of jobs ends here (common/job_chain.py)
            self.guard.ended(state.step, finished=True)
        if self.metrics_writer:
            self.metrics_writer.close()
        return 0

    def _stop_diverged(self, what: str) -> None:
        if self.is_last_rank:  # it knows both the loss and the (global) grad norm
            print(
                f"[recipes] ERROR: {what} at step {self.state.step}: training stopped. Last good checkpoint: "
                f"{self._last_good_checkpoint()} (lower training.optimizer.lr, check the data, and resume from "
                "it)",
                flush=True,
            )
        self.observers.run_stops(False, self.state.consumed_samples)

    def _validate(self) -> float | None:
        self.observers.evaluation_starts(self.state.consumed_samples)
        with self.observers.range("validation"):
            return self.evaluate()

    def _log_step(
        self,
        loss: float | None,
        grad_norm: float,
        step_time: float,
        val_loss: float | None,
        evaluated: bool,
        gpu_perf: list | None = None,
    ) -> None:
        """The progress line, metrics.jsonl and the trackers (last rank); every rank joins the peak-memory
        reduction of a logged step."""
        state = self.state
        log_now = cadence.logs_step(state.step, self.train_cfg["log_interval"], evaluated)
        peak_memory = self._peak_memory_gib() if log_now else None
        if self.is_last_rank and log_now:
            record = metrics.step_metrics(
                self.plan,
                step=state.step,
                loss=loss,
                lr=self.scheduler.get_lr(self.optimizer.param_groups[0]),
                grad_norm=grad_norm,
                step_time_s=step_time,
                consumed_samples=state.consumed_samples,
                val_loss=val_loss,
                peak_memory_gib=peak_memory,
                gpu_relative_perf=gpu_perf,
            )
            print(metrics.progress_line(record, self.train_cfg["train_steps"]), flush=True)
            self.metrics_writer.write(record)
            self.observers.log(record)

    def _peak_memory_gib(self) -> float:
        peak = torch.tensor([torch.cuda.max_memory_allocated()], dtype=torch.float64, device="cuda")
        torch.distributed.all_reduce(peak, op=torch.distributed.ReduceOp.MAX)
        return peak.item() / 2**30

    def _target_reached(self, val_loss: float | None) -> bool:
        """The last rank knows the validation loss; every rank must agree to stop."""
        return self.evaluation.watches_target and distributed.any_rank(self.evaluation.reached(val_loss))


def run(run_dir: str) -> int:
    """Train RUN_DIR on this rank; the exit status."""
    trainer = None
    try:
        trainer = Trainer(run_dir)
        return trainer.train()
    except Exception as err:
        record_failure(run_dir, rank_info().rank, err)  # the report tells a crash with a message from a silent one
        raise
    finally:
        if trainer is not None:
            trainer.graphs.release()  # graphs hold NCCL communicators: gone before the process groups are
            trainer.observers.close()  # the profile, the tracker's last events, the telemetry thread
            trainer.guard.close()
            trainer.close_data()
        distributed.shutdown()
