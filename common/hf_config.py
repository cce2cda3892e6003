"""Hugging Face `config.json` against `training.model`, and the `config.json` an export writes. Plain Python and
json only (no torch): the launcher's plan checks an `init_from_hf` directory with it on the host, and every
training rank checks it again before anything is built.

Also where a hub id's files are found in the Hugging Face cache without importing huggingface_hub."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any, Mapping

from common.config import ModelConfig

KEY = "training.checkpoint.init_from_hf"
# megatron-core's Llama 3.1 RoPE scaling fixes these (its `rope_scaling` argument only takes the factor).
MEGATRON_ROPE_FIXED = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class HFConfigError(ValueError):
    """A Hugging Face checkpoint that cannot start this model; str() is one line naming the keys and the fix."""


# --------------------------------------------------------------------------- where the files are
def is_hub_id(value: str) -> bool:
    """`org/name` that is not a path on this machine."""
    return not value.startswith(("/", "./", "../", "~")) and not os.path.exists(value) and bool(_HUB_ID.match(value))


def hub_cache_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """Where huggingface_hub keeps repositories ($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub)."""
    if environ.get("HF_HUB_CACHE"):
        return Path(environ["HF_HUB_CACHE"]).expanduser()
    home = environ.get("HF_HOME") or os.path.join(environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(home).expanduser() / "hub"


def cached_snapshot(repo_id: str, environ: Mapping[str, str] = os.environ) -> Path | None:
    """The cached snapshot of `repo_id`'s main revision, when it has a config.json; None otherwise."""
    repo = hub_cache_dir(environ) / f"models--{repo_id.replace('/', '--')}"
    try:
        revision = (repo / "refs" / "main").read_text().strip()
    except OSError:
        return None
    snapshot = repo / "snapshots" / revision
    return snapshot if (snapshot / "config.json").is_file() else None


def local_directory(value: str) -> Path | None:
    """The directory an init_from_hf value names on this machine: itself, or a hub id's cached snapshot."""
    if is_hub_id(value):
        return cached_snapshot(value)
    path = Path(value).expanduser()
    return path if path.is_dir() else None


def read_config(directory: str | os.PathLike) -> dict[str, Any]:
    path = Path(directory) / "config.json"
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise HFConfigError(
            f"{KEY}={directory} has no config.json: point it at a Hugging Face model directory "
            "(config.json + *.safetensors)"
        ) from None
    except json.JSONDecodeError as err:
        raise HFConfigError(f"{KEY}: {path} is not valid JSON ({err}); download it again") from None


# --------------------------------------------------------------------------- config.json <-> training.model
def rope_settings(config: Mapping[str, Any]) -> tuple[float | None, dict[str, Any] | None]:
    """(rope_theta, rope scaling dict or None) from either config.json style: `rope_theta` + `rope_scaling`
    (transformers 4, Meta's files) or `rope_parameters` (transformers 5)."""
    params = config.get("rope_parameters")
    if isinstance(params, Mapping):
        theta = params.get("rope_theta", config.get("rope_theta"))
        kind = params.get("rope_type", params.get("type", "default"))
        return theta, (dict(params) if kind not in (None, "default") else None)
    scaling = config.get("rope_scaling")
    if isinstance(scaling, Mapping) and scaling.get("rope_type", scaling.get("type")) in (None, "default"):
        scaling = None
    return config.get("rope_theta"), (dict(scaling) if scaling else None)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=0.0)
    return a == b


def differences(config: Mapping[str, Any], model: ModelConfig) -> list[str]:
    """Each way `config` (a config.json) differs from `model` (training.model), as `hf_key=value vs
    training.model.key=value`; empty when the checkpoint fits the configured model."""
    diffs: list[str] = []
    heads = config.get("num_attention_heads")
    hidden = config.get("hidden_size")
    default_head_dim = hidden // heads if isinstance(hidden, int) and isinstance(heads, int) and heads else None
    theta, scaling = rope_settings(config)
    # (config.json's key, its value, training.model's key, its value)
    pairs = [
        ("num_hidden_layers", config.get("num_hidden_layers"), "num_layers", model.num_layers),
        ("hidden_size", hidden, "hidden_size", model.hidden_size),
        ("intermediate_size", config.get("intermediate_size"), "ffn_hidden_size", model.ffn_hidden_size),
        ("num_attention_heads", heads, "num_attention_heads", model.num_attention_heads),
        ("num_key_value_heads", config.get("num_key_value_heads", heads), "num_query_groups", model.num_query_groups),
        ("head_dim", config.get("head_dim") or default_head_dim, "kv_channels", model.kv_channels),
        ("vocab_size", config.get("vocab_size"), "vocab_size", model.vocab_size),
        ("rms_norm_eps", config.get("rms_norm_eps"), "norm_epsilon", model.norm_epsilon),
        ("rope_theta", theta, "rotary_base", model.rotary_base),
    ]
    for hf_key, value, key, ours in pairs:
        if not _same(value, ours):
            diffs.append(f"{hf_key}={value} vs training.model.{key}={ours}")

    if scaling is None:
        if model.rope_scaling:
            diffs.append("rope_scaling=null vs training.model.rope_scaling=true")
    elif scaling.get("rope_type", scaling.get("type")) != "llama3":
        diffs.append(
            f"rope_scaling.rope_type={scaling.get('rope_type', scaling.get('type'))} (only llama3 is supported)"
        )
    elif not model.rope_scaling:
        diffs.append("rope_scaling.rope_type=llama3 vs training.model.rope_scaling=false")
    else:
        if not _same(scaling.get("factor"), model.rope_scaling_factor):
            diffs.append(
                f"rope_scaling.factor={scaling.get('factor')} vs training.model.rope_scaling_factor="
                f"{model.rope_scaling_factor}"
            )
        for key, fixed in MEGATRON_ROPE_FIXED.items():
            if key in scaling and not _same(scaling[key], fixed):
                diffs.append(f"rope_scaling.{key}={scaling[key]} (megatron-core fixes {fixed})")

    for key, expected in (("tie_word_embeddings", False), ("attention_bias", False), ("mlp_bias", False)):
        if bool(config.get(key, False)) != expected:
            diffs.append(f"{key}={config.get(key)} (Llama 3.1 has {str(expected).lower()})")
    act = config.get("hidden_act", "silu")
    if act != "silu":
        diffs.append(f"hidden_act={act} (Llama 3.1 uses silu)")
    return diffs


def check(config: Mapping[str, Any], model: ModelConfig, source: str) -> None:
    """Raise HFConfigError (one line naming the differing keys) unless `config` fits training.model."""
    architectures = config.get("architectures") or []
    if config.get("model_type") not in (None, "llama") or (architectures and "LlamaForCausalLM" not in architectures):
        raise HFConfigError(
            f"{KEY}={source} is not a Llama checkpoint (model_type={config.get('model_type')}, "
            f"architectures={architectures}); use a LlamaForCausalLM model"
        )
    diffs = differences(config, model)
    if diffs:
        raise HFConfigError(
            f"{KEY}={source}: config.json does not match training.model: {'; '.join(diffs)}; "
            "pick the training=llama31/<size> of that checkpoint or set the training.model keys"
        )


def check_directory(directory: str | os.PathLike, model: ModelConfig, source: str | None = None) -> None:
    check(read_config(directory), model, source or str(directory))


# --------------------------------------------------------------------------- the tensors of LlamaForCausalLM
def hf_layer_name(layer: int, suffix: str) -> str:
    return f"model.layers.{layer}.{suffix}"


def hf_shapes(model: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every LlamaForCausalLM tensor with its shape, in the order an export writes them."""
    h, ffn = model.hidden_size, model.ffn_hidden_size
    q, kv = model.num_attention_heads * model.kv_channels, model.num_query_groups * model.kv_channels
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (model.vocab_size, h)}
    for layer in range(model.num_layers):
        for suffix, shape in (
            ("input_layernorm.weight", (h,)),
            ("self_attn.q_proj.weight", (q, h)),
            ("self_attn.k_proj.weight", (kv, h)),
            ("self_attn.v_proj.weight", (kv, h)),
            ("self_attn.o_proj.weight", (h, q)),
            ("post_attention_layernorm.weight", (h,)),
            ("mlp.gate_proj.weight", (ffn, h)),
            ("mlp.up_proj.weight", (ffn, h)),
            ("mlp.down_proj.weight", (h, ffn)),
        ):
            shapes[hf_layer_name(layer, suffix)] = shape
    shapes["model.norm.weight"] = (h,)
    shapes["lm_head.weight"] = (model.vocab_size, h)
    return shapes


# --------------------------------------------------------------------------- what an export writes
def llama_config(
    model: ModelConfig, *, torch_dtype: str, bos_token_id: int | None, eos_token_id: int | list[int] | None
) -> dict[str, Any]:
    """`config.json` of LlamaForCausalLM for training.model, in the layout of Meta's Llama 3.1 releases (which
    transformers, vLLM and lm-eval read)."""
    scaling = None
    if model.rope_scaling:
        scaling = {"factor": float(model.rope_scaling_factor), **MEGATRON_ROPE_FIXED, "rope_type": "llama3"}
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
        "head_dim": model.kv_channels,
        "hidden_act": "silu",
        "hidden_size": model.hidden_size,
        "initializer_range": float(model.init_method_std),
        "intermediate_size": model.ffn_hidden_size,
        "max_position_embeddings": model.max_position_embeddings,
        "mlp_bias": False,
        "num_attention_heads": model.num_attention_heads,
        "num_hidden_layers": model.num_layers,
        "num_key_value_heads": model.num_query_groups,
        "pretraining_tp": 1,
        "rms_norm_eps": float(model.norm_epsilon),
        "rope_scaling": scaling,
        "rope_theta": float(model.rotary_base),
        "tie_word_embeddings": False,
        "torch_dtype": torch_dtype,
        "use_cache": True,
        "vocab_size": model.vocab_size,
    }
    return {k: v for k, v in config.items() if v is not None or k == "rope_scaling"}
