"""The plan: every size the job needs, derived once from a resolved config the checks accepted
(launcher/plan/validate.py). The recipes read plan.json and never re-derive these numbers."""
from __future__ import annotations

from typing import Any, Mapping

from common.plan import Plan
from launcher.plan.env import training_env
from launcher.plan.formulas import layer_parameters, layers_per_pipeline_stage, model_flops_per_sample, padded_vocab_size
from launcher.plan.hardware import LocalGpus
from launcher.plan.memory import estimate_memory_gib
from launcher.plan.sizes import sizes_of


def build_plan(cfg: Mapping[str, Any], local_gpus: LocalGpus | None = None) -> Plan:
    """Derive only: validate() runs the checks first, and this assumes they passed."""
    model, train, par, dtype = cfg["training"]["model"], cfg["training"], cfg["parallelism"], cfg["dtype"]
    sizes = sizes_of(cfg, local_gpus)
    tp, pp, cp, vp, dp = sizes.tp, sizes.pp, sizes.cp, sizes.vp, sizes.dp
    fp8 = dtype.get("fp8")
    fp8_param_gather = bool(dtype.get("fp8_param_gather"))
    stage_layers = layers_per_pipeline_stage(model["num_layers"], pp, bool(par["asymmetric_pipeline"]))
    vocab = padded_vocab_size(model["vocab_size"], model["make_vocab_size_divisible_by"], tp)
    memory = estimate_memory_gib(
        model, tp=tp, pp=pp, cp=cp, dp=dp, vp=vp, stage_layers=stage_layers, padded_vocab=vocab,
        seq_length=train["seq_length"], micro_batch_size=sizes.micro_batch_size,
        distributed_optimizer=par["use_distributed_optimizer"], grad_fp32=par["grad_reduce_in_fp32"],
        fp8_params=fp8_param_gather, recompute=par.get("recompute_granularity"))
    spec = sizes.spec
    peak = None if spec is None else (spec.fp8_peak_flops if fp8 else spec.bf16_peak_flops)
    return Plan(
        model=train["name"], dtype=dtype["name"], num_gpus=sizes.num_gpus, num_nodes=sizes.num_nodes,
        gpus_per_node=sizes.gpus_per_node, tp=tp, pp=pp, cp=cp, vp=vp, dp=dp,
        sequence_parallel=bool(par["sequence_parallel"]), micro_batch_size=sizes.micro_batch_size,
        global_batch_size=sizes.global_batch_size, num_microbatches=sizes.num_microbatches,
        seq_length=train["seq_length"], layers_per_pipeline_stage=stage_layers,
        asymmetric_pipeline=bool(par["asymmetric_pipeline"]), fp8=fp8, fp8_param_gather=fp8_param_gather,
        tp_comm_overlap=bool(par["tp_comm_overlap"]), model_flops_per_sample=model_flops_per_sample(model, train["seq_length"]),
        est_memory_gib_per_gpu=memory, padded_vocab_size=vocab,
        num_parameters=model["num_layers"] * layer_parameters(model) + 2 * model["vocab_size"] * model["hidden_size"]
        + model["hidden_size"],
        gpu_type=sizes.gpu_type, peak_flops_per_gpu=peak, peak_flops_kind="fp8" if fp8 else "bf16",
        env=training_env(par, cfg["cluster"]), cannot_train_reason=sizes.cannot_train_reason,
    )
