"""The plan: every size the job needs, derived once from a resolved config the checks accepted
(launcher/plan/validate.py). The recipes read plan.json and never re-derive these numbers."""

from __future__ import annotations

from functools import partial
from typing import Callable

from common.config import (
    AttentionBackend,
    Config,
    CrossEntropyFusion,
    DtypeConfig,
    Fp8Recipe,
    ParallelismConfig,
    RankOrder,
    packs_sequences,
    reduces_grads_in_fp32,
)
from common.plan import Plan
from launcher.plan.checks.precision import fp8_attention_head_sizes
from launcher.plan.env import training_env
from launcher.plan.formulas import layers_per_pipeline_stage, model_flops_per_sample, num_parameters, padded_vocab_size
from launcher.plan.hardware import LocalGpus
from launcher.plan.memory import estimate_memory_gib
from launcher.plan.sizes import Sizes, sizes_of

# parallelism.rank_order -> megatron-core's initialize_model_parallel(order=...): the first name varies fastest
# over consecutive ranks.
RANK_ORDERS = {RankOrder.pp_last: "tp-cp-ep-dp-pp", RankOrder.dp_last: "tp-cp-ep-pp-dp"}


def build_plan(cfg: Config, local_gpus: LocalGpus | None = None) -> Plan:
    """Derive only: validate() runs the checks first, and this assumes they passed."""
    train, par, dtype = cfg.training, cfg.parallelism, cfg.dtype
    model = train.model
    sizes = sizes_of(cfg, local_gpus)
    tp, pp, cp = _accepted(sizes.tp, "tp"), _accepted(sizes.pp, "pp"), _accepted(sizes.cp, "cp")
    vp, dp = sizes.vp, _accepted(sizes.dp, "dp")
    micro_batch_size = _accepted(sizes.micro_batch_size, "micro_batch_size")
    fp8, fp4 = dtype.fp8, dtype.fp4
    stage_layers = layers_per_pipeline_stage(model.num_layers, pp, par.asymmetric_pipeline)
    vocab = padded_vocab_size(model.vocab_size, model.make_vocab_size_divisible_by, tp)
    loss_kernel = resolve_cross_entropy_fusion(cfg, tp)
    memory_of = partial(
        estimate_memory_gib,
        model,
        tp=tp,
        pp=pp,
        cp=cp,
        dp=dp,
        vp=vp,
        stage_layers=stage_layers,
        padded_vocab=vocab,
        seq_length=train.seq_length,
        micro_batch_size=micro_batch_size,
        distributed_optimizer=par.use_distributed_optimizer,
        grad_fp32=reduces_grads_in_fp32(cfg),
        recompute=par.recompute_granularity,
        peft=cfg.peft,
        fp8=bool(fp8),
        num_microbatches=_accepted(sizes.num_microbatches, "num_microbatches"),
        sequence_parallel=par.sequence_parallel,
        defer_embedding_wgrad=par.defer_embedding_wgrad_compute,
        wgrad_deferral_limit=par.wgrad_deferral_limit,
        fp32=not dtype.bf16,
        cross_entropy_fusion=loss_kernel,
    )
    fp8_param_gather = resolve_fp8_param_gather(dtype, par, sizes, lambda: memory_of(fp8_params=False))
    memory = memory_of(fp8_params=fp8_param_gather)
    spec = sizes.spec
    kind = "fp4" if fp4 else "fp8" if fp8 else "bf16"
    peak = (
        None
        if spec is None
        else {"fp4": spec.fp4_peak_flops, "fp8": spec.fp8_peak_flops, "bf16": spec.bf16_peak_flops}[kind]
    )
    return Plan(
        model=train.name,
        dtype=dtype.name,
        num_gpus=_accepted(sizes.num_gpus, "num_gpus"),
        num_nodes=_accepted(sizes.num_nodes, "num_nodes"),
        gpus_per_node=_accepted(sizes.gpus_per_node, "gpus_per_node"),
        tp=tp,
        pp=pp,
        cp=cp,
        vp=vp,
        dp=dp,
        sequence_parallel=par.sequence_parallel,
        micro_batch_size=micro_batch_size,
        global_batch_size=_accepted(sizes.global_batch_size, "global_batch_size"),
        num_microbatches=_accepted(sizes.num_microbatches, "num_microbatches"),
        seq_length=train.seq_length,
        layers_per_pipeline_stage=stage_layers,
        asymmetric_pipeline=par.asymmetric_pipeline,
        fp8=fp8,
        fp8_param_gather=fp8_param_gather,
        fp8_dot_product_attention=resolve_fp8_attention(cfg, sizes),
        tp_comm_overlap=par.tp_comm_overlap,
        model_flops_per_sample=model_flops_per_sample(model, train.seq_length, cfg.peft),
        est_memory_gib_per_gpu=memory,
        padded_vocab_size=vocab,
        num_parameters=num_parameters(model),
        gpu_type=sizes.gpu_type,
        peak_flops_per_gpu=peak,
        peak_flops_kind=kind,
        rank_order=RANK_ORDERS[par.rank_order],
        cuda_graphs=train.cuda_graphs,
        cross_entropy_fusion=loss_kernel,
        env=training_env(par, cfg.cluster, train),
        cannot_train_reason=sizes.cannot_train_reason,
    )


def _accepted(size: int | None, name: str) -> int:
    """A size of a config the checks accepted, which every size of the plan is: None means they did not run."""
    if size is None:
        raise ValueError(f"build_plan needs a config validate() accepted; its {name} is not a valid size")
    return size


# From this many optimizer shards FP8 param gather is on by default (NVIDIA's reference setting, not yet measured
# here); up to 4 shards were measured faster without it (conf/dtype/fp8.yaml).
MANY_OPTIMIZER_SHARDS = 8


def resolve_fp8_attention(cfg: Config, sizes: Sizes) -> bool:
    """What dtype.fp8_dot_product_attention means for this run: the user's true or false; for null, on where what was
    measured holds: FP8 with delayed scaling, cuDNN's fused attention (the backend auto or fused), heads of a size the
    GPU's FP8 attention trains, one context-parallel rank and no packed sequences. There its validation loss matched
    the FP8 defaults' and a step ran 3% faster (conf/dtype/fp8.yaml has the measurements)."""
    dtype, model = cfg.dtype, cfg.training.model
    if dtype.fp8_dot_product_attention is not None:
        return bool(dtype.fp8 and dtype.fp8_dot_product_attention)
    spec = sizes.spec
    return (
        bool(dtype.fp8)
        and dtype.fp8_recipe == Fp8Recipe.delayed
        and model.attention_backend in (AttentionBackend.auto, AttentionBackend.fused)
        and spec is not None
        and fp8_attention_head_sizes(spec, model.kv_channels) is None
        and (sizes.cp or 1) == 1
        and not packs_sequences(cfg)
    )


def resolve_cross_entropy_fusion(cfg: Config, tp: int) -> str:
    """What training.model.cross_entropy_fusion means for this run: for null, Transformer Engine's kernel with one
    tensor-parallel rank, where it was measured 2-3% faster than the native fusion with the same validation loss,
    and the native one with several, not yet measured (conf/training/_common.yaml). Deterministic runs never take the
    native fusion, the user's choice included: its torch.compile'd kernels round the loss gradient differently from
    one process to the next (the first difference between two otherwise identical runs is the gradient of the
    logits), so a resumed or repeated run would not reproduce the losses. Transformer Engine's fused kernel has one
    fixed reduction order."""
    choice = cfg.training.model.cross_entropy_fusion
    if choice is None:
        choice = CrossEntropyFusion.te if tp == 1 else CrossEntropyFusion.native
    return str(CrossEntropyFusion.te if choice == CrossEntropyFusion.native and cfg.training.deterministic else choice)


def resolve_fp8_param_gather(
    dtype: DtypeConfig, par: ParallelismConfig, sizes: Sizes, memory_without: Callable[[], float]
) -> bool:
    """What dtype.fp8_param_gather means for this layout: the user's true or false; for null, on where the
    distributed optimizer shards over 8 or more data-parallel x context-parallel ranks (its all-gather then moves
    FP8 bytes: NVIDIA's reference setting), and with fewer shards only where bf16 weights would not fit the GPU
    (`memory_without()`: the estimate without FP8 weights, GiB). There FP8 weights cost a cast and transpose of
    every weight each step, more than the smaller all-gather saves (conf/dtype/fp8.yaml has the measurements)."""
    if dtype.fp8_param_gather is not None:
        return dtype.fp8_param_gather
    if not dtype.fp8 or not par.use_distributed_optimizer:
        return False
    if (sizes.dp or 1) * (sizes.cp or 1) >= MANY_OPTIMIZER_SHARDS:
        return True
    return sizes.spec is not None and memory_without() > sizes.spec.memory_gib
