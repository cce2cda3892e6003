"""The resolved config and plan, mapped onto megatron-core's config objects. Every size comes from the plan;
this module only translates names.

megatron-core's TransformerConfig, DistributedDataParallelConfig and OptimizerConfig are each built from one
table: megatron's field name -> where its value comes from (a function of the run, `Sources`). A value that
needs more than reading one key is a small named function below the tables; a test checks that every name in the
tables is a field of megatron-core's dataclass (tests/recipes/test_perf_settings_cpu.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, MutableMapping
import warnings

from megatron.core.distributed import DistributedDataParallelConfig
from megatron.core.optimizer import OptimizerConfig
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.enums import AttnBackend
import torch
import torch.nn.functional as F

from common.config import Config, ModelConfig, ParallelismConfig, reduces_grads_in_fp32
from common.plan import Plan

# Bitwise-reproducible runs: deterministic attention backward in Transformer Engine, a fixed cuBLAS workspace
# and one NCCL algorithm. Read when CUDA, cuBLAS and NCCL start, so set before any of them do.
DETERMINISTIC_ENV = {
    "NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0",
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
    "NCCL_ALGO": "Ring",
}


def apply_determinism(cfg: Config, environ: MutableMapping[str, str]) -> bool:
    """Export DETERMINISTIC_ENV when training.deterministic is set (same seed and data -> same losses, at some
    cost in speed). Returns whether it is on."""
    if not cfg.training.deterministic:
        return False
    environ.update(DETERMINISTIC_ENV)
    return True


@dataclass(frozen=True)
class Sources:
    """What megatron-core's fields are derived from: the run's config and plan, and whether weight gradients
    accumulate inside the GEMMs (the trainer's build does; the CPU tests' models cannot)."""

    cfg: Config
    plan: Plan
    grad_accum_fusion: bool = True

    @property
    def model(self) -> ModelConfig:
        return self.cfg.training.model

    @property
    def par(self) -> ParallelismConfig:
        return self.cfg.parallelism


# A megatron-core field's value, from the run.
Source = Callable[[Sources], Any]


def fixed(value: Any) -> Source:
    """A field every run sets the same way."""
    return lambda _: value


def _weights_dtype(run: Sources) -> torch.dtype:
    return torch.bfloat16 if run.cfg.dtype.bf16 else torch.float32


# --------------------------------------------------------------------------- values that need a decision
# training.cuda_graphs -> TransformerConfig.cuda_graph_impl. Per-layer graphs are Transformer Engine's
# (make_graphed_callables through megatron-core's TECudaGraphHelper): they run only in training mode, so evaluation
# stays eager, and they are captured when the trainer says so. megatron-core's own per-layer graphs ("local") are
# captured inside the first schedule call, evaluation included, and replay the training graphs during evaluation.
CUDA_GRAPH_IMPL = {"none": "none", "per_layer": "transformer_engine", "full_iteration": "full_iteration"}
# training.model.cross_entropy_fusion -> (cross_entropy_loss_fusion, cross_entropy_fusion_impl).
CROSS_ENTROPY = {"native": (True, "native"), "te": (True, "te"), "none": (False, "native")}
# training.model.normalization -> TransformerConfig.normalization.
NORMALIZATION = {"rmsnorm": "RMSNorm", "layernorm": "LayerNorm"}
# training.model.activation -> TransformerConfig.activation_func of the gated MLP (act(x W_gate) * x W_up).
ACTIVATION = {"swiglu": F.silu, "geglu": F.gelu}
# dtype.fp4 -> (TransformerConfig.fp4, fp4_recipe): NVFP4 is E2M1 values with FP8 block scales.
FP4 = {"nvfp4": ("e2m1", "nvfp4")}
NO_FP4 = (None, "nvfp4")


def _cross_entropy(run: Sources) -> tuple[bool, str]:
    """The loss kernel the plan chose (launcher/plan/build.py: resolve_cross_entropy_fusion)."""
    return CROSS_ENTROPY[run.plan.cross_entropy_fusion]


def _fp4(run: Sources) -> tuple[str | None, str]:
    return FP4.get(run.cfg.dtype.fp4 or "", NO_FP4)


def _fp8_recipe(run: Sources) -> Any:
    """dtype.fp8_recipe where the plan trains in FP8; megatron's default otherwise."""
    return run.cfg.dtype.fp8_recipe if run.plan.fp8 else "delayed"


def _in_fp8(flag: bool, run: Sources) -> bool:
    """A dtype flag that only means something in FP8 runs."""
    return bool(flag) and bool(run.plan.fp8)


def _p2p_overlap(run: Sources) -> bool:
    """Only the interleaved schedule overlaps its pipeline sends and receives with compute."""
    return bool(run.par.overlap_p2p_comm) and run.plan.vp is not None


def _defers_embedding_wgrad(run: Sources) -> bool:
    """Deferring the embedding's weight gradients needs the fused accumulation."""
    return bool(run.par.defer_embedding_wgrad_compute) and run.grad_accum_fusion


def _uses_te_activation(run: Sources) -> bool:
    return bool(run.cfg.dtype.te_activation_func)


# --------------------------------------------------------------------------- the tables
TRANSFORMER_FIELDS: dict[str, Source] = {
    # Architecture.
    "num_layers": lambda run: run.model.num_layers,
    "hidden_size": lambda run: run.model.hidden_size,
    "ffn_hidden_size": lambda run: run.model.ffn_hidden_size,
    "num_attention_heads": lambda run: run.model.num_attention_heads,
    "num_query_groups": lambda run: run.model.num_query_groups,
    "kv_channels": lambda run: run.model.kv_channels,
    "normalization": lambda run: NORMALIZATION[run.model.normalization],
    "layernorm_epsilon": lambda run: run.model.norm_epsilon,
    # Every activation of the spec is gated: the MLP of LlamaForCausalLM, whose gate and up make linear_fc1.
    "gated_linear_unit": fixed(True),
    "activation_func": lambda run: ACTIVATION[run.model.activation],
    "add_bias_linear": lambda run: run.model.add_bias_linear,
    # q/k/v biases alone (Qwen's) have no LlamaForCausalLM form; add_bias_linear gives them with the others.
    "add_qkv_bias": fixed(False),
    "hidden_dropout": fixed(0.0),
    "attention_dropout": fixed(0.0),
    "init_method_std": lambda run: run.model.init_method_std,
    "attention_backend": lambda run: AttnBackend[run.model.attention_backend],
    # Precision: bf16 weights and activations, fp32 master weights in the optimizer; dtype=fp32: fp32 throughout.
    "bf16": lambda run: bool(run.cfg.dtype.bf16),
    "params_dtype": _weights_dtype,
    "pipeline_dtype": _weights_dtype,
    "autocast_dtype": _weights_dtype,
    # Low precision: FP8 (its recipe, FP8 weights, FP8 attention and output layer), FP4, and the Transformer
    # Engine kernels that write the FP8 copies themselves.
    "fp8": lambda run: run.plan.fp8,
    "fp8_recipe": _fp8_recipe,
    "fp8_param": lambda run: bool(run.plan.fp8_param_gather),
    "fp8_margin": lambda run: run.cfg.dtype.fp8_margin,
    "fp8_amax_history_len": lambda run: run.cfg.dtype.fp8_amax_history_len,
    "fp8_amax_compute_algo": lambda run: run.cfg.dtype.fp8_amax_compute_algo,
    "fp8_dot_product_attention": lambda run: bool(run.plan.fp8_dot_product_attention),
    "fp8_output_proj": lambda run: _in_fp8(run.cfg.dtype.fp8_output_layer, run),
    "fp4": lambda run: _fp4(run)[0],
    "fp4_recipe": lambda run: _fp4(run)[1],
    "use_transformer_engine_op_fuser": lambda run: bool(run.cfg.dtype.te_op_fuser),
    "use_te_activation_func": _uses_te_activation,
    # megatron-core's fused bias-SwiGLU and Transformer Engine's activation are exclusive.
    "bias_activation_fusion": lambda run: not _uses_te_activation(run),
    # Parallelism (sizes from the plan).
    "tensor_model_parallel_size": lambda run: run.plan.tp,
    "pipeline_model_parallel_size": lambda run: run.plan.pp,
    "virtual_pipeline_model_parallel_size": lambda run: run.plan.vp,
    "context_parallel_size": lambda run: run.plan.cp,
    "sequence_parallel": lambda run: run.plan.sequence_parallel,
    "cp_comm_type": lambda run: run.par.cp_comm_type if run.plan.cp > 1 else None,
    "account_for_embedding_in_pipeline_split": lambda run: bool(run.plan.asymmetric_pipeline),
    "account_for_loss_in_pipeline_split": lambda run: bool(run.plan.asymmetric_pipeline),
    "tp_comm_overlap": lambda run: bool(run.plan.tp_comm_overlap),
    "overlap_p2p_comm": _p2p_overlap,
    "batch_p2p_comm": lambda run: not _p2p_overlap(run),
    "deallocate_pipeline_outputs": fixed(True),
    "defer_embedding_wgrad_compute": _defers_embedding_wgrad,
    "wgrad_deferral_limit": lambda run: run.par.wgrad_deferral_limit if _defers_embedding_wgrad(run) else 0,
    "gradient_accumulation_fusion": lambda run: run.grad_accum_fusion,
    # Fused kernels (the activation's with the precision).
    "bias_dropout_fusion": fixed(True),
    "masked_softmax_fusion": fixed(True),
    "persist_layer_norm": fixed(True),
    "apply_rope_fusion": fixed(True),
    "cross_entropy_loss_fusion": lambda run: _cross_entropy(run)[0],
    "cross_entropy_fusion_impl": lambda run: _cross_entropy(run)[1],
    # CUDA graphs.
    "cuda_graph_impl": lambda run: CUDA_GRAPH_IMPL[run.plan.cuda_graphs],
    # Empty: the whole decoder layer (megatron-core's "full" scope, deprecated under that name).
    "cuda_graph_modules": lambda _: [],
    "cuda_graph_warmup_steps": lambda run: int(run.cfg.training.cuda_graph_warmup_steps),
    # Graph-safe RNG states (Megatron-LM turns the Transformer Engine tracker on with CUDA graphs).
    "use_te_rng_tracker": lambda run: run.plan.cuda_graphs != "none",
    # Loss: mean over every token of the global batch, whatever its microbatch or rank.
    "calculate_per_token_loss": fixed(True),
    "deterministic_mode": lambda run: bool(run.cfg.training.deterministic),
    # Activation recomputation.
    "recompute_granularity": lambda run: run.par.recompute_granularity,
    "recompute_method": lambda run: run.par.recompute_method,
    "recompute_num_layers": lambda run: run.par.recompute_num_layers,
}

DDP_FIELDS: dict[str, Source] = {
    "grad_reduce_in_fp32": lambda run: reduces_grads_in_fp32(run.cfg),
    "overlap_grad_reduce": lambda run: bool(run.par.overlap_grad_reduce),
    "overlap_param_gather": lambda run: bool(run.par.overlap_param_gather),
    # Aligned all-gathers only matter across pipeline stages.
    "align_param_gather": lambda run: bool(run.par.align_param_gather) and run.plan.pp > 1,
    "use_distributed_optimizer": lambda run: bool(run.par.use_distributed_optimizer),
    "fp8_param_gather": lambda run: bool(run.plan.fp8_param_gather),
    "check_for_nan_in_grad": fixed(False),  # the trainer checks the global grad norm every step
    "average_in_collective": fixed(False),  # per-token loss: grads are summed, then divided by the token count
}

OPTIMIZER_FIELDS: dict[str, Source] = {
    "optimizer": fixed("adam"),
    "lr": lambda run: run.cfg.training.optimizer.lr,
    "min_lr": lambda run: run.cfg.training.optimizer.min_lr,
    "weight_decay": lambda run: run.cfg.training.optimizer.weight_decay,
    "adam_beta1": lambda run: run.cfg.training.optimizer.adam_beta1,
    "adam_beta2": lambda run: run.cfg.training.optimizer.adam_beta2,
    "adam_eps": lambda run: run.cfg.training.optimizer.adam_eps,
    "clip_grad": lambda run: run.cfg.training.optimizer.clip_grad,
    "bf16": lambda run: bool(run.cfg.dtype.bf16),
    "params_dtype": _weights_dtype,
    "use_distributed_optimizer": lambda run: bool(run.par.use_distributed_optimizer),
    "overlap_param_gather": lambda run: bool(run.par.overlap_param_gather),
}


def fill(table: dict[str, Source], run: Sources) -> dict[str, Any]:
    """A table's fields with their values for this run."""
    return {name: source(run) for name, source in table.items()}


# --------------------------------------------------------------------------- megatron-core's config objects
def transformer_config_kwargs(cfg: Config, plan: Plan, *, grad_accum_fusion: bool) -> dict[str, Any]:
    return fill(TRANSFORMER_FIELDS, Sources(cfg, plan, grad_accum_fusion))


def transformer_config(cfg: Config, plan: Plan, *, grad_accum_fusion: bool) -> TransformerConfig:
    return make_transformer_config(transformer_config_kwargs(cfg, plan, grad_accum_fusion=grad_accum_fusion))


# megatron-core 0.19.2 warns of Transformer Engine's loss kernel on every run that takes it. The instability it
# means was in older kernels (fp32 gradients kept in the bf16 input's buffer); Transformer Engine 2.20, the only
# series conf/stack.yaml accepts, saves compact softmax statistics and recomputes the gradient in the backward. The
# kernel is checked against torch's fp32 loss and gradient and by a 300-step validation loss on the GPU
# (conf/training/_common.yaml), so the warning would only alarm.
TE_LOSS_WARNING = "Transformer Engine cross entropy loss fusion has known stability issues"


def make_transformer_config(kwargs: dict[str, Any]) -> TransformerConfig:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=TE_LOSS_WARNING)
        return TransformerConfig(**kwargs)


def ddp_config(cfg: Config, plan: Plan) -> DistributedDataParallelConfig:
    return DistributedDataParallelConfig(**fill(DDP_FIELDS, Sources(cfg, plan)))


def optimizer_config(cfg: Config, plan: Plan) -> OptimizerConfig:
    return OptimizerConfig(**fill(OPTIMIZER_FIELDS, Sources(cfg, plan)))


def layer_spec_kwargs(config: TransformerConfig) -> dict[str, Any]:
    """Arguments of get_gpt_layer_with_transformer_engine_spec that follow the TransformerConfig."""
    return dict(
        use_te_op_fuser=bool(config.use_transformer_engine_op_fuser),
        use_te_activation_func=bool(config.use_te_activation_func),
    )


def scheduler_kwargs(cfg: Config) -> dict[str, Any]:
    """Arguments of megatron's OptimizerParamScheduler, in optimizer steps."""
    train = cfg.training
    opt, sched = train.optimizer, train.scheduler
    return dict(
        init_lr=0.0,
        max_lr=opt.lr,
        min_lr=opt.min_lr,
        lr_warmup_steps=sched.warmup_steps,
        lr_decay_steps=sched.decay_steps or train.train_steps,
        lr_decay_style="cosine",
        start_wd=opt.weight_decay,
        end_wd=opt.weight_decay,
        wd_incr_steps=train.train_steps,
        wd_incr_style="constant",
        use_checkpoint_opt_param_scheduler=True,
        override_opt_param_scheduler=False,
    )


def gpt_model_kwargs(cfg: Config, plan: Plan) -> dict[str, Any]:
    model = cfg.training.model
    scaling = model.rope_scaling
    return dict(
        vocab_size=plan.padded_vocab_size,
        max_sequence_length=plan.seq_length,
        position_embedding_type="rope",
        rotary_percent=1.0,
        rotary_base=model.rotary_base,
        # Llama 3 frequency scaling: megatron-core takes the factor and fixes low/high factors 1/4 and the original
        # length 8192 (the plan refuses other values); megatron-core's default factor where there is no scaling.
        rope_scaling=scaling is not None,
        rope_scaling_factor=float(scaling.factor) if scaling else 8.0,
        share_embeddings_and_output_weights=model.share_embeddings_and_output_weights,
        parallel_output=True,
    )


def userbuffer_settings(cfg: Config, plan: Plan) -> dict[str, Any]:
    """Arguments of transformer_engine's initialize_ub: the buffer is one microbatch of this rank's CP shard
    (sequence and batch flattened) by hidden size."""
    return dict(
        shape=[plan.seq_length * plan.micro_batch_size // plan.cp, cfg.training.model.hidden_size],
        tp_size=plan.tp,
        fp8=bool(plan.fp8),
        ub_cfgs=cfg.parallelism.tp_comm_overlap_cfg,
    )
