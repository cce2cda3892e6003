"""Where each Hugging Face `LlamaForCausalLM` tensor lives in megatron-core's Llama (Transformer Engine layer
spec). Both use the rotate-half RoPE layout, so q/k need no permutation; megatron packs q, k, v per KV group into
one `linear_qkv`, gate and up into one `linear_fc1`, and pads the vocabulary.

The table is in terms of megatron's *global* tensors as dist_checkpointing names them (`decoder.layers.<name>`
with the layer as a leading axis, `embedding.word_embeddings.weight`, ...): every parallel layout is a slicing
of those, so the import (recipes/hf/importer.py), the export (recipes/hf/checkpoint_to_hf.py) and the tests share it."""

from __future__ import annotations

from dataclasses import dataclass
import re
from typing import Any, Iterator, Mapping

import torch

# The tensors' names and shapes: common/hf_config.py, where the plan reads them on the host too.
from common.config import ModelConfig
from common.hf_config import hf_layer_name, hf_shapes, llama_config  # noqa: F401

EMBEDDING = "embedding.word_embeddings.weight"
OUTPUT = "output_layer.weight"
FINAL_NORM = "decoder.final_layernorm.weight"
LAYER_PREFIX = "decoder.layers."
# Per-layer megatron tensors (suffixes after decoder.layers.) and their Hugging Face sources.
QKV = "self_attention.linear_qkv.weight"
QKV_NORM = "self_attention.linear_qkv.layer_norm_weight"
PROJ = "self_attention.linear_proj.weight"
FC1 = "mlp.linear_fc1.weight"
FC1_NORM = "mlp.linear_fc1.layer_norm_weight"
FC2 = "mlp.linear_fc2.weight"
LAYER_TENSORS = (QKV_NORM, QKV, PROJ, FC1_NORM, FC1, FC2)
_HF_LAYER = {
    QKV_NORM: ("input_layernorm.weight",),
    QKV: ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
    PROJ: ("self_attn.o_proj.weight",),
    FC1_NORM: ("post_attention_layernorm.weight",),
    FC1: ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
    FC2: ("mlp.down_proj.weight",),
}
# add_bias_linear: each linear layer's bias, laid out as the rows of its weight.
BIASES = {name: name.removesuffix(".weight") + ".bias" for name in (QKV, PROJ, FC1, FC2)}
_HF_LAYER.update({BIASES[name]: tuple(s.removesuffix(".weight") + ".bias" for s in _HF_LAYER[name]) for name in BIASES})
_WEIGHT_OF = {bias: weight for weight, bias in BIASES.items()}
_NUMBERED_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")


@dataclass(frozen=True)
class Piece:
    """`rows` consecutive rows of a megatron tensor, taken from rows [start, start + rows) of the Hugging Face
    tensor `hf_name`; with `repeat`, row `start` repeated `rows` times: the vocabulary padding rows, copies of
    the last vocabulary row (what Megatron-LM's checkpoint converters do). An export drops repeated pieces."""

    hf_name: str
    start: int
    rows: int
    repeat: bool = False


def global_key(key: str) -> tuple[str, int | None]:
    """A dist_checkpointing key as (megatron tensor, layer): `decoder.layers.<name>` is stacked over layers (the
    layer comes from the leading axis), `decoder.layers.<i>.<name>` (non-homogeneous layout) names it."""
    numbered = _NUMBERED_LAYER.match(key)
    if numbered:
        return LAYER_PREFIX + numbered.group(2), int(numbered.group(1))
    return key, None


def layer_suffix(name: str) -> str | None:
    return name[len(LAYER_PREFIX) :] if name.startswith(LAYER_PREFIX) else None


def pieces(name: str, layer: int | None, model: ModelConfig, padded_vocab: int) -> list[Piece]:
    """The rows of megatron tensor `name` (of `layer`, for per-layer tensors) in order, as Hugging Face rows."""
    vocab, hidden = model.vocab_size, model.hidden_size
    if name in (EMBEDDING, OUTPUT):
        hf_name = "model.embed_tokens.weight" if name == EMBEDDING else "lm_head.weight"
        padding = [Piece(hf_name, vocab - 1, padded_vocab - vocab, repeat=True)] if padded_vocab > vocab else []
        return [Piece(hf_name, 0, vocab), *padding]
    if name == FINAL_NORM:
        return [Piece("model.norm.weight", 0, hidden)]
    suffix = layer_suffix(name)
    if suffix not in _HF_LAYER or layer is None:
        raise KeyError(f"{name} is not a Llama weight")
    sources = [hf_layer_name(layer, s) for s in _HF_LAYER[suffix]]
    suffix = _WEIGHT_OF.get(suffix, suffix)  # a bias has its weight's rows
    if suffix == QKV:
        heads, groups, d = model.num_attention_heads, model.num_query_groups, model.kv_channels
        per_group = heads // groups
        q, k, v = sources
        out = []
        for g in range(groups):  # [q heads of group g, k of g, v of g] for every KV group
            out += [Piece(q, g * per_group * d, per_group * d), Piece(k, g * d, d), Piece(v, g * d, d)]
        return out
    if suffix == FC1:
        ffn = model.ffn_hidden_size
        return [Piece(sources[0], 0, ffn), Piece(sources[1], 0, ffn)]
    return [Piece(sources[0], 0, hidden)]  # norms, linear_proj and linear_fc2 have `hidden` rows


def global_names(model: ModelConfig) -> Iterator[tuple[str, int | None]]:
    """Every megatron tensor of the model as (name, layer), in Hugging Face order (embedding, layers, norm, head).
    Tied embeddings have no output layer of their own: megatron checkpoints the last stage's copy under the
    embedding's name, and transformers saves no lm_head."""
    yield EMBEDDING, None
    for layer in range(model.num_layers):
        for suffix in LAYER_TENSORS:
            yield LAYER_PREFIX + suffix, layer
            if model.add_bias_linear and suffix in BIASES:
                yield LAYER_PREFIX + BIASES[suffix], layer
    yield FINAL_NORM, None
    if not model.share_embeddings_and_output_weights:
        yield OUTPUT, None


def split_to_hf(name: str, layer: int | None, tensor: torch.Tensor, model: ModelConfig) -> dict[str, torch.Tensor]:
    """One whole megatron tensor (one layer of it) -> the Hugging Face tensors it holds; padding rows dropped."""
    by_name: dict[str, list[torch.Tensor]] = {}
    row = 0
    for piece in pieces(name, layer, model, tensor.shape[0]):
        if not piece.repeat:
            by_name.setdefault(piece.hf_name, []).append(tensor[row : row + piece.rows])
        row += piece.rows
    if row != tensor.shape[0]:
        raise ValueError(f"{name}: {tensor.shape[0]} rows in the checkpoint, {row} expected from training.model")
    return {hf: parts[0] if len(parts) == 1 else torch.cat(parts) for hf, parts in by_name.items()}


def join_from_hf(
    name: str, layer: int | None, hf: Mapping[str, torch.Tensor], model: ModelConfig, padded_vocab: int
) -> torch.Tensor:
    """The whole megatron tensor (one layer of it) from in-memory Hugging Face tensors."""
    parts = []
    for piece in pieces(name, layer, model, padded_vocab):
        rows = hf[piece.hf_name][piece.start : piece.start + (1 if piece.repeat else piece.rows)]
        parts.append(rows.expand(piece.rows, *rows.shape[1:]) if piece.repeat else rows)
    return torch.cat(parts)


# --------------------------------------------------------------------------- whole unsharded state dicts
def _state_key(name: str, layer: int | None) -> str:
    suffix = layer_suffix(name)
    return name if layer is None else f"{LAYER_PREFIX}{layer}.{suffix}"


def megatron_to_hf(state: Mapping[str, torch.Tensor], model: ModelConfig) -> dict[str, torch.Tensor]:
    """An unsharded GPTModel state dict (TP1, PP1) -> LlamaForCausalLM state dict."""
    out: dict[str, torch.Tensor] = {}
    for name, layer in global_names(model):
        out.update(split_to_hf(name, layer, state[_state_key(name, layer)], model))
    return {k: v.contiguous() for k, v in out.items()}


def hf_to_megatron(
    state: Mapping[str, torch.Tensor], model: ModelConfig, padded_vocab_size: int
) -> dict[str, torch.Tensor]:
    """LlamaForCausalLM state dict -> unsharded GPTModel state dict (vocabulary padding: copies of the last row)."""
    return {
        _state_key(name, layer): join_from_hf(name, layer, state, model, padded_vocab_size).contiguous()
        for name, layer in global_names(model)
    }


def hf_config(model: ModelConfig) -> Any:
    """transformers.LlamaConfig of a training.model: the config.json an export writes, as transformers reads it."""
    from transformers import LlamaConfig  # only tests and references use it; the training image need not have it

    return LlamaConfig.from_dict(llama_config(model, torch_dtype="float32", bos_token_id=None, eos_token_id=None))
