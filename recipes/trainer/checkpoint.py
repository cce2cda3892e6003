"""Checkpoints with megatron-core's dist_checkpointing: model, optimizer, LR scheduler, RNG, step and data
position. A checkpoint is written under a partial name and renamed once every rank has finished, so only
complete checkpoints carry the `iter_NNNNNNN` name; resume picks the newest of those.

A LoRA run (peft=lora) saves the adapters only (and the optimizer state, which exists for them alone), with a record
of the base they were trained on (common/checkpoints.py's BASE_FILE: the key that named it, its path, a
fingerprint). Its resume loads the base from that key again, checks the fingerprint, then the adapters."""

from __future__ import annotations

import contextlib
from dataclasses import asdict
import errno
import importlib
import multiprocessing
from multiprocessing.managers import SyncManager
import os
import random
import shutil
import time
from typing import Any, Callable, Iterator
import uuid

from megatron.core import dist_checkpointing, parallel_state as ps, tensor_parallel
from megatron.core.dist_checkpointing.mapping import ShardedObject
from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue
import numpy as np
import torch

from common import run_events
from common.processes import die_with_parent
from common.checkpoints import (
    BASE_FILE,
    STATE_FILE,
    BaseRecord,
    base_problem,
    TrainState,
    finalize_checkpoint,
    latest_checkpoint,
    partial_path,
    prune_checkpoints,
    read_train_state,
    remove_partials,
    write_base_record,
)
from recipes.peft.lora import is_adapter_key
from recipes.runtime.callbacks import Callback, Stop
from recipes.trainer.cadence import SavePolicy, StepEnd
from recipes.runtime.distributed import unwrap
from recipes.runtime.stop_signals import helpers_die_with_the_trainer, helpers_immune_to_stop_signals

try:  # nvidia-resiliency-ext's asynchronous writer, where megatron-core has it
    from megatron.core.dist_checkpointing.strategies.torch import HAVE_NVRX
except ImportError:
    HAVE_NVRX = False


# --------------------------------------------------------------------------- distributed save / load
def _model_key(index: int, count: int) -> str:
    return "model" if count == 1 else f"model{index}"


def _model_sharded_state(chunks, adapters_only: bool = False) -> dict[str, Any]:
    """Every chunk's sharded state; with adapters_only (a LoRA run's checkpoints) its LoRA adapters' tensors, and
    the frozen layers' extra state (Transformer Engine's FP8 scaling history: small, and part of a bitwise resume)."""
    states = {_model_key(i, len(chunks)): unwrap(chunk).sharded_state_dict() for i, chunk in enumerate(chunks)}
    if adapters_only:
        states = {
            key: {k: v for k, v in state.items() if is_adapter_key(k) or k.endswith("._extra_state")}
            for key, state in states.items()
        }
    return states


def _load_model_state(chunks, loaded: dict[str, Any], adapters_only: bool = False) -> None:
    for index, chunk in enumerate(chunks):
        state = loaded[_model_key(index, len(chunks))]
        if not adapters_only:
            unwrap(chunk).load_state_dict(state)
            continue
        missing, unexpected = unwrap(chunk).load_state_dict(state, strict=False)
        absent = [k for k in missing if is_adapter_key(k)]
        if absent or unexpected:
            raise RuntimeError(f"adapter checkpoint: missing {absent[:3]}, unexpected {list(unexpected)[:3]}")


def _rng_state():
    state = {
        "random": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state(),
        "tracker": tensor_parallel.get_cuda_rng_tracker().get_states(),
    }
    # Identical across data-parallel replicas; one copy per (PP, TP) position.
    return ShardedObject(
        "rng_state",
        state,
        (ps.get_pipeline_model_parallel_world_size(), ps.get_tensor_model_parallel_world_size()),
        (ps.get_pipeline_model_parallel_rank(), ps.get_tensor_model_parallel_rank()),
        replica_id=ps.get_data_parallel_rank(with_context_parallel=True),
    )


def _set_rng_state(state: dict) -> None:
    random.setstate(state["random"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    torch.cuda.set_rng_state(state["cuda"])
    tensor_parallel.get_cuda_rng_tracker().set_states(state["tracker"])


_OPTIMIZER_METADATA = {"distrib_optim_sharding_type": "dp_reshardable"}


def sharded_state(chunks, optimizer, scheduler, is_loading: bool, adapters_only: bool = False) -> dict[str, Any]:
    # The optimizer holds state for trained parameters only: with LoRA, the adapters' sharded tensors are all it maps.
    state = _model_sharded_state(chunks, adapters_only)
    # The optimizer maps its shards onto the model's sharded tensors.
    state["optimizer"] = optimizer.sharded_state_dict(dict(state), is_loading=is_loading, metadata=_OPTIMIZER_METADATA)
    state["scheduler"] = scheduler.state_dict()
    state["rng_state"] = _rng_state()
    return state


class Checkpointer(Callback):
    """Saves (optionally asynchronously) and loads this run's checkpoints of `chunks`, `optimizer` and
    `scheduler`, and says when to save (its policy); holds the async queue. As a callback it finishes the saves
    whose writes are done after every step, and on the run's stop finishes the one still in flight, or abandons it
    where the ranks did not stop together (an exception)."""

    def __init__(
        self,
        root: str,
        keep_last: int,
        async_save: bool,
        policy: SavePolicy,
        chunks,
        optimizer,
        scheduler,
        base: BaseRecord | None = None,
    ):
        """`base`: a LoRA run's record of its base weights (common.checkpoints.base_record): the checkpoints then
        hold the adapters only, with that record."""
        self.root = root
        self.base = base
        self.keep_last = keep_last
        self.async_save = async_save
        self.policy = policy
        self.chunks, self.optimizer, self.scheduler = chunks, optimizer, scheduler
        self.rank = torch.distributed.get_rank()
        self._queue: AsyncCallsQueue | None = None
        self._in_flight: int | None = None  # the step of an async save not finalized yet
        if async_save:
            self._queue = AsyncCallsQueue()
            with helpers_immune_to_stop_signals():
                writers_report_through_a_queue_that_dies_with_the_trainer()
        # This process's saves write under partial names of their own: a writer that outlived a killed trainer
        # (an asynchronous save's process on a lost node) can never write into a later process's save of the
        # same step, and whatever it leaves is a partial that is removed, never loaded.
        attempt = [uuid.uuid4().hex[:8]]
        torch.distributed.broadcast_object_list(attempt, src=0)
        self.attempt = attempt[0]
        if self.rank == 0:
            os.makedirs(root, exist_ok=True)
            remove_partials(root)
        torch.distributed.barrier()
        helpers_die_with_the_trainer()

    def due_before_training(self, step: int) -> bool:
        return self.policy.saves_before_training(step)

    def due(self, step: int, end: StepEnd) -> bool:
        """After `step`, which ended as `end` (the periodic save, the last one, a stop signal's)."""
        return self.policy.saves_after(step, end)

    def save(
        self, state: TrainState, log: Callable[[str], None], in_flight: Callable[[int], None] | None = None
    ) -> None:
        """`in_flight(step)` is called once the shards are being written (async) or written, and the checkpoint
        is not complete yet (resilience.inject_fault.during=save)."""
        started = time.perf_counter()
        self.wait()  # one save in flight at a time
        partial = partial_path(self.root, state.step, self.attempt)
        if self.rank == 0:
            shutil.rmtree(partial, ignore_errors=True)
            os.makedirs(partial)
            if self.base is not None:
                write_base_record(partial, self.base)
        torch.distributed.barrier()
        snapshot = TrainState(**asdict(state))
        extra = {"async_sharded_save": True, "async_strategy": _async_strategy()} if self.async_save else {}

        def finalize() -> None:
            self._in_flight = None
            if self.rank == 0:
                path = finalize_checkpoint(self.root, snapshot, partial)
                prune_checkpoints(self.root, self.keep_last)
                log(f"saved checkpoint {path}")
                # What the save cost: the time training was held (blocking_s) and until the checkpoint was complete.
                run_events.record(
                    os.path.dirname(self.root),
                    "checkpoint",
                    step=snapshot.step,
                    blocking_s=round(blocking[0], 3),
                    complete_s=round(time.perf_counter() - started, 3),
                    **{"async": self.async_save},
                )
            torch.distributed.barrier()

        blocking = [0.0]

        with self._stops_when_disk_full(state.step, partial):
            with helpers_immune_to_stop_signals():  # an async save starts its writer and result-queue processes
                request = dist_checkpointing.save(
                    sharded_state(
                        self.chunks,
                        self.optimizer,
                        self.scheduler,
                        is_loading=False,
                        adapters_only=self.base is not None,
                    ),
                    partial,
                    **extra,
                )
                if request is not None:
                    assert self._queue is not None, "only an asynchronous save returns a request"
                    request.add_finalize_fn(finalize)
                    self._queue.schedule_async_request(request)
                    self._in_flight = state.step
            if in_flight is not None:
                in_flight(state.step)
            blocking[0] = time.perf_counter() - started
            if request is None:
                finalize()

    @contextlib.contextmanager
    def _stops_when_disk_full(self, step: int, partial: str) -> Iterator[None]:
        """A save the file system refuses (ENOSPC, however the checkpoint writer wraps it) stops training with one
        line. The partial save is removed to give the space back; the newest complete checkpoint was never
        touched (a save becomes complete only by its final rename), so the run resumes from it."""
        try:
            yield
        except Exception as err:
            if not disk_full(err):
                raise
            if self.rank == 0:
                shutil.rmtree(partial, ignore_errors=True)
            newest = latest_checkpoint(self.root)
            intact = f"{newest[1]} is intact and the run resumes from it" if newest else "no checkpoint was complete"
            raise SystemExit(
                f"error: no space left on the device for the checkpoint of step {step} under {self.root}: training "
                f"stops; {intact} (free space, or keep fewer with training.checkpoint.keep_last, then run the same "
                "command again)"
            ) from None

    def step_ends(self, step: int) -> None:
        """Finish async saves whose writes are done (a collective: every rank, every step)."""
        if self._queue is not None:
            self._queue.maybe_finalize_async_calls(blocking=False)

    def wait(self) -> None:
        if self._queue is not None:
            self._queue.maybe_finalize_async_calls(blocking=True)

    def stops(self, stop: Stop) -> None:
        """The loop waited for the last save wherever the ranks stopped together. After an exception, which may be
        this rank's alone, the finalize's collectives could wait forever for the others: a save still in flight is
        abandoned (its writer killed; the partial directory is removed when the run starts again), and the run's
        events say so."""
        if self._queue is None:
            return
        if stop.every_rank_agrees:
            self._queue.close()
            return
        for active in self._queue.async_calls:
            active.async_caller.close(abort=True)
        self._queue.close(abort=True)
        if self._in_flight is not None and self.rank == 0:
            run_events.record(os.path.dirname(self.root), "checkpoint_abandoned", step=self._in_flight)
        self._in_flight = None

    def load_latest(self, log: Callable[[str], None]) -> TrainState | None:
        """Restore the newest complete checkpoint into the model, optimizer and scheduler; None when there is
        none. Every rank must see the same checkpoint (shared filesystem)."""
        latest = latest_checkpoint(self.root)
        steps = torch.tensor([latest[0] if latest else -1], dtype=torch.long, device="cuda")
        torch.distributed.all_reduce(steps, op=torch.distributed.ReduceOp.MIN)
        if latest is None or steps.item() != latest[0]:
            if latest is not None:
                raise SystemExit(
                    f"ranks disagree on the latest checkpoint under {self.root}: is it on a shared filesystem?"
                )
            return None
        step, path = latest
        if self.base is not None:  # every rank reads the record, so that all stop together
            problem = base_problem(path, self.base)
            if problem:
                raise SystemExit(f"error: {problem}")
        log(f"resuming from {path}")
        adapters_only = self.base is not None
        loaded = dist_checkpointing.load(
            sharded_state(self.chunks, self.optimizer, self.scheduler, is_loading=True, adapters_only=adapters_only),
            path,
        )
        _load_model_state(self.chunks, loaded, adapters_only)
        # Without autograd: in fp32 the distributed optimizer's main parameters are the model's own (leaves that
        # require grad), and its load copies into them in place.
        with torch.no_grad():
            self.optimizer.load_state_dict(loaded["optimizer"])
        self.scheduler.load_state_dict(loaded["scheduler"])
        _set_rng_state(loaded["rng_state"])
        return read_train_state(path)


def load_model_weights(path: str, chunks, log: Callable[[str], None]) -> None:
    """Model weights only, from any checkpoint of this format (another run, another parallel layout: the
    sharded format reshards on load). Optimizer, scheduler and data position start fresh."""
    if not os.path.isfile(os.path.join(path, STATE_FILE)):
        raise SystemExit(f"training.checkpoint.init_from={path} is not a complete checkpoint (no {STATE_FILE})")
    if os.path.isfile(os.path.join(path, BASE_FILE)):
        raise SystemExit(
            f"training.checkpoint.init_from={path} is a LoRA adapter checkpoint (adapters only, no base weights): "
            "start from its merged export (python -m recipes.hf.exporter) with training.checkpoint.init_from_hf"
        )
    log(f"initialising weights from {path}")
    sharded = _model_sharded_state(chunks)
    # LoRA (peft=lora): the base's checkpoint holds no adapters; they keep their initialisation.
    adapters = {
        key: {k: state.pop(k).data for k in [k for k in state if is_adapter_key(k)]} for key, state in sharded.items()
    }
    loaded = dist_checkpointing.load(sharded, path)
    for key, kept in adapters.items():
        loaded[key].update(kept)
    _load_model_state(chunks, loaded)


def disk_full(err: BaseException) -> bool:
    """ENOSPC anywhere in an error: raised directly, as a cause, or among the per-rank failures torch's checkpoint
    writer collects (CheckpointException.failures), whose messages keep only the text."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [err]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if getattr(current, "errno", None) == errno.ENOSPC or os.strerror(errno.ENOSPC) in str(current):
            return True
        failures = getattr(current, "failures", None)
        pending += [current.__cause__, current.__context__, *(failures.values() if isinstance(failures, dict) else [])]
    return False


def _async_strategy() -> str:
    return "nvrx" if HAVE_NVRX else "mcore"


# Where each asynchronous writer keeps the queue its processes report their writes through (one per process).
WRITER_MODULES = (
    "megatron.core.dist_checkpointing.strategies.filesystem_async",
    "nvidia_resiliency_ext.checkpointing.async_ckpt.filesystem_async",
)
_writer_manager: SyncManager | None = None
_writer_queue: Any = None


def writers_report_through_a_queue_that_dies_with_the_trainer() -> Any:
    """megatron-core's and nvidia-resiliency-ext's async writers report through a multiprocessing manager's queue,
    which they start on first use with 'spawn'. A spawned process gets no parent-death signal, and a manager never
    notices that its parent is gone: a trainer killed hard (kill -9, the OOM killer, ft_launcher restarting a
    hung rank) left it running for good, holding the job's output open, so a local launch never ended. This
    starts that manager ourselves, set to die with this process, and gives its queue to both writers. Once per
    process; call it from the main thread (the kernel's signal follows the thread that started the manager).
    Returns the queue."""
    global _writer_manager, _writer_queue
    if _writer_manager is None:
        manager = SyncManager(ctx=multiprocessing.get_context("spawn"))
        manager.start(initializer=die_with_parent, initargs=(os.getpid(),))
        _writer_manager, _writer_queue = manager, manager.Queue()
        for name in WRITER_MODULES:
            try:
                module: Any = importlib.import_module(name)  # its queue is a private global
            except ImportError:
                continue
            if not hasattr(module, "_results_queue"):  # a version that keeps it elsewhere would bring the leak back
                raise RuntimeError(f"{name} no longer keeps its writers' queue in _results_queue: update {__name__}")
            module._results_queue = _writer_queue
    return _writer_queue
