"""Hugging Face `config.json` against `training.model` (the model spec), the spec read from it
(training.model.from_hf), and the `config.json` an export writes. Plain Python and json only (no torch): the
launcher's plan checks an `init_from_hf` directory with it on the host, and every training rank checks it again
before anything is built.

Also where a hub id's files are found in the Hugging Face cache without importing huggingface_hub."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
import json
import math
import os
import re
from pathlib import Path
from typing import Any, Mapping

from common.config import Activation, ModelConfig, Normalization, RopeScaling, RopeScalingType
from common.typed import TypedConfigError, from_plain, to_plain

KEY = "training.checkpoint.init_from_hf"
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
# The architecture keys of training.model that a config.json gives, with the config.json key each comes from.
HF_KEYS = {
    "num_layers": "num_hidden_layers",
    "hidden_size": "hidden_size",
    "ffn_hidden_size": "intermediate_size",
    "num_attention_heads": "num_attention_heads",
    "num_query_groups": "num_key_value_heads",
    "kv_channels": "head_dim",
    "vocab_size": "vocab_size",
    "norm_epsilon": "rms_norm_eps",
    "activation": "hidden_act",
    "add_bias_linear": "attention_bias",
    "share_embeddings_and_output_weights": "tie_word_embeddings",
    "rotary_base": "rope_theta",
    "rope_scaling": "rope_scaling",
    "max_position_embeddings": "max_position_embeddings",
}
# Keys a checkpoint may declare differently from training.model without changing its weights: what an export
# declares, taken from config.json only with training.model.from_hf.
NOT_COMPARED = ("max_position_embeddings",)
# config.json's hidden_act of the gated MLP <-> training.model.activation.
HF_ACTIVATIONS = {"silu": Activation.swiglu, "gelu": Activation.geglu}
_HF_ACTIVATION_OF = {activation: act for act, activation in HF_ACTIVATIONS.items()}
# transformers' LlamaConfig defaults, for the keys a config.json may leave out (Llama 2's have no rope_theta).
LLAMA_DEFAULTS: dict[str, Any] = {
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
}


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


@dataclass
class Architecture:
    """What a config.json says of training.model's architecture keys: `values` by training.model key, `given`
    the config.json text each came from (for messages), and `problems`, one line for each thing it holds that no
    training.model has (another RoPE scaling, activation, or biases on attention but not on the MLP)."""

    values: dict[str, Any]
    given: dict[str, str]
    problems: list[str]


def architecture(config: Mapping[str, Any]) -> Architecture:
    """training.model's architecture keys as config.json sets them; transformers' defaults where it leaves one out."""
    found = Architecture({}, {}, [])

    def take(key: str, value: Any, given: Any = None) -> None:
        found.values[key] = value
        found.given[key] = f"{HF_KEYS[key]}={_text(value if given is None else given)}"

    for key in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "vocab_size"):
        take(key, config.get(HF_KEYS[key]))
    heads, hidden = config.get("num_attention_heads"), config.get("hidden_size")
    take("num_query_groups", config.get("num_key_value_heads") or heads)
    default_head_dim = hidden // heads if isinstance(hidden, int) and isinstance(heads, int) and heads else None
    take("kv_channels", config.get("head_dim") or default_head_dim)
    for key in ("norm_epsilon", "max_position_embeddings"):
        take(key, config.get(HF_KEYS[key], LLAMA_DEFAULTS[HF_KEYS[key]]))
    act = config.get("hidden_act", LLAMA_DEFAULTS["hidden_act"])
    take("activation", HF_ACTIVATIONS.get(act, act), given=act)
    if act not in HF_ACTIVATIONS:
        found.problems.append(f"hidden_act={act} (training.model.activation takes {', '.join(HF_ACTIVATIONS)})")
    attention_bias, mlp_bias = bool(config.get("attention_bias", False)), bool(config.get("mlp_bias", False))
    take("add_bias_linear", attention_bias)
    if attention_bias != mlp_bias:
        found.problems.append(
            f"attention_bias={_text(attention_bias)} with mlp_bias={_text(mlp_bias)} (training.model.add_bias_linear "
            "gives every linear layer a bias or none)"
        )
    take("share_embeddings_and_output_weights", bool(config.get("tie_word_embeddings", False)))
    theta, scaling = rope_settings(config)
    theta = LLAMA_DEFAULTS["rope_theta"] if theta is None else theta
    # config.json writes it as a float; training.model.rotary_base is megatron-core's integer.
    take("rotary_base", int(theta) if isinstance(theta, float) and theta.is_integer() else theta, given=theta)
    kind = scaling.get("rope_type", scaling.get("type")) if scaling else None
    if scaling is not None and kind != RopeScalingType.llama3:
        found.problems.append(f"rope_scaling.rope_type={kind} (only llama3 is supported)")
        scaling = None
    take("rope_scaling", _rope_scaling(scaling))
    return found


def _rope_scaling(scaling: Mapping[str, Any] | None) -> RopeScaling | None:
    if scaling is None:
        return None
    keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    values: dict[str, Any] = {key: scaling.get(key) for key in keys}  # a missing one shows as a difference
    return RopeScaling(type=RopeScalingType.llama3, **values)


def _text(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, RopeScaling):
        return f"{value.type} (factor {value.factor})"
    return str(value)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=0.0)
    return a == b


def differences(config: Mapping[str, Any], model: ModelConfig) -> list[str]:
    """Each way `config` (a config.json) differs from `model` (training.model), as `hf_key=value vs
    training.model.key=value`, and what it holds that no training.model has; empty when the checkpoint fits."""
    found = architecture(config)
    diffs = found.problems + not_llama_problems(model)
    for key, theirs in found.values.items():
        ours = getattr(model, key)
        if key in NOT_COMPARED:
            continue
        if isinstance(theirs, RopeScaling) and isinstance(ours, RopeScaling):  # the values that differ, by name
            diffs += [
                f"rope_scaling.{f.name}={_text(getattr(theirs, f.name))} vs training.model.rope_scaling.{f.name}="
                f"{_text(getattr(ours, f.name))}"
                for f in dataclasses.fields(RopeScaling)
                if not _same(getattr(theirs, f.name), getattr(ours, f.name))
            ]
        elif not _same(theirs, ours):
            diffs.append(f"{found.given[key]} vs training.model.{key}={_text(ours)}")
    return diffs


def not_llama_problems(model: ModelConfig) -> list[str]:
    """What of training.model a LlamaForCausalLM cannot hold."""
    if model.normalization != Normalization.rmsnorm:
        return [f"training.model.normalization={model.normalization} (LlamaForCausalLM has rmsnorm only)"]
    return []


def check_exportable(model: ModelConfig) -> None:
    """Raise HFConfigError (one line) when training.model has no LlamaForCausalLM form."""
    problems = not_llama_problems(model)
    if problems:
        raise HFConfigError(f"no Hugging Face LlamaForCausalLM holds this model: {'; '.join(problems)}")


def _check_llama(config: Mapping[str, Any], source: str) -> None:
    architectures = config.get("architectures") or []
    if config.get("model_type") not in (None, "llama") or (architectures and "LlamaForCausalLM" not in architectures):
        raise HFConfigError(
            f"{KEY}={source} is not a Llama checkpoint (model_type={config.get('model_type')}, "
            f"architectures={architectures}); use a LlamaForCausalLM model"
        )


def check(config: Mapping[str, Any], model: ModelConfig, source: str) -> None:
    """Raise HFConfigError (one line naming the differing keys) unless `config` fits training.model."""
    _check_llama(config, source)
    diffs = differences(config, model)
    if diffs:
        raise HFConfigError(
            f"{KEY}={source}: config.json does not match training.model: {'; '.join(diffs)}; pick the "
            "training=<family>/<size> of that checkpoint, set the training.model keys, or take them from it with "
            "training.model.from_hf=true"
        )


def check_directory(directory: str | os.PathLike, model: ModelConfig, source: str | None = None) -> None:
    check(read_config(directory), model, source or str(directory))


def model_from_config(config: Mapping[str, Any], model: ModelConfig, source: str) -> ModelConfig:
    """training.model with its architecture keys from `config` (training.model.from_hf); HFConfigError (one line)
    for a checkpoint no training.model can hold."""
    _check_llama(config, source)
    found = architecture(config)
    problems = found.problems + [
        f"no {found.given[key].partition('=')[0]}"
        for key, value in found.values.items()
        if value is None and key != "rope_scaling"
    ]
    try:
        if not problems:  # through the schema's types, as config.yaml is read
            plain = to_plain(dataclasses.replace(model, **found.values))
            return from_plain(ModelConfig, plain, path="training.model")
    except TypedConfigError as err:
        problems.append(str(err))
    raise HFConfigError(
        f"{KEY}={source}: training.model.from_hf=true cannot take the architecture from its config.json: "
        f"{'; '.join(problems)}"
    )


# --------------------------------------------------------------------------- the tensors of LlamaForCausalLM
def hf_layer_name(layer: int, suffix: str) -> str:
    return f"model.layers.{layer}.{suffix}"


def hf_shapes(model: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every LlamaForCausalLM tensor with its shape, in the order an export writes them: biases with
    add_bias_linear, no lm_head with tied embeddings (transformers saves the shared weight once, as the embedding)."""
    h, ffn = model.hidden_size, model.ffn_hidden_size
    q, kv = model.num_attention_heads * model.kv_channels, model.num_query_groups * model.kv_channels
    linear = (
        ("self_attn.q_proj", (q, h)),
        ("self_attn.k_proj", (kv, h)),
        ("self_attn.v_proj", (kv, h)),
        ("self_attn.o_proj", (h, q)),
        ("mlp.gate_proj", (ffn, h)),
        ("mlp.up_proj", (ffn, h)),
        ("mlp.down_proj", (h, ffn)),
    )
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (model.vocab_size, h)}
    for layer in range(model.num_layers):
        shapes[hf_layer_name(layer, "input_layernorm.weight")] = (h,)
        for name, shape in linear:
            if name == "mlp.gate_proj":  # a layer's order: its input norm, attention, the MLP's norm, the MLP
                shapes[hf_layer_name(layer, "post_attention_layernorm.weight")] = (h,)
            shapes[hf_layer_name(layer, f"{name}.weight")] = shape
            if model.add_bias_linear:
                shapes[hf_layer_name(layer, f"{name}.bias")] = shape[:1]
    shapes["model.norm.weight"] = (h,)
    if not model.share_embeddings_and_output_weights:
        shapes["lm_head.weight"] = (model.vocab_size, h)
    return shapes


# --------------------------------------------------------------------------- what an export writes
def llama_config(
    model: ModelConfig, *, torch_dtype: str, bos_token_id: int | None, eos_token_id: int | list[int] | None
) -> dict[str, Any]:
    """`config.json` of LlamaForCausalLM for training.model, in the layout of Meta's Llama 3.1 and 3.2 releases
    (which transformers, vLLM and lm-eval read)."""
    check_exportable(model)
    rope = model.rope_scaling
    scaling = None
    if rope is not None:
        scaling = {
            "factor": float(rope.factor),
            "low_freq_factor": float(rope.low_freq_factor),
            "high_freq_factor": float(rope.high_freq_factor),
            "original_max_position_embeddings": rope.original_max_position_embeddings,
            "rope_type": str(rope.type),
        }
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "attention_bias": model.add_bias_linear,
        "attention_dropout": 0.0,
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
        "head_dim": model.kv_channels,
        "hidden_act": _HF_ACTIVATION_OF[model.activation],
        "hidden_size": model.hidden_size,
        "initializer_range": float(model.init_method_std),
        "intermediate_size": model.ffn_hidden_size,
        "max_position_embeddings": model.max_position_embeddings,
        "mlp_bias": model.add_bias_linear,
        "num_attention_heads": model.num_attention_heads,
        "num_hidden_layers": model.num_layers,
        "num_key_value_heads": model.num_query_groups,
        "pretraining_tp": 1,
        "rms_norm_eps": float(model.norm_epsilon),
        "rope_scaling": scaling,
        "rope_theta": float(model.rotary_base),
        "tie_word_embeddings": model.share_embeddings_and_output_weights,
        "torch_dtype": torch_dtype,
        "use_cache": True,
        "vocab_size": model.vocab_size,
    }
    return {k: v for k, v in config.items() if v is not None or k == "rope_scaling"}
