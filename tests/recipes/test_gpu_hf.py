"""Hugging Face weights in and out on GPUs, through `python main.py ... cluster=local`.

A random Llama 3.1-shaped model (the tiny recipe's shape: 6 layers, GQA 8 heads / 4 KV groups, RoPE base 500000
with the Llama 3.1 scaling, vocabulary 8000, not a multiple of 128) is made with transformers and saved in
several safetensors shards. Its embedding and output layer are set so that it predicts token t+1 after token t,
which is what megatron's mock data holds (documents 1, 2, 3, ...): its loss on that data is far below ln(vocab),
and every layer still moves it. Then:
- the first-step loss (before any update) of runs started with init_from_hf in TP2+SP, PP2 x VP2 asymmetric,
  CP2, DP2 (2 GPUs) and TP1 (1 GPU) equals transformers' loss of that model on the same global batch;
- the TP2 run trains 20 steps and is exported: transformers' logits of the export equal the megatron model's;
- the TP1 run starts from that export, saves its initial weights, and their export is byte-identical.
The tiny model with Llama 3.2's tied embeddings trains 100 steps on real text (test_gpu_training's corpus) and its
export, evaluated by transformers on the run's validation sequences, gives the run's last validation loss."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from common.evaluation import eval_samples
from launcher.config.compose import compose
from launcher.plan.build import build_plan
from launcher.plan.hardware import LocalGpus
from test_gpu_model import single_rank  # noqa: F401  (fixture: a one-rank NCCL world in this process)
from test_gpu_training import corpus, gpu_count, main_py, read_metrics, tiny  # noqa: F401  (corpus: a fixture)

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.gpu, pytest.mark.timeout(3600)]

VOCAB = 8000
COMMON = [
    "training=llama31/tiny",
    f"training.model.vocab_size={VOCAB}",
    "training.train_steps=20",
    "training.scheduler.warmup_steps=5",
    "training.val_interval=0",
    "training.checkpoint.interval=0",
]
LAYOUTS = {  # the 2-GPU layouts of test_gpu_training, each run once from the Hugging Face weights
    "tp2_sp": ["parallelism=tp2_sp", "parallelism.tp_comm_overlap=false"],
    "pp2_vp2_asym": ["parallelism=pp2_vp2_asym"],
    "cp2": ["parallelism=tp1_cp2", "parallelism.num_gpus=2"],
    "dp2": ["parallelism=tp1", "parallelism.num_gpus=2"],
}


def write_tokenizer(directory: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(
        ["a small tokenizer for the export"] * 20,
        trainers.BpeTrainer(vocab_size=300, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"]),
    )
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"})
    )


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> dict:
    import torch
    from transformers import LlamaForCausalLM

    from recipes.hf import mapping

    root = tmp_path_factory.mktemp("hf_gpu")
    source, tokenizer = root / "source", root / "tokenizer"
    tokenizer.mkdir()
    write_tokenizer(tokenizer)
    cfg = compose(COMMON + ["cluster.gpus_per_node=1"])
    model_cfg = cfg.training.model
    torch.manual_seed(0)
    model = LlamaForCausalLM(mapping.hf_config(model_cfg))
    h = model_cfg.hidden_size
    with torch.no_grad():
        embedding = torch.randn(VOCAB, h)
        model.model.embed_tokens.weight.copy_(embedding)
        model.lm_head.weight.copy_(10.0 / h * embedding.roll(1, dims=0))  # row j = E[j-1]: predicts t + 1
        for param in model.parameters():
            if param.dim() == 1:  # norms not all ones, so a misplaced norm shows
                param.copy_(1 + 0.1 * torch.randn_like(param))
    model.to(torch.bfloat16).save_pretrained(source, max_shard_size="20MB")
    shards = sorted(source.glob("*.safetensors"))
    assert len(shards) >= 3, shards
    overrides = [*COMMON, f"training.tokenizer.path={tokenizer}", "training.tokenizer.type=huggingface"]
    return {"root": root, "source": source, "overrides": overrides, "batch": first_global_batch(overrides)}


def dataset_samples(overrides: list[str], validation: bool) -> list[dict]:
    """Samples exactly as training reads them (same dataset, same order): step 1's global batch of the training
    set, or the sequences every evaluation reads from the validation set."""
    import tempfile

    from recipes.trainer import data

    cfg = compose(overrides + ["cluster.gpus_per_node=1"])
    plan = build_plan(cfg, LocalGpus(1, "h100", ("gpu",)))
    count = eval_samples(cfg.training, plan.global_batch_size) if validation else plan.global_batch_size
    with tempfile.TemporaryDirectory() as cache:
        train_ds, valid_ds = data.build_datasets(cfg, plan, data.build_tokenizer(cfg), True, cache)
        dataset = valid_ds if validation else train_ds
        return [dataset[i] for i in range(count)]


def first_global_batch(overrides: list[str]) -> list[dict]:
    return dataset_samples(overrides, validation=False)


def transformers_loss(model_dir: Path, batch: list[dict], dtype) -> float:
    """Mean per-token loss over the global batch, as training computes it (loss mask, every token equal)."""
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).cuda().eval()
    total, count = 0.0, 0.0
    with torch.no_grad():
        for sample in batch:
            tokens = torch.as_tensor(sample["tokens"]).cuda()[None]
            labels = torch.as_tensor(sample["labels"]).cuda()
            mask = torch.as_tensor(sample["loss_mask"]).cuda().float()
            logits = model(tokens).logits[0].float()
            total += (F.cross_entropy(logits, labels, reduction="none") * mask).sum().item()
            count += mask.sum().item()
    del model
    torch.cuda.empty_cache()
    return total / count


def check_first_step(name: str, run_dir: Path, model_dir: Path, batch: list[dict]) -> None:
    import torch

    ours = read_metrics(run_dir)[1]["loss"]
    ref32 = transformers_loss(model_dir, batch, torch.float32)
    ref16 = transformers_loss(model_dir, batch, torch.bfloat16)
    print(
        f"\n{name}: first-step loss {ours:.5f}; transformers on the same batch: fp32 {ref32:.5f}, bf16 {ref16:.5f}; "
        f"|diff| {abs(ours - ref32):.2e} (ln(vocab) = {math.log(VOCAB):.3f})"
    )
    assert ref32 < 0.25 * math.log(VOCAB)  # the weights predict the data: they were loaded, not random
    assert abs(ours - ref32) < max(3 * abs(ref16 - ref32), 0.02 * ref32)


def export(checkpoint: Path, out: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "recipes.hf.exporter",
            "--checkpoint",
            str(checkpoint),
            "--out",
            str(out),
            "--max-shard-size",
            "20MB",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.fixture(scope="module")
def tp2_run(work) -> Path:
    """TP2 + sequence parallel from the Hugging Face weights, 20 steps, saved at the end."""
    if gpu_count() < 2:
        pytest.skip("needs 2 GPUs")
    main_py(
        *work["overrides"],
        f"results_dir={work['root']}",
        "run_name=tp2_sp",
        *LAYOUTS["tp2_sp"],
        f"training.checkpoint.init_from_hf={work['source']}",
    )
    return work["root"] / "tp2_sp"


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_first_step_loss_matches_transformers(layout, work, request):
    if gpu_count() < 2:
        pytest.skip("needs 2 GPUs")
    if layout == "tp2_sp":
        run_dir = request.getfixturevalue("tp2_run")
    else:
        main_py(
            *work["overrides"],
            f"results_dir={work['root']}",
            f"run_name={layout}",
            *LAYOUTS[layout],
            f"training.checkpoint.init_from_hf={work['source']}",
            "training.checkpoint.save_at_end=false",
        )
        run_dir = work["root"] / layout
    check_first_step(layout, run_dir, work["source"], work["batch"])


def test_export_after_training_gives_the_megatron_logits(work, tp2_run, single_rank):  # noqa: F811
    import torch
    from transformers import AutoModelForCausalLM

    from recipes.trainer import checkpoint, model as model_lib, settings

    trained = tp2_run / "checkpoints" / "iter_0000020"
    assert trained.is_dir()
    out = work["root"] / "export_tp2"
    export(trained, out)
    assert (out / "config.json").is_file() and (out / "tokenizer.json").is_file()

    cfg = compose(work["overrides"] + ["cluster.gpus_per_node=1"])
    plan = build_plan(cfg, LocalGpus(1, "h100", ("gpu",)))
    megatron_model = model_lib.build_model_chunks(
        settings.transformer_config(cfg, plan, grad_accum_fusion=False), cfg, plan
    )[0].eval()
    checkpoint.load_model_weights(str(trained), [megatron_model], print)  # TP2 checkpoint into TP1
    tokens = torch.as_tensor(work["batch"][0]["tokens"]).cuda()[None]
    positions = torch.arange(tokens.shape[1], device="cuda")[None]
    with torch.no_grad():
        ours = megatron_model(tokens, positions, None)[..., :VOCAB].float()
        ref = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).cuda().eval()(tokens).logits.float()
        ref16 = AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16).cuda().eval()(tokens).logits.float()

    def rel(a, b):
        return ((a - b).norm() / b.norm()).item()

    ours_err, bf16_err = rel(ours, ref), rel(ref16, ref)
    print(
        f"\nafter 20 TP2 steps: exported model (transformers fp32) vs megatron bf16 logits: rel. error "
        f"{ours_err:.2e} (transformers bf16 {bf16_err:.2e}); max abs diff {(ours - ref).abs().max().item():.3e}"
    )
    assert ours_err < 2e-2 and ours_err < 3 * bf16_err + 1e-3


def test_tp1_from_the_export_and_byte_identical_round_trip(work, tp2_run):
    """TP1 on one GPU starts from the exported model (its first-step loss against transformers'), saves the
    imported weights (iter_0000000), and their export equals the first export byte for byte."""
    first = work["root"] / "export_tp2"
    if not first.is_dir():
        export(tp2_run / "checkpoints" / "iter_0000020", first)
    main_py(
        *work["overrides"],
        f"results_dir={work['root']}",
        "run_name=tp1",
        "parallelism=tp1",
        f"training.checkpoint.init_from_hf={first}",
        "training.checkpoint.save_initial=true",
        "training.checkpoint.save_at_end=false",
        "cluster.gpus_per_node=1",
    )
    check_first_step("tp1 (from the export)", work["root"] / "tp1", first, work["batch"])
    second = work["root"] / "export_tp1"
    export(work["root"] / "tp1" / "checkpoints" / "iter_0000000", second)
    files = sorted(p.name for p in first.iterdir())
    assert files == sorted(p.name for p in second.iterdir())
    different = [f for f in files if (first / f).read_bytes() != (second / f).read_bytes()]
    print(f"\nexport -> import (TP1) -> export: {len(files)} files, {len(different)} differ")
    assert not different, different


TIED = [  # the tiny shape with Llama 3.2's tied embeddings, evaluated once at its end, then exported
    "training.model.share_embeddings_and_output_weights=true",
    "training.train_steps=100",
    "training.val_interval=100",
    "training.checkpoint.interval=0",
    "stages=[training,export]",
]


def test_tied_embeddings_train_and_the_export_gives_the_runs_validation_loss(corpus, tmp_path):  # noqa: F811
    import torch

    overrides = tiny(corpus, tmp_path, "tied", *TIED)
    main_py(*overrides)
    run = tmp_path / "tied"
    metrics = read_metrics(run)
    assert sorted(metrics) == list(range(1, 101))
    first, last = metrics[1]["loss"], metrics[100]["val_loss"]
    exported = run / "hf"
    config = json.loads((exported / "config.json").read_text())
    weights = json.loads((exported / "model.safetensors.index.json").read_text())["weight_map"]
    assert config["tie_word_embeddings"] and "lm_head.weight" not in weights
    ours = transformers_loss(exported, dataset_samples(overrides, validation=True), torch.float32)
    print(
        f"\ntied embeddings, 100 steps: loss {first:.3f} at step 1, validation loss {last:.4f} at step 100; "
        f"transformers on the export: {ours:.4f} (|diff| {abs(ours - last):.4f})"
    )
    assert last < first - 1.0  # it trained
    assert abs(ours - last) < 0.02
