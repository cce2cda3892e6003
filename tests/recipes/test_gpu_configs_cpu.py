"""Every config the GPU tests train passes the plan here, without a GPU: a value the plan refuses (a warmup longer
than a one-step run, FP8 attention on heads cuDNN cannot train) fails in seconds on CPU instead of after the
device's set-up. Data is mock where the GPU tests tokenize a corpus; the declared machine is two H200."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

import test_gpu_hf
import test_gpu_lora
import test_gpu_memory_estimate
import test_gpu_mlperf
import test_gpu_observability
import test_gpu_perf
import test_gpu_resilience
import test_gpu_training
from launcher.config.compose import compose
from launcher.plan.hardware import LocalGpus
from launcher.plan.validate import validate

TWO_H200 = LocalGpus(2, "h200", ("NVIDIA H200",) * 2)
MOCK_CORPUS = {"overrides": ["training.data.mock=true"]}


def tiny(*extra: str) -> list[str]:
    return test_gpu_training.tiny(MOCK_CORPUS, "/tmp/gpu-configs", "check", *extra)


@functools.cache
def lora_base() -> Path:
    """A Hugging Face base at the GPU test's shape (the corpus tokenizer's vocabulary): the plan reads its files."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from recipes.hf import mapping

    directory = Path("/tmp/gpu-configs/lora_base")
    if not (directory / "config.json").is_file():
        cfg = compose(["training=llama31/tiny", "training.model.vocab_size=8192"])
        config = transformers.LlamaConfig(**mapping.hf_config_kwargs(cfg.training.model))
        transformers.LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(directory)
    return directory


def lora(name: str, *extra: str):
    corpus = {"overrides": ["training.data.mock=true", "training.model.vocab_size=8192"]}
    return lambda: test_gpu_lora.lora_run(corpus, Path("/tmp/gpu-configs"), name, lora_base(), *extra)


CONFIGS = {
    "training: deterministic": tiny(*test_gpu_training.DETERMINISTIC),
    **{
        f"training: layout {name}": tiny("training.train_steps=40", "training.deterministic=true", *layout)
        for name, layout in test_gpu_training.LAYOUTS.items()
    },
    **{
        f"training: {name}": tiny("training.train_steps=40", *extra)
        for name, extra in test_gpu_training.FP8_AND_OVERLAP.items()
    },
    "perf: initial weights": tiny(*test_gpu_perf.INIT_RUN),
    **{
        f"perf: cuda graphs {mode}": tiny(*test_gpu_perf.GRAPH_RUN, f"training.cuda_graphs={mode}")
        for mode in ("per_layer", "full_iteration")
    },
    "perf: fp8 attention accuracy": tiny(
        *test_gpu_perf.ACCURACY_RUN, "dtype=fp8", "dtype.fp8_dot_product_attention=true"
    ),
    **{
        f"hf: layout {name}": [*test_gpu_hf.COMMON, "cluster=local", "training.data.mock=true", *layout]
        for name, layout in test_gpu_hf.LAYOUTS.items()
    },
    **{f"lora: {name}": lora(name, *layout) for name, layout in test_gpu_lora.LAYOUTS.items()},
    "lora: alpha doubled": lora(
        "alpha_doubled", *test_gpu_lora.LAYOUTS["tp1"], f"peft.alpha={2 * test_gpu_lora.ALPHA}"
    ),
    "lora: resumed on another base": lora("crashed", *test_gpu_lora.LAYOUTS["tp1"], "training.train_steps=110"),
    "lora: the full run of the same shape": lambda: tiny(
        *test_gpu_lora.FULL_RUN, "training.model.vocab_size=8192", f"training.checkpoint.init_from_hf={lora_base()}"
    ),
    "resilience": [*test_gpu_resilience.TINY],
    "mlperf": [
        "training=mlperf/llama31_8b",
        *test_gpu_mlperf.TINY,
        "training.data.mock=true",
        "training.data.blend=null",
        "training.data.valid_blend=null",
    ],
    "observability": lambda: test_gpu_observability.overrides(
        "/tmp/gpu-configs", "check", "training.train_steps=40", "training.val_interval=10", "training.data.mock=true"
    ),
    **{
        f"memory estimate {model}": test_gpu_memory_estimate._overrides(model, 2, 2, "/tmp/gpu-configs")
        for model in ("70b", "405b")
    },
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_gpu_tests_configs_pass_the_plan(name, monkeypatch):
    monkeypatch.setattr(test_gpu_observability, "gpus", lambda: 2)  # the test asks torch for the GPUs it has
    overrides = CONFIGS[name]() if callable(CONFIGS[name]) else CONFIGS[name]
    validate(compose([*overrides, "memory_check=false"]), TWO_H200)
