"""The plan's formulas: padded vocabulary, model FLOPs per sample, parameters (per layer, per pipeline stage, in
all; LoRA adapters' too), the pipeline split."""

from __future__ import annotations

import math
from common.config import LoraConfig, LoraTarget, ModelConfig, Normalization, PeftConfig


def padded_vocab_size(vocab_size: int, divisible_by: int, tp: int) -> int:
    """Megatron pads the vocabulary so every TP rank holds an equal, aligned slice."""
    multiple = divisible_by * tp
    return int(math.ceil(vocab_size / multiple) * multiple)


def model_flops_per_sample(model: ModelConfig, seq_length: int, peft: PeftConfig | None = None) -> float:
    """Training FLOPs (fwd + bwd) for one sequence, the formula the public recipes' MFU tables use:
    seq * (attention + mlp + embedding): 6 FLOPs per weight per token (forward, input gradient, weight gradient)
    and three times the forward of attention's score and value products, which have no weights.

    With LoRA these are the FLOPs the step needs: the frozen base computes no weight gradients, so its weights cost
    4 per token (forward and input gradient), the attention products still three times their forward, and the
    adapters 6 per parameter per token. (The first layer's linear_qkv also skips its input gradient, its input
    needing none; too small to count.)"""
    layers, h = model.num_layers, model.hidden_size
    heads, groups = model.num_attention_heads, model.num_query_groups
    attention = 12 * layers * h * h * (1 + groups / heads + seq_length / h)
    mlp = 18 * layers * model.ffn_hidden_size * h
    embedding = 6 * model.vocab_size * h
    full = float(seq_length * (attention + mlp + embedding))
    if not isinstance(peft, LoraConfig):
        return full
    # 2 FLOPs per weight per token of each of the three GEMMs above: the weights' share of attention, mlp, embedding.
    weight_gradients = 2 * (
        layers * (2 * h * h * (1 + groups / heads) + 3 * model.ffn_hidden_size * h) + model.vocab_size * h
    )
    adapters = 6 * layers * lora_layer_parameters(model, peft)
    return full + seq_length * (adapters - weight_gradients)


def norm_parameters(model: ModelConfig) -> int:
    """One norm's parameters: RMSNorm has a scale, LayerNorm a scale and a bias."""
    return model.hidden_size * (2 if model.normalization == Normalization.layernorm else 1)


def layer_parameters(model: ModelConfig) -> int:
    """Parameters of one decoder layer: attention, the gated MLP, two norms, and each linear layer's bias with
    add_bias_linear."""
    h, ffn = model.hidden_size, model.ffn_hidden_size
    q = model.num_attention_heads * model.kv_channels
    kv = 2 * model.num_query_groups * model.kv_channels
    weights = h * (q + kv) + q * h + 3 * h * ffn
    biases = (q + kv) + h + 2 * ffn + h if model.add_bias_linear else 0  # qkv, proj, fc1 (gate and up), fc2
    return weights + biases + 2 * norm_parameters(model)


def embedding_matrices(model: ModelConfig, first: bool, last: bool) -> int:
    """Vocabulary x hidden matrices on a pipeline stage: the input embedding on the first, the output layer on the
    last. Tied embeddings share one where both are on the same stage; megatron-core keeps a copy on the last stage
    otherwise (kept equal by reducing their gradients together)."""
    return int(first) + int(last) - int(model.share_embeddings_and_output_weights and first and last)


def stage_parameters(model: ModelConfig, layers: int, first: bool, last: bool, padded_vocab: int) -> int:
    """Parameters of one pipeline stage (all its TP ranks together)."""
    return layers * layer_parameters(model) + embedding_matrices(model, first, last) * padded_vocab * model.hidden_size


def num_parameters(model: ModelConfig) -> int:
    """The model's parameters as its Hugging Face form counts them: the vocabulary unpadded, tied embeddings once,
    the final norm."""
    embeddings = embedding_matrices(model, first=True, last=True) * model.vocab_size * model.hidden_size
    return model.num_layers * layer_parameters(model) + embeddings + norm_parameters(model)


def lora_target_features(model: ModelConfig) -> dict[LoraTarget, tuple[int, int]]:
    """(in, out) features of each linear layer LoRA can target, whole (before TP shards them)."""
    h, ffn = model.hidden_size, model.ffn_hidden_size
    q = model.num_attention_heads * model.kv_channels
    kv = 2 * model.num_query_groups * model.kv_channels
    return {
        LoraTarget.linear_qkv: (h, q + kv),
        LoraTarget.linear_proj: (q, h),
        LoraTarget.linear_fc1: (h, 2 * ffn),  # gate and up
        LoraTarget.linear_fc2: (ffn, h),
    }


def lora_smallest_dimensions(model: ModelConfig) -> dict[LoraTarget, int]:
    """The smallest dimension of each target's projections (k and v of linear_qkv; gate and up of linear_fc1): an
    adapter's B A has a rank of at most that."""
    features = lora_target_features(model)
    kv = model.num_query_groups * model.kv_channels
    return {
        LoraTarget.linear_qkv: min(model.hidden_size, kv),
        LoraTarget.linear_proj: min(features[LoraTarget.linear_proj]),
        LoraTarget.linear_fc1: min(model.hidden_size, model.ffn_hidden_size),
        LoraTarget.linear_fc2: min(features[LoraTarget.linear_fc2]),
    }


# Hugging Face projections in each target, each with an adapter of its own (as PEFT): q, k, v; o; gate, up; down.
LORA_PROJECTIONS = {
    LoraTarget.linear_qkv: 3,
    LoraTarget.linear_proj: 1,
    LoraTarget.linear_fc1: 2,
    LoraTarget.linear_fc2: 1,
}


def lora_layer_parameters(model: ModelConfig, lora: LoraConfig, tp: int = 1) -> float:
    """Adapter parameters of one decoder layer on one TP rank: a column-parallel target's adapter holds A [n r, in]
    (one r x in block per projection) whole and its rows of B [out, r], a row-parallel one its columns of A and B
    whole (recipes/peft/lora.py)."""
    features = lora_target_features(model)
    total = 0.0
    for target in lora.target_modules:
        inputs, outputs = features[target]
        n = LORA_PROJECTIONS[target]
        total += lora.rank * ((n * inputs + outputs / tp) if target.column_parallel else (inputs / tp + outputs))
    return total


def layers_per_pipeline_stage(num_layers: int, pp: int, asymmetric: bool) -> list[int]:
    """Decoder layers on each PP rank, in order. With the asymmetric split the embedding takes one layer's slot
    on the first stage and the loss one on the last. Assumes the split was validated."""
    if pp == 1:
        return [num_layers]
    if not asymmetric:
        return [num_layers // pp] * pp
    per_stage = (num_layers + 2) // pp
    return [per_stage - 1] + [per_stage] * (pp - 2) + [per_stage - 1]


def pipeline_split_problems(num_layers: int, pp: int, vp: int | None, asymmetric: bool) -> list[str]:
    chunks = vp or 1
    if asymmetric:
        if pp == 1:
            return ["parallelism.asymmetric_pipeline=true needs parallelism.pp > 1; set it to false"]
        slots = num_layers + 2
        if slots % pp:
            good = [p for p in range(2, 17) if slots % p == 0]
            return [
                f"asymmetric pipeline: training.model.num_layers + 2 = {slots} is not divisible by "
                f"parallelism.pp={pp}; use pp in {good}"
            ]
        per_stage = slots // pp
        if per_stage % chunks:
            good = [v for v in range(1, per_stage + 1) if per_stage % v == 0]
            return [
                f"asymmetric pipeline: (training.model.num_layers + 2) / parallelism.pp = {per_stage} layers "
                f"per stage do not split into parallelism.vp={vp} chunks; use vp in {good}"
            ]
        return []
    if num_layers % (pp * chunks):
        what = f"parallelism.pp={pp}" + (f" x parallelism.vp={vp}" if vp else "")
        return [
            f"training.model.num_layers={num_layers} does not split evenly over {what}; choose pp (x vp) "
            f"dividing {num_layers}, or set parallelism.asymmetric_pipeline=true"
        ]
    return []
