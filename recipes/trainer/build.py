"""A run's trainer from its run directory, on this rank: the guard first (a rank that hangs while it starts is found
too), the observers, the process groups, the model, optimizer and schedule, CUDA graphs, the checkpointer and the
state it loads (or the weights a run starts from), the data; then the loop (recipes/trainer/loop.py) with all of
them as its callbacks. The training entry (recipes/train.py) calls `run` once the stack check passed."""

from __future__ import annotations

import os
import time

import torch
from megatron.core.optimizer import get_megatron_optimizer
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
from megatron.core.pipeline_parallel import get_forward_backward_func

from common.checkpoints import BaseRecord, TrainState, base_record, random_base_record
from common.config import Config, LoraConfig, packs_sequences
from common.plan import Plan
from common.run import load_run_or_exit
from recipes.hf import importer
from recipes.observability.observers import Observers
from recipes.peft import lora
from recipes.resilience.guard import RunGuard, record_failure
from recipes.runtime.callbacks import ERROR, Callbacks, Stop
from recipes.runtime.ranks import rank_info
from recipes.trainer import cadence, checkpoint, data, distributed, graphs, metrics, settings, wgrad_fallback
from recipes.trainer.loop import Trainer
from recipes.trainer.model import build_model_chunks, count_parameters, init_userbuffers, wrap_data_parallel
from recipes.trainer.phases import PhaseClock
from recipes.trainer.steps import Steps, overlaps_param_gather, reads_data


def _rank_zero_says(rank: int):
    def say(message: str) -> None:
        if rank == 0:
            print(f"[recipes] {message}", flush=True)

    return say


def build_trainer(run_dir: str, started: float | None = None) -> Trainer:
    """Everything a run's loop works with. What was started before a failure here (the guard's monitor, the
    telemetry thread, an async writer) is released before the error goes on. `started`: when the training entry
    began (time.monotonic), the start of the start-up line's first phase; else now."""
    clock = PhaseClock(time.monotonic() if started is None else started)
    clock.mark("stack check and imports")
    # Weight gradients accumulate straight into the DDP buffers (apex's kernel, or the stand-in). The training
    # entry installed it before megatron was imported; this covers a trainer built another way.
    wgrad_fallback.install()
    run = load_run_or_exit(run_dir)
    cfg, plan = run.config, run.plan
    info = rank_info()
    built = Callbacks()
    try:
        return _build(run_dir, cfg, plan, info, built, clock)
    except BaseException as err:
        built.stops(Stop(ERROR, 0, 0, detail=f"{type(err).__name__}: {err}"))
        raise


def _build(run_dir: str, cfg: Config, plan: Plan, info, built: Callbacks, clock: PhaseClock) -> Trainer:
    # Hang detection (under ft_launcher), the injected fault, straggler reports, the run's events.
    guard = RunGuard(run_dir, cfg.resilience, info.rank, info.world_size, info.local_rank)
    built.append(guard)
    # Hugging Face weights to start from: located (a hub id downloaded once, by rank 0) and checked against
    # training.model on every rank before CUDA or NCCL start.
    hf_weights = importer.source_for_run(cfg, run_dir, info.rank)
    deterministic = settings.apply_determinism(cfg, os.environ)
    # Tracking, profiling, GPU telemetry, MLPerf logging; a missing package stops every rank here.
    observers = Observers(run_dir, cfg, plan, info)
    built.append(observers)
    clock.mark("guard, weights' source and observers")
    info = distributed.initialize(plan, cfg.seed)
    if torch.cuda.is_available():  # only now: before, it would start a CUDA context on GPU 0 for every rank
        clock.sync = torch.cuda.synchronize
    clock.mark("process groups")
    say = _rank_zero_says(info.rank)
    if deterministic:
        fixed = " ".join(f"{k}={v}" for k, v in settings.DETERMINISTIC_ENV.items())
        say(f"deterministic mode: {fixed}; loss kernel {plan.cross_entropy_fusion}")
    is_last_rank = info.rank == info.world_size - 1
    if is_last_rank:
        built.append(metrics.MetricsFile(os.path.join(run_dir, "metrics.jsonl")))
    # MLPerf runs: MLLOG from the last rank (cache_clear and init_start now); nothing for other runs.
    observers.init_starts()

    config = settings.transformer_config(cfg, plan, grad_accum_fusion=True)
    if plan.tp_comm_overlap:
        init_userbuffers(cfg, plan)
    chunks = build_model_chunks(config, cfg, plan)
    say(f"model: {count_parameters(chunks) / 1e6:.1f}M parameters on rank 0 ({plan.num_parameters / 1e9:.2f}B in all)")
    if isinstance(cfg.peft, LoraConfig):
        # Before the DDP wrapper: it and the optimizer then hold gradients and state for the adapters only.
        adapters = lora.apply_lora(chunks, cfg.peft, cfg.seed)
        trained = sum(p.numel() for adapter in adapters for p in adapter.parameters())
        say(f"LoRA: {len(adapters)} adapters, {trained / 1e6:.2f}M trained parameters on rank 0; the base is frozen")
    clock.mark("model")
    chunks = wrap_data_parallel(chunks, config, settings.ddp_config(cfg, plan))
    optimizer = get_megatron_optimizer(settings.optimizer_config(cfg, plan), chunks)
    scheduler = OptimizerParamScheduler(optimizer, **settings.scheduler_kwargs(cfg))
    # CUDA graphs (training.cuda_graphs) for training steps only: evaluation keeps the eager schedule.
    cuda_graphs = graphs.CudaGraphs.for_trainer(
        plan, config, chunks, optimizer, overlaps_param_gather(cfg.parallelism), say
    )
    built.append(cuda_graphs)
    schedule = get_forward_backward_func()
    clock.mark("DDP, optimizer and CUDA graphs")

    ckpt_cfg = cfg.training.checkpoint
    checkpointer = checkpoint.Checkpointer(
        os.path.join(run_dir, "checkpoints"),
        ckpt_cfg.keep_last,
        ckpt_cfg.async_save,
        cadence.SavePolicy.from_config(ckpt_cfg),
        chunks,
        optimizer,
        scheduler,
        base=_base_record(cfg, hf_weights, info.rank) if isinstance(cfg.peft, LoraConfig) else None,
    )
    state = _initial_state(cfg, plan, checkpointer, chunks, optimizer, hf_weights, say, info.rank)
    observers.model_ready(config, state.step)
    clock.mark("checkpoint or initial weights")

    tokenizer = data.build_tokenizer(cfg)
    reads = reads_data(chunks, packs_sequences(cfg))
    datasets = data.build_datasets(cfg, plan, tokenizer, reads, data.dataset_cache_dir(run_dir))
    steps = Steps(
        chunks,
        optimizer,
        scheduler,
        config,
        plan,
        cfg,
        schedule=schedule,
        training_schedule=cuda_graphs.training_schedule(schedule),
        datasets=datasets,
        consumed_samples=state.consumed_samples,
        ranges=observers.range,
    )
    built.extend([steps, cadence.GCPolicy(), checkpointer])
    clock.mark("data")
    say(clock.line(info.rank))
    return Trainer(
        steps,
        checkpointer,
        built,
        plan=plan,
        train=cfg.training,
        state=state,
        is_last_rank=is_last_rank,
        say=say,
    )


def _base_record(cfg: Config, hf_weights: str | None, rank: int) -> BaseRecord:
    """A LoRA run's base (training.checkpoint.init_from, else the Hugging Face weights, else a benchmark's random
    weights) as its adapter checkpoints record it; rank 0 reads the fingerprint and every rank gets it."""
    import torch

    ckpt_cfg = cfg.training.checkpoint
    if ckpt_cfg.init_from:
        key, value, path = "training.checkpoint.init_from", str(ckpt_cfg.init_from), str(ckpt_cfg.init_from)
    elif not hf_weights:
        assert isinstance(cfg.peft, LoraConfig) and cfg.peft.random_base, "the plan refuses peft=lora without a base"
        return random_base_record(cfg.seed)
    else:
        key, value, path = "training.checkpoint.init_from_hf", str(ckpt_cfg.init_from_hf), hf_weights
    box = [base_record(key, value, path) if rank == 0 else None]
    torch.distributed.broadcast_object_list(box, src=0)
    assert box[0] is not None
    return box[0]


def _initial_state(cfg: Config, plan: Plan, checkpointer, chunks, optimizer, hf_weights, say, rank: int) -> TrainState:
    """Resume from this run's newest checkpoint, else start at step 0, optionally from another run's weights or
    Hugging Face weights. A LoRA run's checkpoints hold its adapters only: it loads its base first, resuming or not."""
    ckpt_cfg = cfg.training.checkpoint
    lora_run = isinstance(cfg.peft, LoraConfig)

    def load_base() -> None:
        if ckpt_cfg.init_from:
            checkpoint.load_model_weights(ckpt_cfg.init_from, chunks, say)
        elif hf_weights:
            importer.load_hf_weights(
                hf_weights, chunks, cfg.training.model, plan.padded_vocab_size, say, show_progress=rank == 0
            )
        if ckpt_cfg.init_from or hf_weights:
            # The optimizer's fp32 master weights were copied from the random init: copy them again.
            optimizer.reload_model_params()

    if lora_run:
        load_base()
    state = checkpointer.load_latest(say) if ckpt_cfg.load else None
    if state is not None:
        if state.step:
            say(f"resumed at step {state.step} ({state.consumed_samples} samples consumed)")
        return state
    if not lora_run:
        load_base()
    return TrainState(step=0, consumed_samples=0)


def run(run_dir: str, started: float | None = None) -> int:
    """Train RUN_DIR on this rank; the exit status (`started`: build_trainer's). Rank 0 ends with the end-of-run
    line; what the process takes after it is the interpreter's and CUDA's exit."""
    trainer = None
    try:
        trainer = build_trainer(run_dir, started)
        return trainer.train()
    except Exception as err:
        record_failure(run_dir, rank_info().rank, err)  # the report tells a crash with a message from a silent one
        raise
    finally:
        distributed.shutdown()
        if trainer is not None and trainer.end_of_run is not None:
            trainer.end_of_run.mark("process groups")
            trainer.say(trainer.end_of_run.line(rank_info().rank))
