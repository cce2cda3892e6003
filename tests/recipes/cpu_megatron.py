"""megatron-core models on the CPU, for tests: ranks are spawned processes in a gloo group; the GPTModel chunks
come from a composed config and plan through recipes.trainer.settings, with megatron's own layer spec (Transformer
Engine needs a GPU) in fp32. The sharded checkpoint layout (keys, global shapes, offsets of every TP / PP / VP
shard) is the same as with the Transformer Engine spec.

megatron-core calls CUDA in four places these tests pass through (the device of a rotary buffer and of a
checkpoint-save flag, a stream synchronize, the model-parallel RNG fork around dropout, and the copy of tied
embeddings a later pipeline stage gets, moved to the GPU for its all-reduce); the spawned processes redirect them
to the CPU. Nothing outside these test processes is changed."""

from __future__ import annotations

import contextlib
import os
import tempfile
import traceback
from typing import Any, Callable

import torch

from common.config import LoraConfig, LoraInit, LoraTarget
from common.plan import Plan


def _cpu_only() -> None:
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda *args, **kwargs: None
    torch.Tensor.cuda = lambda self, *args, **kwargs: self  # type: ignore[method-assign]


def _entry(rank: int, world: int, rendezvous: str, fn: Callable, args: tuple, queue) -> None:
    try:
        _cpu_only()
        torch.distributed.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
        queue.put((rank, True, fn(rank, *args)))
    except BaseException:  # noqa: BLE001 - reported to the test
        queue.put((rank, False, traceback.format_exc()))
    finally:
        if torch.distributed.is_initialized():
            from megatron.core import parallel_state as ps

            ps.destroy_model_parallel()
            torch.distributed.destroy_process_group()


def run_ranks(fn: Callable, world: int, *args: Any, timeout: float = 600) -> list[Any]:
    """fn(rank, *args) on `world` spawned ranks; their return values, by rank. A failing rank fails the test
    with its traceback."""
    ctx = torch.multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    # A rendezvous file rather than a TCP port: no port to collide with other processes on the machine.
    rendezvous = tempfile.mktemp(prefix="gloo_rendezvous_")
    procs = [ctx.Process(target=_entry, args=(r, world, rendezvous, fn, args, queue)) for r in range(world)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    try:
        for _ in range(world):
            rank, ok, value = queue.get(timeout=timeout)
            if not ok:
                raise AssertionError(f"rank {rank} failed:\n{value}")
            results[rank] = value
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
        if os.path.exists(rendezvous):
            os.unlink(rendezvous)
    return [results[r] for r in range(world)]


# A Llama of two small layers on two CPU ranks, and LoRA on every projection: what the LoRA tests build.
SMALL = [
    "training=llama31/tiny",
    "training.model.vocab_size=256",
    "training.model.num_layers=2",
    "training.model.hidden_size=64",
    "training.model.ffn_hidden_size=96",
    "training.model.num_attention_heads=4",
    "training.model.num_query_groups=2",
    "training.model.kv_channels=16",
    "training.seq_length=16",
    "training.micro_batch_size=1",
    "training.global_batch_size=2",
    "cluster.gpus_per_node=2",
]
LAYOUTS = {
    "tp1": ["parallelism=tp1"],
    # megatron-core's local spec has no sequence-parallel RMSNorm without apex: the adapter tests cover SP.
    "tp2": ["parallelism=tp2_sp", "parallelism.sequence_parallel=false", "parallelism.tp_comm_overlap=false"],
}
LORA = LoraConfig(
    method="lora",
    rank=4,
    alpha=8.0,
    dropout=0.0,
    target_modules=list(LoraTarget),
    a_init=LoraInit.kaiming_uniform,
    b_init=LoraInit.zero,
)


def small_run(layout: str, *overrides: str) -> tuple[Any, Plan]:
    """The composed config and plan of the small model at `layout` on a machine of 2 GPUs."""
    from launcher.config.compose import compose
    from launcher.plan.build import build_plan
    from launcher.plan.hardware import LocalGpus

    cfg = compose([*SMALL, *LAYOUTS[layout], *overrides])
    return cfg, build_plan(cfg, LocalGpus(2, "h100", ("gpu",)))


def build_chunks(cfg: dict, plan: Plan, dtype: torch.dtype = torch.float32) -> list[torch.nn.Module]:
    """Model parallel groups for the plan's layout, then this rank's GPTModel chunks (one per VP stage), with
    parameters in `dtype` (on the meta device inside `with torch.device("meta")`)."""
    from megatron.core import parallel_state as ps, tensor_parallel
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    from recipes.trainer import settings

    ps.initialize_model_parallel(
        plan.tp, plan.pp, virtual_pipeline_model_parallel_size=plan.vp, context_parallel_size=plan.cp
    )
    tensor_parallel.get_cuda_rng_tracker().fork = lambda *args, **kwargs: contextlib.nullcontext()
    kwargs = settings.transformer_config_kwargs(cfg, plan, grad_accum_fusion=False)
    on_meta = torch.empty(0).device.type == "meta"  # megatron's CPU init builds whole weights on the CPU
    kwargs.update(
        use_cpu_initialization=True,
        perform_initialization=not on_meta,
        bf16=dtype == torch.bfloat16,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        autocast_dtype=dtype,
        apply_rope_fusion=False,
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        cross_entropy_loss_fusion=False,
        deallocate_pipeline_outputs=False,
    )
    config = TransformerConfig(**kwargs)
    spec = get_gpt_layer_local_spec(normalization=config.normalization)
    chunks = []
    for stage in range(plan.vp or 1):
        vp_stage = stage if plan.vp else None
        chunks.append(
            GPTModel(
                config,
                spec,
                pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage),
                post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage),
                vp_stage=vp_stage,
                **settings.gpt_model_kwargs(cfg, plan),
            ).eval()
        )
    return chunks


def tp_logits(chunk: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Full-vocabulary logits of a TP-sharded single-stage model (the output layer is vocabulary-parallel)."""
    from megatron.core import parallel_state as ps

    seq = tokens.shape[1]
    positions = torch.arange(seq).unsqueeze(0).expand_as(tokens)
    causal = torch.triu(torch.ones(seq, seq), diagonal=1).bool()[None, None]
    with torch.no_grad():
        local = chunk(tokens, positions, causal)
    parts = [torch.empty_like(local) for _ in range(ps.get_tensor_model_parallel_world_size())]
    torch.distributed.all_gather(parts, local.contiguous(), group=ps.get_tensor_model_parallel_group())
    return torch.cat(parts, dim=-1)


def save_checkpoint(rank: int, chunks: list[torch.nn.Module], run_dir: str, step: int = 0) -> str:
    """The model part of what the trainer saves (dist_checkpointing, then the completion marker)."""
    import shutil

    from megatron.core import dist_checkpointing

    from recipes.trainer import checkpoint

    root = os.path.join(run_dir, "checkpoints")
    partial = checkpoint.partial_path(root, step)
    if rank == 0:
        shutil.rmtree(partial, ignore_errors=True)
        os.makedirs(partial)
    torch.distributed.barrier()
    dist_checkpointing.save(checkpoint._model_sharded_state(chunks), partial)
    torch.distributed.barrier()
    path = ""
    if rank == 0:
        path = checkpoint.finalize_checkpoint(root, checkpoint.TrainState(step=step, consumed_samples=0))
    torch.distributed.barrier()
    return path
