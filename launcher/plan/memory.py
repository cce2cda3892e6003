"""The plan's estimate of the peak memory of the most loaded GPU."""

from __future__ import annotations

from common.config import LoraConfig, ModelConfig, PeftConfig, Recompute
from launcher.plan.formulas import lora_layer_parameters, stage_parameters

GIB = 1024**3


def estimate_memory_gib(
    model: ModelConfig,
    *,
    tp: int,
    pp: int,
    cp: int,
    dp: int,
    vp: int | None,
    stage_layers: list[int],
    padded_vocab: int,
    seq_length: int,
    micro_batch_size: int,
    distributed_optimizer: bool,
    grad_fp32: bool,
    fp8_params: bool,
    recompute: Recompute | None,
    peft: PeftConfig | None = None,
) -> float:
    """Peak memory of the most loaded GPU, roughly: weights, gradient buffer and optimizer shard, plus the larger
    of two transient peaks, and a fixed allowance for the CUDA context and workspaces:
    - forward/backward: activations of the microbatches in flight and the logits;
    - the optimizer step: megatron's distributed optimizer copies this rank's shard of the bf16 gradient buffer
      into fp32 `.grad` tensors of the main parameters (`_copy_model_grads_to_main_grads`: `.float()`), which
      live until the next step's `zero_grad`. With few data-parallel shards (a DP1 proxy) this is the peak.
    With LoRA the frozen base is its weights only (no gradient buffer, no fp32 main weights, no Adam state) and the
    adapters count as trained weights; activations are counted as for full training."""
    h, ffn = model.hidden_size, model.ffn_hidden_size
    groups, heads = model.num_query_groups, model.num_attention_heads
    worst = 0.0
    for stage, n_layers in enumerate(stage_layers):
        first, last = stage == 0, stage == pp - 1
        # This stage's layers, the input and output embeddings where they live, split over TP.
        params = stage_parameters(model, n_layers, first, last, padded_vocab) / tp
        adapters = n_layers * lora_layer_parameters(model, peft, tp) if isinstance(peft, LoraConfig) else 0.0
        trained = adapters if isinstance(peft, LoraConfig) else params
        weight_bytes = params * (1 if fp8_params else 2) + adapters * 2
        grad_bytes = trained * (4 if grad_fp32 else 2)
        shards = dp * cp if distributed_optimizer else 1
        optim_bytes = trained * 12 / shards  # fp32 master weights + Adam m and v
        # fp32 copy of the gradient shard during the step (`.float()` of an fp32 buffer copies nothing).
        step_grad_bytes = 0.0 if grad_fp32 else trained * 4 / shards
        # Activations per decoder layer per microbatch (bf16): norm inputs, QKV, attention output,
        # fc1 input/output and SwiGLU output; the s^2 attention scores are never stored (flash/fused).
        tokens = seq_length * micro_batch_size / cp
        per_layer = 2 * tokens * (5 * h + 2 * h * groups / heads + 3 * ffn) / tp
        if recompute == Recompute.full:
            per_layer = 2 * tokens * h / tp
        in_flight: float = 1
        if pp > 1:  # 1F1B keeps pp - stage microbatches alive; interleaving adds a little more
            in_flight = pp - stage
            if vp:
                in_flight = in_flight + (pp - 1) / vp
        activation_bytes = per_layer * n_layers * in_flight
        logits_bytes = tokens * padded_vocab / tp * (2 + 4) if last else 0.0  # bf16 logits + fp32 softmax
        transient = max(activation_bytes + logits_bytes, step_grad_bytes)
        total = weight_bytes + grad_bytes + optim_bytes + transient + 3 * GIB
        worst = max(worst, total)
    return round(worst / GIB, 1)
