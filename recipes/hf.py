"""Weights between megatron-core's Llama (Transformer Engine layer spec, unsharded) and Hugging Face
`LlamaForCausalLM`. Both use the rotate-half RoPE layout, so q/k need no permutation; megatron packs q, k, v
per KV group into one `linear_qkv` and gate/up into one `linear_fc1`, and pads the vocabulary.

Used to check the model against transformers (tests) and to import Llama 3.1 checkpoints in HF format."""
from __future__ import annotations

import inspect
from typing import Any, Mapping

import torch


def hf_config_kwargs(model: Mapping[str, Any], max_position_embeddings: int = 131072) -> dict[str, Any]:
    """LlamaConfig arguments for a training.model config (the Llama 3.1 RoPE scaling included)."""
    rope = {"rope_type": "llama3", "factor": float(model["rope_scaling_factor"]), "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192} if model["rope_scaling"] else None
    kwargs = dict(
        vocab_size=model["vocab_size"], hidden_size=model["hidden_size"],
        intermediate_size=model["ffn_hidden_size"], num_hidden_layers=model["num_layers"],
        num_attention_heads=model["num_attention_heads"], num_key_value_heads=model["num_query_groups"],
        head_dim=model["kv_channels"], max_position_embeddings=max_position_embeddings,
        rms_norm_eps=model["norm_epsilon"], tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
        hidden_act="silu")
    from transformers import LlamaConfig

    if "rope_parameters" in inspect.signature(LlamaConfig.__init__).parameters:  # transformers >= 5
        kwargs["rope_parameters"] = {**(rope or {"rope_type": "default"}), "rope_theta": float(model["rotary_base"])}
    else:
        kwargs["rope_theta"] = float(model["rotary_base"])
        kwargs["rope_scaling"] = rope
    return kwargs


def _qkv_split(qkv: torch.Tensor, heads: int, groups: int, head_dim: int):
    per_group = heads // groups
    hidden = qkv.shape[-1]
    grouped = qkv.view(groups, per_group + 2, head_dim, hidden)
    q = grouped[:, :per_group].reshape(heads * head_dim, hidden)
    k = grouped[:, per_group].reshape(groups * head_dim, hidden)
    v = grouped[:, per_group + 1].reshape(groups * head_dim, hidden)
    return q, k, v


def _qkv_join(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, groups: int, head_dim: int):
    per_group = heads // groups
    hidden = q.shape[-1]
    grouped = torch.cat([q.view(groups, per_group, head_dim, hidden), k.view(groups, 1, head_dim, hidden),
                         v.view(groups, 1, head_dim, hidden)], dim=1)
    return grouped.reshape((heads + 2 * groups) * head_dim, hidden)


def megatron_to_hf(state: Mapping[str, torch.Tensor], model: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """An unsharded GPTModel state dict (TP1, PP1) -> LlamaForCausalLM state dict."""
    heads, groups, d = model["num_attention_heads"], model["num_query_groups"], model["kv_channels"]
    vocab, ffn = model["vocab_size"], model["ffn_hidden_size"]
    out = {
        "model.embed_tokens.weight": state["embedding.word_embeddings.weight"][:vocab],
        "model.norm.weight": state["decoder.final_layernorm.weight"],
        "lm_head.weight": state["output_layer.weight"][:vocab],
    }
    for i in range(model["num_layers"]):
        src, dst = f"decoder.layers.{i}.", f"model.layers.{i}."
        q, k, v = _qkv_split(state[src + "self_attention.linear_qkv.weight"], heads, groups, d)
        fc1 = state[src + "mlp.linear_fc1.weight"]
        out.update({
            dst + "input_layernorm.weight": state[src + "self_attention.linear_qkv.layer_norm_weight"],
            dst + "self_attn.q_proj.weight": q,
            dst + "self_attn.k_proj.weight": k,
            dst + "self_attn.v_proj.weight": v,
            dst + "self_attn.o_proj.weight": state[src + "self_attention.linear_proj.weight"],
            dst + "post_attention_layernorm.weight": state[src + "mlp.linear_fc1.layer_norm_weight"],
            dst + "mlp.gate_proj.weight": fc1[:ffn],
            dst + "mlp.up_proj.weight": fc1[ffn:],
            dst + "mlp.down_proj.weight": state[src + "mlp.linear_fc2.weight"],
        })
    return {k: v.contiguous() for k, v in out.items()}


def hf_to_megatron(state: Mapping[str, torch.Tensor], model: Mapping[str, Any],
                   padded_vocab_size: int) -> dict[str, torch.Tensor]:
    """LlamaForCausalLM state dict -> unsharded GPTModel state dict (padding rows of the vocabulary are zero)."""
    heads, groups, d = model["num_attention_heads"], model["num_query_groups"], model["kv_channels"]

    def pad(weight: torch.Tensor) -> torch.Tensor:
        extra = padded_vocab_size - weight.shape[0]
        return torch.cat([weight, weight.new_zeros(extra, weight.shape[1])]) if extra > 0 else weight

    out = {
        "embedding.word_embeddings.weight": pad(state["model.embed_tokens.weight"]),
        "decoder.final_layernorm.weight": state["model.norm.weight"],
        "output_layer.weight": pad(state["lm_head.weight"]),
    }
    for i in range(model["num_layers"]):
        src, dst = f"model.layers.{i}.", f"decoder.layers.{i}."
        out.update({
            dst + "self_attention.linear_qkv.layer_norm_weight": state[src + "input_layernorm.weight"],
            dst + "self_attention.linear_qkv.weight": _qkv_join(
                state[src + "self_attn.q_proj.weight"], state[src + "self_attn.k_proj.weight"],
                state[src + "self_attn.v_proj.weight"], heads, groups, d),
            dst + "self_attention.linear_proj.weight": state[src + "self_attn.o_proj.weight"],
            dst + "mlp.linear_fc1.layer_norm_weight": state[src + "post_attention_layernorm.weight"],
            dst + "mlp.linear_fc1.weight": torch.cat([state[src + "mlp.gate_proj.weight"],
                                                      state[src + "mlp.up_proj.weight"]]),
            dst + "mlp.linear_fc2.weight": state[src + "mlp.down_proj.weight"],
        })
    return {k: v.contiguous() for k, v in out.items()}
