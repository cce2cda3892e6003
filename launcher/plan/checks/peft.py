"""peft: what LoRA needs of the rest of the config. Context parallelism is accepted: an adapter is a per-token
linear map like the layer it adapts, and the adapters' gradients are reduced over the data- and context-parallel
ranks with every other trained parameter's."""

from __future__ import annotations

import dataclasses

import yaml

from common.config import Config, DefaultLayout, LoraConfig, LoraInit, LoraTarget
from common.typed import from_plain
from launcher.config.compose import CONF_DIR
from launcher.plan.findings import Findings
from launcher.plan.formulas import lora_smallest_dimensions
from launcher.plan.sizes import Sizes


def check(cfg: Config, sizes: Sizes, found: Findings) -> None:
    if isinstance(cfg.peft, LoraConfig):
        for line in lora_problems(cfg, cfg.peft):
            found.problem(line)
        if cfg.peft.random_base and not _has_base(cfg):
            found.warning(
                "peft.random_base=true: the frozen base is random weights (a speed benchmark such as "
                "bench/bench_lora.py, not a fine-tuning run)"
            )
        preset = _lora_preset_of_the_model(cfg)
        if preset is not None:
            found.warning(
                f"peft=lora keeps the pretraining preset's layout and batch ({sizes.num_gpus} GPUs, GBS "
                f"{sizes.global_batch_size}), sized for full training: training={preset} is this model's LoRA "
                "preset (its layout on the fewest 8-GPU nodes that fit, batch, schedule and SFT data)"
            )


def _lora_preset_of_the_model(cfg: Config) -> str | None:
    """The fine-tuning option conf/training/finetune/ holds for a pretraining option's model (training.name
    NAME: finetune/NAME_lora), where the run takes the pretraining option's default layout and the preset lays the
    model out otherwise; None where no preset exists, the run names its own layout or the two layouts agree."""
    preset = f"finetune/{cfg.training.name}_lora"
    path = CONF_DIR / "training" / f"{preset}.yaml"
    if not path.is_file() or cfg.parallelism.name != cfg.training.default_layout.for_dtype(cfg.dtype):
        return None
    # The keys the option leaves out are null, as the schema makes them when the option is composed.
    unset = {f.name: None for f in dataclasses.fields(DefaultLayout)}
    option = {**unset, **yaml.safe_load(path.read_text())["training"]["default_layout"]}
    if from_plain(DefaultLayout, option, path=str(path)).for_dtype(cfg.dtype) == cfg.parallelism.name:
        return None
    return preset


def lora_problems(cfg: Config, lora: LoraConfig) -> list[str]:
    return [*_target_problems(cfg, lora), *_init_problems(lora), *_base_problems(cfg), *_mlp_problems(cfg, lora)]


def _target_problems(cfg: Config, lora: LoraConfig) -> list[str]:
    targets = [str(t) for t in lora.target_modules]
    if not targets:
        return [
            "peft.target_modules=[] adapts nothing: name one or more of linear_qkv, linear_proj, linear_fc1, linear_fc2"
        ]
    if len(set(targets)) < len(targets):
        return [f"peft.target_modules=[{','.join(targets)}] names a layer twice: name each once"]
    # The bound is the whole layer's, not a TP shard's: A and B are r x in and out x r of the whole layer (a shard
    # of A with fewer than r columns is fine), and a product B A has a rank of at most min(in, out), per projection
    # (linear_qkv's k and v have the fewest rows).
    dimensions = lora_smallest_dimensions(cfg.training.model)
    smallest, target = min((dimensions[t], str(t)) for t in lora.target_modules)
    if lora.rank > smallest:
        return [
            f"peft.rank={lora.rank} is larger than {target}'s smallest dimension ({smallest}), which bounds the rank "
            f"of an update B A: choose peft.rank <= {smallest}"
        ]
    return []


def _init_problems(lora: LoraConfig) -> list[str]:
    if lora.a_init == LoraInit.zero and lora.b_init == LoraInit.zero:
        # dA is B^T (...) and dB is (...) (A x)^T: both zero, forever.
        return [
            "peft.a_init=zero with peft.b_init=zero never trains (both get zero gradients): set a_init=kaiming_uniform"
        ]
    return []


def _has_base(cfg: Config) -> bool:
    ckpt = cfg.training.checkpoint
    return bool(ckpt.init_from or ckpt.init_from_hf)


def _base_problems(cfg: Config) -> list[str]:
    assert isinstance(cfg.peft, LoraConfig)
    if _has_base(cfg) or cfg.peft.random_base:
        return []
    return [
        "peft=lora trains adapters on a frozen base, and no base is given: set training.checkpoint.init_from_hf "
        "(Hugging Face weights) or training.checkpoint.init_from (a checkpoint of a run); peft.random_base=true for a "
        "speed benchmark on random weights"
    ]


def _mlp_problems(cfg: Config, lora: LoraConfig) -> list[str]:
    # Transformer Engine's fused MLP computes fc1 and fc2 from their weights without calling the layers, so the
    # hooks that add the adapters' outputs would never run: the adapters would silently do nothing.
    mlp = [str(t) for t in lora.target_modules if t in (LoraTarget.linear_fc1, LoraTarget.linear_fc2)]
    if cfg.dtype.te_op_fuser and mlp:
        return [
            f"peft.target_modules with {' and '.join(mlp)} needs dtype.te_op_fuser=false: the fused MLP does not run "
            "the layers the adapters attach to"
        ]
    return []
