"""The plan's estimate of the peak memory of the most loaded GPU."""

from __future__ import annotations

from common.config import LoraConfig, ModelConfig, PeftConfig, Recompute
from launcher.plan.formulas import lora_layer_parameters, lora_target_features, stage_parameters

GIB = 1024**3
# Bytes per logit (tokens x padded vocabulary / TP) that each loss kernel (plan.cross_entropy_fusion) holds at once on
# the last stage. megatron-core's native fused cross entropy (megatron/core/fusions/fused_cross_entropy.py): forward,
# the output layer's bf16 logits (2) and `calculate_logits_max`'s `.float()` copy (4), which the compiled functions
# turn in place into the softmax that `save_for_backward` keeps (4); backward, `calculate_gradients` is
# torch.compile'd, so its in-place edits of the saved fp32 softmax (subtract 1 at the target, scale by the loss
# gradient) are functionalised into a new fp32 tensor (4) before its bf16 cast (2) is returned: 4 + 4 + 2. Counting
# only the bf16 logits and one fp32 copy (6) left the two-GPU DP2 rows 5-14% under their measured peaks (70B 2-layer
# DP2 MBS 2: 58.1 against 67.6 GiB); with 10 they are within 2.6%. Transformer Engine's loss keeps 6 bytes a logit
# less: the full 8B DP2 and TP2 rows peaked 5.9 and 3.0 GiB lower with it, the 8B proxy on one H200 5.9 GiB (90.2
# against 96.1 bf16, 93.2 against 99.1 fp8). The unfused loss is not measured; it is counted as the native one.
LOGIT_BYTES = {"native": 10, "te": 4, "none": 10}
# Bytes per weight of a Transformer Engine linear layer that FP8 training keeps beside bf16 weights (no FP8 param
# gather): the FP8 copy for the forward GEMM and its transpose for the backward's (Hopper's FP8 GEMMs take no
# transposed operand), cast at a step's first microbatch and cached for the rest (is_first_microbatch). Without
# them the two-GPU fp8 DP2 rows were 9-10% under their peaks.
FP8_WEIGHT_CACHE_BYTES = 2
# FP8 weights (FP8 param gather) are their own forward operand but get a transpose for the backward (megatron-core's
# post_all_gather_processing): 1 byte per weight of those layers. The full 8B at DP4 on 4 H200 (FP8 param gather on)
# peaked at 90.8 GiB: 84.2 estimated without the transpose (-7.3%), 90.7 with it; the earlier code's 8B DP2 row is
# +3.0% with it.
FP8_WEIGHT_TRANSPOSE_BYTES = 1


def microbatches_in_flight(pp: int, stage: int, vp: int | None, num_microbatches: int) -> float:
    """How many microbatches' worth of a stage's activations are alive at its peak in megatron-core's 1F1B schedules
    (pipeline_parallel/schedules.py, get_pp_rank_microbatches): the warmup forwards plus the one the first 1F1B step
    adds, counted in model chunks of 1/vp of the stage and never more than every chunk of every microbatch. With
    interleaving every stage holds about pp microbatches' worth, the last one too: the 70B proxy's PP2 VP5 x DP2 on 4
    H200 (GBS 8) peaked at 89.2 GiB, where pp - stage for the last stage had estimated 82.6."""
    if pp == 1:
        return 1.0
    chunks = vp or 1
    warmup = pp - stage - 1 if chunks == 1 else (pp - stage - 1) * 2 + (chunks - 1) * pp
    return min(warmup + 1, num_microbatches * chunks) / chunks


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
    num_microbatches: int,  # no default: with pp > 1 it bounds the activations in flight
    peft: PeftConfig | None = None,
    fp8: bool = False,
    sequence_parallel: bool = False,
    defer_embedding_wgrad: bool = False,
    wgrad_deferral_limit: int = 0,
    fp32: bool = False,
    cross_entropy_fusion: str = "native",
) -> float:
    """Peak memory of the most loaded GPU, roughly: weights, gradient buffer and optimizer shard, plus the larger
    of two transient peaks, and a fixed allowance for the CUDA context and workspaces:
    - forward/backward: activations of the microbatches in flight, the loss's logits and, with
      defer_embedding_wgrad_compute, the output layer's deferred weight-gradient operands;
    - the optimizer step: megatron's distributed optimizer copies this rank's shard of the bf16 gradient buffer
      into fp32 `.grad` tensors of the main parameters (`_copy_model_grads_to_main_grads`: `.float()`), which
      live until the next step's `zero_grad`. With few data-parallel shards (a DP1 proxy) this is the peak.
    With LoRA the frozen base is its weights only (no gradient buffer, no fp32 main weights, no Adam state) and the
    adapters count as trained weights; activations are counted as for full training.
    fp32 (dtype.bf16=false): weights, activations and gradients of 4 bytes, and no main-weight copy in the optimizer
    (megatron-core's distributed optimizer steps fp32 weights through views of them): Adam's m and v alone."""
    h, ffn = model.hidden_size, model.ffn_hidden_size
    groups, heads = model.num_query_groups, model.num_attention_heads
    linear_weights = sum(n_in * n_out for n_in, n_out in lora_target_features(model).values())  # QKV, proj, fc1, fc2
    element = 4 if fp32 else 2  # bytes of a weight, an activation or a gradient outside FP8
    grads_fp32 = grad_fp32 or fp32
    worst = 0.0
    for stage, n_layers in enumerate(stage_layers):
        first, last = stage == 0, stage == pp - 1
        # This stage's layers, the input and output embeddings where they live, split over TP.
        params = stage_parameters(model, n_layers, first, last, padded_vocab) / tp
        adapters = n_layers * lora_layer_parameters(model, peft, tp) if isinstance(peft, LoraConfig) else 0.0
        trained = adapters if isinstance(peft, LoraConfig) else params
        weight_bytes = params * (1 if fp8_params else element) + adapters * element
        if fp8 or fp8_params:
            cache = FP8_WEIGHT_TRANSPOSE_BYTES if fp8_params else FP8_WEIGHT_CACHE_BYTES
            weight_bytes += n_layers * linear_weights / tp * cache
        grad_bytes = trained * (4 if grads_fp32 else 2)
        shards = dp * cp if distributed_optimizer else 1
        optim_bytes = trained * (8 if fp32 else 12) / shards  # fp32 master weights (bf16 only) + Adam m and v
        # fp32 copy of the gradient shard during the step (`.float()` of an fp32 buffer copies nothing).
        step_grad_bytes = 0.0 if grads_fp32 else trained * 4 / shards
        # Activations per decoder layer per microbatch (`element` bytes each): norm inputs, QKV, attention output,
        # fc1 input/output and SwiGLU output; the s^2 attention scores are never stored (flash/fused).
        tokens = seq_length * micro_batch_size / cp
        per_layer = element * tokens * (5 * h + 2 * h * groups / heads + 3 * ffn) / tp
        if fp8:
            # Transformer Engine keeps the inputs of the GEMMs it runs in FP8 for their weight gradient as FP8 (1
            # byte, not 2): the attention output (proj), fc1's input and the SwiGLU output (fc2).
            per_layer -= tokens * (2 * h + ffn) / tp
        if recompute == Recompute.full:
            per_layer = element * tokens * h / tp
        activation_bytes = per_layer * n_layers * microbatches_in_flight(pp, stage, vp, num_microbatches)
        logits_bytes = tokens * padded_vocab / tp * LOGIT_BYTES[cross_entropy_fusion] if last else 0.0
        # defer_embedding_wgrad_compute: the output layer keeps each microbatch's input (the final norm's output,
        # sequence-parallel shard) and bf16 output gradient, up to wgrad_deferral_limit of them (0: all), for the
        # weight-gradient GEMMs the schedule drains after the last backward (megatron/core/tensor_parallel/
        # layers.py: embedding_activation_buffer, grad_output_buffer). All of them are counted beside the loss's
        # logits: at the last microbatch's loss backward the buffer holds one gradient fewer, but the measured PP2
        # peaks of the 70B proxy (60.5 and 62.6 GiB) lie 2.6 and 3.8 GiB above that count and within 3% of this one.
        deferred_bytes = 0.0
        if last and pp > 1 and defer_embedding_wgrad:
            kept = num_microbatches if wgrad_deferral_limit == 0 else min(num_microbatches, wgrad_deferral_limit)
            kept_input = tokens * h / (tp if sequence_parallel else 1)
            deferred_bytes = kept * element * (kept_input + tokens * padded_vocab / tp)
        transient = max(activation_bytes + logits_bytes + deferred_bytes, step_grad_bytes)
        total = weight_bytes + grad_bytes + optim_bytes + transient + 3 * GIB
        worst = max(worst, total)
    return round(worst / GIB, 1)
