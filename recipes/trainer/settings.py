"""The resolved config and plan, mapped onto megatron-core's config objects. Every size comes from the plan;
this module only translates names."""

from __future__ import annotations

from typing import Any, Mapping

from megatron.core.distributed import DistributedDataParallelConfig
from megatron.core.optimizer import OptimizerConfig
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.enums import AttnBackend
import torch
import torch.nn.functional as F

from common.plan import Plan

# Bitwise-reproducible runs: deterministic attention backward in Transformer Engine, a fixed cuBLAS workspace
# and one NCCL algorithm. Read when CUDA, cuBLAS and NCCL start, so set before any of them do.
DETERMINISTIC_ENV = {
    "NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0",
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
    "NCCL_ALGO": "Ring",
}


def apply_determinism(cfg: Mapping[str, Any], environ: dict) -> bool:
    """Export DETERMINISTIC_ENV when training.deterministic is set (same seed and data -> same losses, at some
    cost in speed). Returns whether it is on."""
    if not cfg["training"].get("deterministic"):
        return False
    environ.update(DETERMINISTIC_ENV)
    return True


# training.cuda_graphs -> TransformerConfig.cuda_graph_impl. Per-layer graphs are Transformer Engine's
# (make_graphed_callables through megatron-core's TECudaGraphHelper): they run only in training mode, so evaluation
# stays eager, and they are captured when the trainer says so. megatron-core's own per-layer graphs ("local") are
# captured inside the first schedule call, evaluation included, and replay the training graphs during evaluation.
CUDA_GRAPH_IMPL = {"none": "none", "per_layer": "transformer_engine", "full_iteration": "full_iteration"}
# training.model.cross_entropy_fusion -> (cross_entropy_loss_fusion, cross_entropy_fusion_impl).
CROSS_ENTROPY = {"native": (True, "native"), "te": (True, "te"), "none": (False, "native")}
# dtype.fp4 -> (TransformerConfig.fp4, fp4_recipe): NVFP4 is E2M1 values with FP8 block scales.
FP4 = {"nvfp4": ("e2m1", "nvfp4")}


def cross_entropy_fusion(cfg: Mapping[str, Any]) -> str:
    """training.model.cross_entropy_fusion, except that deterministic runs never take the native fusion: its
    torch.compile'd kernels give the loss gradient a rounding that differs from one process to the next (the
    first difference between two otherwise identical runs is the gradient of the logits), so a resumed or
    repeated run would not reproduce the losses. Transformer Engine's fused kernel has one fixed reduction order."""
    train = cfg["training"]
    choice = train["model"].get("cross_entropy_fusion") or "native"
    return "te" if choice == "native" and train.get("deterministic") else choice


def precision_kwargs(cfg: Mapping[str, Any], plan: Plan) -> dict[str, Any]:
    """TransformerConfig's low-precision fields: FP8 (its recipe, FP8 weights, FP8 attention and output layer),
    FP4, and the Transformer Engine kernels that write the FP8 copies themselves."""
    dtype = cfg["dtype"]
    fp8 = plan.fp8
    fp4, fp4_recipe = FP4.get(dtype.get("fp4") or "", (None, "nvfp4"))
    te_activation = bool(dtype.get("te_activation_func"))
    return dict(
        fp8=fp8,
        fp8_recipe=dtype["fp8_recipe"] if fp8 else "delayed",
        fp8_param=bool(plan.fp8_param_gather),
        fp8_margin=dtype["fp8_margin"],
        fp8_amax_history_len=dtype["fp8_amax_history_len"],
        fp8_amax_compute_algo=dtype["fp8_amax_compute_algo"],
        fp8_dot_product_attention=bool(dtype["fp8_dot_product_attention"]) and bool(fp8),
        fp8_output_proj=bool(dtype.get("fp8_output_layer")) and bool(fp8),
        fp4=fp4,
        fp4_recipe=fp4_recipe,
        use_transformer_engine_op_fuser=bool(dtype.get("te_op_fuser")),
        use_te_activation_func=te_activation,
        # megatron-core's fused bias-SwiGLU and Transformer Engine's activation are exclusive.
        bias_activation_fusion=not te_activation,
    )


def cuda_graph_kwargs(cfg: Mapping[str, Any], plan: Plan) -> dict[str, Any]:
    train = cfg["training"]
    graphs = plan.cuda_graphs != "none"
    return dict(
        cuda_graph_impl=CUDA_GRAPH_IMPL[plan.cuda_graphs],
        # Empty: the whole decoder layer (megatron-core's "full" scope, deprecated under that name).
        cuda_graph_modules=[],
        cuda_graph_warmup_steps=int(train["cuda_graph_warmup_steps"]),
        # Graph-safe RNG states (Megatron-LM turns the Transformer Engine tracker on with CUDA graphs).
        use_te_rng_tracker=graphs,
    )


def layer_spec_kwargs(config) -> dict[str, Any]:
    """Arguments of get_gpt_layer_with_transformer_engine_spec that follow the TransformerConfig."""
    return dict(
        use_te_op_fuser=bool(config.use_transformer_engine_op_fuser),
        use_te_activation_func=bool(config.use_te_activation_func),
    )


def transformer_config_kwargs(cfg: Mapping[str, Any], plan: Plan, *, grad_accum_fusion: bool) -> dict[str, Any]:
    model = cfg["training"]["model"]
    par = cfg["parallelism"]
    vp = plan.vp
    deferral = bool(par["defer_embedding_wgrad_compute"]) and grad_accum_fusion
    p2p_overlap = bool(par["overlap_p2p_comm"]) and vp is not None  # only the interleaved schedule overlaps
    ce_fusion, ce_impl = CROSS_ENTROPY[cross_entropy_fusion(cfg)]
    return dict(
        # Architecture.
        num_layers=model["num_layers"],
        hidden_size=model["hidden_size"],
        ffn_hidden_size=model["ffn_hidden_size"],
        num_attention_heads=model["num_attention_heads"],
        num_query_groups=model["num_query_groups"],
        kv_channels=model["kv_channels"],
        normalization="RMSNorm",
        layernorm_epsilon=model["norm_epsilon"],
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        init_method_std=model["init_method_std"],
        attention_backend=AttnBackend[model["attention_backend"]],
        # Precision: bf16 weights and activations, fp32 master weights in the optimizer.
        bf16=True,
        params_dtype=torch.bfloat16,
        pipeline_dtype=torch.bfloat16,
        autocast_dtype=torch.bfloat16,
        **precision_kwargs(cfg, plan),
        # Parallelism (sizes from the plan).
        tensor_model_parallel_size=plan.tp,
        pipeline_model_parallel_size=plan.pp,
        virtual_pipeline_model_parallel_size=vp,
        context_parallel_size=plan.cp,
        sequence_parallel=plan.sequence_parallel,
        cp_comm_type=par["cp_comm_type"] if plan.cp > 1 else None,
        account_for_embedding_in_pipeline_split=bool(plan.asymmetric_pipeline),
        account_for_loss_in_pipeline_split=bool(plan.asymmetric_pipeline),
        tp_comm_overlap=bool(plan.tp_comm_overlap),
        overlap_p2p_comm=p2p_overlap,
        batch_p2p_comm=not p2p_overlap,
        deallocate_pipeline_outputs=True,
        defer_embedding_wgrad_compute=deferral,
        wgrad_deferral_limit=par["wgrad_deferral_limit"] if deferral else 0,
        gradient_accumulation_fusion=grad_accum_fusion,
        # Fused kernels (the activation's in precision_kwargs).
        bias_dropout_fusion=True,
        masked_softmax_fusion=True,
        persist_layer_norm=True,
        apply_rope_fusion=True,
        cross_entropy_loss_fusion=ce_fusion,
        cross_entropy_fusion_impl=ce_impl,
        **cuda_graph_kwargs(cfg, plan),
        # Loss: mean over every token of the global batch, whatever its microbatch or rank.
        calculate_per_token_loss=True,
        deterministic_mode=bool(cfg["training"].get("deterministic")),
        # Activation recomputation.
        recompute_granularity=par["recompute_granularity"],
        recompute_method=par["recompute_method"],
        recompute_num_layers=par["recompute_num_layers"],
    )


def transformer_config(cfg: Mapping[str, Any], plan: Plan, *, grad_accum_fusion: bool):
    return TransformerConfig(**transformer_config_kwargs(cfg, plan, grad_accum_fusion=grad_accum_fusion))


def ddp_config(cfg: Mapping[str, Any], plan: Plan):
    par = cfg["parallelism"]
    return DistributedDataParallelConfig(
        grad_reduce_in_fp32=bool(par["grad_reduce_in_fp32"]),
        overlap_grad_reduce=bool(par["overlap_grad_reduce"]),
        overlap_param_gather=bool(par["overlap_param_gather"]),
        align_param_gather=bool(par["align_param_gather"]) and plan.pp > 1,
        use_distributed_optimizer=bool(par["use_distributed_optimizer"]),
        fp8_param_gather=bool(plan.fp8_param_gather),
        check_for_nan_in_grad=False,  # the trainer checks the global grad norm every step
        average_in_collective=False,  # per-token loss: grads are summed, then divided by the token count
    )


def optimizer_config(cfg: Mapping[str, Any]):
    opt = cfg["training"]["optimizer"]
    par = cfg["parallelism"]
    return OptimizerConfig(
        optimizer="adam",
        lr=opt["lr"],
        min_lr=opt["min_lr"],
        weight_decay=opt["weight_decay"],
        adam_beta1=opt["adam_beta1"],
        adam_beta2=opt["adam_beta2"],
        adam_eps=opt["adam_eps"],
        clip_grad=opt["clip_grad"],
        bf16=True,
        params_dtype=torch.bfloat16,
        use_distributed_optimizer=bool(par["use_distributed_optimizer"]),
        overlap_param_gather=bool(par["overlap_param_gather"]),
    )


def scheduler_kwargs(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Arguments of megatron's OptimizerParamScheduler, in optimizer steps."""
    train = cfg["training"]
    opt, sched = train["optimizer"], train["scheduler"]
    return dict(
        init_lr=0.0,
        max_lr=opt["lr"],
        min_lr=opt["min_lr"],
        lr_warmup_steps=sched["warmup_steps"],
        lr_decay_steps=sched["decay_steps"] or train["train_steps"],
        lr_decay_style="cosine",
        start_wd=opt["weight_decay"],
        end_wd=opt["weight_decay"],
        wd_incr_steps=train["train_steps"],
        wd_incr_style="constant",
        use_checkpoint_opt_param_scheduler=True,
        override_opt_param_scheduler=False,
    )


def gpt_model_kwargs(cfg: Mapping[str, Any], plan: Plan) -> dict[str, Any]:
    model = cfg["training"]["model"]
    return dict(
        vocab_size=plan.padded_vocab_size,
        max_sequence_length=plan.seq_length,
        position_embedding_type="rope",
        rotary_percent=1.0,
        rotary_base=model["rotary_base"],
        # Llama 3.1 frequency scaling (mcore fixes low/high factors 1/4 and original length 8192).
        rope_scaling=bool(model["rope_scaling"]),
        rope_scaling_factor=float(model["rope_scaling_factor"]),
        share_embeddings_and_output_weights=False,
        parallel_output=True,
    )


def userbuffer_settings(cfg: Mapping[str, Any], plan: Plan) -> dict[str, Any]:
    """Arguments of transformer_engine's initialize_ub: the buffer is one microbatch of this rank's CP shard
    (sequence and batch flattened) by hidden size."""
    return dict(
        shape=[plan.seq_length * plan.micro_batch_size // plan.cp, cfg["training"]["model"]["hidden_size"]],
        tp_size=plan.tp,
        fp8=bool(plan.fp8),
        ub_cfgs=cfg["parallelism"].get("tp_comm_overlap_cfg"),
    )
