"""The plan as a compact table for the console."""

from __future__ import annotations

from common.config import Config, LoraConfig
from common.plan import Plan
from launcher.plan.hardware import gpu_spec


def layout(tp: int, pp: int, cp: int, vp: int | None, dp: int | None = None) -> str:
    """'TP4 PP4 CP2 VP5 DP2' (VP only when interleaved, DP only when given)."""
    parts = [f"TP{tp}", f"PP{pp}", f"CP{cp}"]
    if vp:
        parts.append(f"VP{vp}")
    if dp is not None:
        parts.append(f"DP{dp}")
    return " ".join(parts)


def format_plan(plan: Plan, cfg: Config) -> str:
    cluster = cfg.cluster
    gpu = plan.gpu_type or "GPU type unknown"
    where = (
        "this machine"
        if cluster.runs_here
        else f"{plan.num_nodes} node{'s' if plan.num_nodes > 1 else ''} x {plan.gpus_per_node}"
    )
    features = [
        name
        for name, on in (
            ("sequence parallel", plan.sequence_parallel),
            ("TP comm overlap", plan.tp_comm_overlap),
            ("asymmetric pipeline", plan.asymmetric_pipeline),
            (
                f"fp8 {plan.fp8}"
                + (" + param gather" if plan.fp8_param_gather else "")
                + (" + attention" if plan.fp8_dot_product_attention else ""),
                bool(plan.fp8),
            ),
            ("data-parallel-last ranks", plan.rank_order.endswith("-dp")),
            (f"CUDA graphs {plan.cuda_graphs}", plan.cuda_graphs != "none"),
            (f"{plan.cross_entropy_fusion} loss kernel", True),
        )
        if on
    ]
    stages = " ".join(str(n) for n in plan.layers_per_pipeline_stage)
    layer_note = (
        " (embedding and loss take one layer's slot on the first and last stage)" if plan.asymmetric_pipeline else ""
    )
    memory = f"~{plan.est_memory_gib_per_gpu:.1f} GiB per GPU (estimate"
    memory += f"; {plan.gpu_type} has {gpu_spec(plan.gpu_type).memory_gib:.0f} GiB)" if plan.gpu_type else ")"
    peak = (
        f"MFU against the {plan.gpu_type} {plan.peak_flops_kind} peak {plan.peak_flops_per_gpu / 1e12:.0f} TFLOP/s"
        if plan.peak_flops_per_gpu
        else "peak unknown"
    )
    step_flops = plan.model_flops_per_sample * plan.global_batch_size
    lora = cfg.peft if isinstance(cfg.peft, LoraConfig) else None
    # The MFU definition differs with LoRA: say which FLOPs the numbers count.
    counted = " (LoRA: frozen base without weight gradients, adapters in full)" if lora else ""
    fine_tuning = f"  LoRA r={lora.rank} on {','.join(map(str, lora.target_modules))}" if lora else ""
    rows = [
        ("model", f"{plan.model}  {plan.num_parameters / 1e9:.3g}B parameters  {plan.dtype}{fine_tuning}"),
        ("GPUs", f"{plan.num_gpus} ({where}, {gpu}), cluster={cluster.name}"),
        (
            "layout",
            layout(plan.tp, plan.pp, plan.cp, plan.vp, plan.dp) + (f"  [{', '.join(features)}]" if features else ""),
        ),
        (
            "batch",
            f"GBS {plan.global_batch_size} = MBS {plan.micro_batch_size} x DP {plan.dp} x "
            f"{plan.num_microbatches} microbatches, seq {plan.seq_length}",
        ),
        ("layers", f"per PP stage: {stages}{layer_note}"),
        ("memory", memory),
        ("FLOPs", f"{plan.model_flops_per_sample:.3g} per sample{counted}, {step_flops:.3g} per step; {peak}"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k:<{width}}  {v}" for k, v in rows)
