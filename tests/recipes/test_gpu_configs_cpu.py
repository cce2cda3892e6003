"""Every config the GPU tests train passes the plan here, without a GPU: a value the plan refuses (a warmup longer
than a one-step run, FP8 attention on heads cuDNN cannot train) fails in seconds on CPU instead of after the
device's set-up. Data is mock where the GPU tests tokenize a corpus; the declared machine is two H200 (four for the
four-GPU layouts). Fine-tuning data cannot be mock: test_gpu_sft's samples are prepared here as there, and its runs'
premise (packed and padded runs train and evaluate on the same samples) is checked on the sequences the trainer
would read."""

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
import test_gpu_sft
import test_gpu_training
from launcher.config.compose import compose
from launcher.plan.build import build_plan
from launcher.plan.hardware import LocalGpus
from launcher.plan.validate import validate

TWO_H200 = LocalGpus(2, "h200", ("NVIDIA H200",) * 2)
FOUR_H200 = LocalGpus(4, "h200", ("NVIDIA H200",) * 4)
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
        config = mapping.hf_config(cfg.training.model)
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
    **{
        f"training: 4-GPU layout {name}": tiny("training.train_steps=40", "training.deterministic=true", *layout)
        for name, layout in test_gpu_training.FOUR_GPU_LAYOUTS.items()
    },
    **{
        f"training: 4-GPU {name}": tiny("training.train_steps=40", *extra)
        for name, extra in test_gpu_training.FOUR_GPU_FP8.items()
    },
    **{
        f"training: 4-GPU kill and resume {name}": tiny(
            *test_gpu_training.RESUME_STEPS, *test_gpu_training.FOUR_GPU_LAYOUTS[name]
        )
        for name in test_gpu_training.FOUR_GPU_RESUMED
    },
    "perf: initial weights": tiny(*test_gpu_perf.INIT_RUN),
    **{
        f"perf: cuda graphs {mode}": tiny(*test_gpu_perf.GRAPH_RUN, f"training.cuda_graphs={mode}")
        for mode in ("per_layer", "full_iteration")
    },
    "perf: fp8 accuracy, the defaults (FP8 attention on)": tiny(*test_gpu_perf.ACCURACY_RUN, "dtype=fp8"),
    "perf: fp8 accuracy, bf16 attention": tiny(
        *test_gpu_perf.ACCURACY_RUN, "dtype=fp8", "dtype.fp8_dot_product_attention=false"
    ),
    **{
        f"hf: layout {name}": [*test_gpu_hf.COMMON, "cluster=local", "training.data.mock=true", *layout]
        for name, layout in test_gpu_hf.LAYOUTS.items()
    },
    "hf: tied embeddings": tiny(*test_gpu_hf.TIED),
    **{f"lora: {name}": lora(name, *test_gpu_lora.COMPARED, *layout) for name, layout in test_gpu_lora.LAYOUTS.items()},
    **{
        f"lora: {dtype}": lora(f"lora_{dtype}", f"dtype={dtype}", *test_gpu_lora.LAYOUTS["tp1"])
        for dtype in ("bf16", "fp8")
    },
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
def test_the_gpu_tests_configs_pass_the_plan(name, monkeypatch, tmp_path):
    monkeypatch.setattr(test_gpu_observability, "gpus", lambda: 2)  # the test asks torch for the GPUs it has
    overrides = CONFIGS[name]() if callable(CONFIGS[name]) else CONFIGS[name]
    if not any(o.startswith("results_dir=") for o in overrides):  # not the checkout's results/, which runs fill
        overrides = [*overrides, f"results_dir={tmp_path}"]
    cfg = compose([*overrides, "memory_check=false"])
    validate(cfg, FOUR_H200 if cfg.parallelism.num_gpus > 2 else TWO_H200)


@pytest.fixture(scope="module")
def sft_data(tmp_path_factory) -> dict:
    return test_gpu_sft.prepare(tmp_path_factory.mktemp("sft"))


def sft_configs(data: dict, root: Path) -> dict[str, list[str]]:
    configs = {
        f"sft: {layout} {mode}": overrides
        for layout in test_gpu_sft.SFT_LAYOUTS
        for mode, overrides in test_gpu_sft.eval_pair(data, root, layout).items()
    }
    base = test_gpu_sft.run_overrides(data, root, "full_sft", *test_gpu_sft.HF_RUN)
    configs["sft: full, from Hugging Face weights"] = [*base, f"training.checkpoint.init_from_hf={root / 'hf'}"]
    return configs


@pytest.mark.parametrize("name", sft_configs({"overrides": []}, Path("/x")))
def test_the_gpu_sft_configs_pass_the_plan(name, sft_data, tmp_path):
    base = test_gpu_sft.run_overrides(sft_data, tmp_path, "full_sft", *test_gpu_sft.HF_RUN)
    test_gpu_sft.hf_random_init(tmp_path / "hf", base)
    validate(compose([*sft_configs(sft_data, tmp_path)[name], "memory_check=false"]), TWO_H200)


def test_packed_and_padded_sft_runs_read_the_same_samples_each_step(sft_data, tmp_path):
    """test_gpu_sft's premise: a packed sequence holds 4 samples, so packed step s (global batch 2) trains on the
    samples of padded step s (global batch 8), in order, and both evaluations read the same 32 held-out samples."""
    import numpy as np

    from recipes.trainer import data

    def sequences(overrides: list[str]):
        cfg = compose([*overrides, "cluster.gpus_per_node=1"])
        plan = build_plan(cfg, LocalGpus(1, "h200", ("NVIDIA H200",)))
        return data.build_datasets(cfg, plan, data.build_tokenizer(cfg), True, str(tmp_path))

    def samples_of(item) -> list[list[int]]:
        bounds = item["cu_seqlens"].tolist()
        tokens = item["tokens"].tolist()
        return [tokens[lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:]) if item["loss_mask"][lo:hi].sum() > 0]

    runs = test_gpu_sft.eval_pair(sft_data, tmp_path, "one_gpu")
    (padded_train, padded_valid), (packed_train, packed_valid) = (sequences(runs[m]) for m in ("padded", "packed"))
    assert len(padded_train) == 4 * len(packed_train) == 400
    for step in range(50):
        packed = [s for item in (packed_train[2 * step], packed_train[2 * step + 1]) for s in samples_of(item)]
        padded = [samples_of(padded_train[8 * step + k])[0] for k in range(8)]
        assert packed == padded, f"step {step + 1}: the packed and padded runs train on different samples"
        assert all(len(samples_of(packed_train[2 * step + k])) == 4 for k in range(2))
    held_out = [s for k in range(len(packed_valid)) for s in samples_of(packed_valid[k])]
    assert held_out == [samples_of(padded_valid[k])[0] for k in range(len(padded_valid))] and len(held_out) == 32
    # Full SFT's sequences: 4 samples each, every one of the 288 training samples in each epoch.
    train, _ = sequences(test_gpu_sft.run_overrides(sft_data, tmp_path, "full", *test_gpu_sft.HF_RUN))
    firsts = [tuple(samples_of(train[k])[0][:8]) for k in range(72)]
    assert len(train) == 400 and len(set(firsts)) == 72
    assert np.all([len(samples_of(train[k])) == 4 for k in range(len(train))])
