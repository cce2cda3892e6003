"""Fine-tuning on GPUs: packed sequences (THD with cu_seqlens) against one padded sample per sequence, and full SFT
against an independent transformers loop.

The samples are prompt/response JSON lines made for their lengths: each is 103 to 128 tokens (prompt, response
and EOD under the test's sentencepiece tokenizer), so with seq_length 512 every 4 consecutive samples fill one
packed sequence and no 5 do. A packed run of global batch 2 then trains on exactly the samples of a padded run of
global batch 8, step by step, and evaluates on the same 32 held-out samples (8 packed sequences or 32 padded):
- a packed batch gives each sample the loss it has alone, padded (in-process, bf16; fp32 where an attention
  backend runs it), and the same batch without its boundaries does not;
- a packed run and a padded run reach the same validation loss after 50 steps, within 0.01, on one GPU and on
  two (TP2 + SP, PP2 x VP2, DP2);
- full SFT (peft=none, packed) from Hugging Face random weights follows a transformers loop on the same sequences,
  masks, learning rates, AdamW and clipping: every one of 100 steps' losses within 1%.

The data preparation and every config run here pass the plan on the CPU too (tests/recipes/test_gpu_configs_cpu.py
prepares the same samples)."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from corpora import WORDS, train_sentencepiece, write_corpus
from launcher.config.compose import compose
from launcher.plan.build import build_plan
from launcher.plan.hardware import LocalGpus
from test_gpu_model import single_rank  # noqa: F401  (fixture: a one-rank NCCL world in this process)
from test_gpu_training import LAYOUTS, gpu_count, main_py, read_metrics

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(3600)]

SEQ = 512
SHORTEST, LONGEST = SEQ // 5 + 1, SEQ // 4  # any 4 samples fit a sequence, no 5 do
PER_SEQUENCE = 4
SAMPLES, HELD_OUT = 320, 32
VOCAB = 512  # a multiple of 128: no vocabulary padding, so megatron's softmax is transformers'
MODEL = ["training=llama31/tiny", f"training.model.vocab_size={VOCAB}", f"training.seq_length={SEQ}"]
SCHEDULE = ["training.optimizer.lr=3e-4", "training.optimizer.min_lr=3e-5", "training.scheduler.warmup_steps=5"]
# The same samples per step and per evaluation, one per sequence or four.
PADDED = ["training.data.packing=false", "training.micro_batch_size=2", "training.global_batch_size=8"]
PACKED = ["training.data.packing=true", "training.micro_batch_size=1", "training.global_batch_size=2"]
PADDED_EVAL = f"training.val_samples={HELD_OUT}"
PACKED_EVAL = f"training.val_samples={HELD_OUT // PER_SEQUENCE}"
EVAL_RUN = [*SCHEDULE, "training.train_steps=50", "training.val_interval=50", "training.checkpoint.interval=0"]
EVAL_RUN += ["training.checkpoint.save_at_end=false"]
HF_STEPS = 100
HF_RUN = [
    "training.optimizer.lr=3e-4",
    "training.optimizer.min_lr=3e-5",
    "training.scheduler.warmup_steps=10",
    f"training.train_steps={HF_STEPS}",
    "training.val_interval=0",
    "training.checkpoint.interval=0",
    "training.checkpoint.save_at_end=false",
    "training.data.packing=true",
    "training.micro_batch_size=2",
    "training.global_batch_size=4",
    "peft=none",
]


# --------------------------------------------------------------------------- the samples
def sample_lines(tokenizer_path: Path, count: int, seed: int) -> list[str]:
    """`count` prompt/response JSON lines of SHORTEST..LONGEST tokens each, as sft_jsonl counts them (prompt
    ids, response ids, EOD)."""
    from data_prep.tokenizer import load_tokenizer

    tok = load_tokenizer("sentencepiece", str(tokenizer_path))
    rng = random.Random(seed)
    lines: list[str] = []
    while len(lines) < count:
        target = rng.randint(SHORTEST, LONGEST)
        prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 30)))
        used = len(tok.encode(prompt)) + 1  # + EOD
        words: list[str] = []
        while used + len(tok.encode(" ".join(words))) < target:
            words.append(rng.choice(WORDS))
        if words and used + len(tok.encode(" ".join(words))) == target:
            lines.append(json.dumps({"prompt": prompt, "response": " ".join(words)}))
    return lines


def prepare(root: Path) -> dict:
    """A sentencepiece tokenizer, the samples, and their data preparation through main.py (sft_jsonl): the
    overrides that train on them. Reused when `root` already holds them."""
    prefix = root / "data" / "samples_sft_document"
    tokenizer = root / "sp.model"
    overrides = [
        "training.tokenizer.type=sentencepiece",
        f"training.tokenizer.path={tokenizer}",
        "training.data.format=sft",
        "training.data.mock=false",
        f"training.data.blend=[{prefix}]",
        f"training.data.split='{SAMPLES - HELD_OUT},{HELD_OUT},0'",
    ]
    if (root / "prepared").exists():
        return {"root": root, "prefix": str(prefix), "overrides": overrides}
    root.mkdir(parents=True, exist_ok=True)
    train_sentencepiece(root / "sp", write_corpus(root / "corpus", ["a", "b"]), vocab_size=400)
    samples = root / "samples.jsonl"
    samples.write_text("\n".join(sample_lines(tokenizer, SAMPLES, seed=29)) + "\n")
    main_py(
        "stages=[data_preparation]",
        "data_preparation=sft_jsonl",
        f"data_preparation.inputs=[{samples}]",
        f"data_preparation.output_dir={root / 'data'}",
        "data_preparation.workers=1",
        f"results_dir={root / 'runs'}",
        *MODEL,
        *overrides[:2],
    )
    from recipes.trainer.sft import SftSamples

    lengths = SftSamples([str(prefix)]).lengths
    assert len(lengths) == SAMPLES and lengths.min() >= SHORTEST and lengths.max() <= LONGEST, (
        f"the prepared samples are {lengths.min()}..{lengths.max()} tokens, not {SHORTEST}..{LONGEST}: packs of "
        f"{PER_SEQUENCE} would not hold the padded runs' samples"
    )
    (root / "prepared").write_text("")
    return {"root": root, "prefix": str(prefix), "overrides": overrides}


def run_overrides(data: dict, results: Path, name: str, *extra: str) -> list[str]:
    return ["cluster=local", f"results_dir={results}", f"run_name={name}", *MODEL, *data["overrides"], *extra]


def eval_pair(data: dict, results: Path, layout: str) -> dict[str, list[str]]:
    """The padded and the packed run of one layout, 50 steps then one evaluation."""
    extra = LAYOUTS.get(layout, [])
    return {
        mode: run_overrides(data, results, f"{layout}_{mode}", *EVAL_RUN, *batch, evaluation, *extra)
        for mode, batch, evaluation in (("padded", PADDED, PADDED_EVAL), ("packed", PACKED, PACKED_EVAL))
    }


@pytest.fixture(scope="module")
def sft_data(tmp_path_factory) -> dict:
    return prepare(tmp_path_factory.mktemp("sft"))


# --------------------------------------------------------------------------- (a) one packed batch
def _samples(lengths: list[int], generator) -> list[tuple]:
    """Random tokens, and masks that leave out a random prompt of at most half the sample."""
    import numpy as np
    import torch

    made = []
    for n in lengths:
        ids = torch.randint(0, VOCAB, (n,), generator=generator).numpy()
        prompt = int(torch.randint(1, n // 2 + 1, (1,), generator=generator))
        mask = np.concatenate([np.zeros(prompt, np.uint8), np.ones(n - prompt, np.uint8)])
        made.append((ids, mask))
    return made


def _per_sample(losses, masks: list, starts: list[int]) -> list[float]:
    """Each sample's mean loss over its masked positions, from per-token losses laid out from `starts`."""
    return [float((losses[start : start + len(m)] * m).sum() / m.sum()) for m, start in zip(masks, starts)]


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_a_packed_batch_gives_each_sample_its_padded_loss(dtype, single_rank):  # noqa: F811
    import torch

    from recipes.trainer import model as model_lib, settings
    from recipes.trainer.sft import build_sequence, packed_microbatch

    # A larger init than training's makes each token's loss depend strongly on what it attends to, so the control
    # below (the same batch without its boundaries) is far from the padded losses.
    cfg = compose([*MODEL, "training.model.init_method_std=0.1", "cluster.gpus_per_node=1"])
    plan = build_plan(cfg, LocalGpus(1, "h100", ("gpu",)))
    kwargs = settings.transformer_config_kwargs(cfg, plan, grad_accum_fusion=False)
    if dtype == "fp32":
        kwargs.update(
            bf16=False, params_dtype=torch.float32, pipeline_dtype=torch.float32, autocast_dtype=torch.float32
        )
    try:
        model = model_lib.build_model_chunks(settings.make_transformer_config(kwargs), cfg, plan)[0].eval()
    except Exception as err:
        if dtype == "fp32":  # "where it runs": megatron-core or Transformer Engine may refuse an fp32 model
            pytest.skip(f"an fp32 model does not build here: {str(err).splitlines()[0]}")
        raise
    generator = torch.Generator().manual_seed(0)
    # Two packed sequences of one microbatch: one full, one with padding at its end; short and long samples.
    packs = [_samples([37, 100, 64, 255, 56], generator), _samples([200, 20, 150, 72], generator)]
    pad = 0

    def run(batch: dict, packed_seq_params=None):
        with torch.no_grad():
            return model(
                batch["tokens"],
                batch["position_ids"],
                None,
                labels=batch["labels"],
                packed_seq_params=packed_seq_params,
            ).float()

    def stacked(sequences: list[dict]) -> dict:
        return {
            key: torch.stack([torch.from_numpy(s[key]) for s in sequences]).cuda()
            for key in ("tokens", "labels", "loss_mask", "position_ids")
        }

    batch = stacked([build_sequence(pack, SEQ, pad) for pack in packs])
    packed = packed_microbatch(batch)
    try:
        packed_losses = run(packed, packed["packed_seq_params"])[0]
    except Exception as err:  # in fp32 only Transformer Engine's unfused attention runs, if it takes THD
        if dtype == "fp32":
            pytest.skip(f"fp32 packed attention does not run here: {str(err).splitlines()[0]}")
        raise
    flat_mask = packed["loss_mask"][0]
    starts, masks, k = [], [], 0
    for pack in packs:
        offset = k * SEQ
        for ids, _ in pack:
            starts.append(offset)
            masks.append(flat_mask[offset : offset + len(ids)])
            offset += len(ids)
        k += 1
    ours = _per_sample(packed_losses, masks, starts)

    samples = [sample for pack in packs for sample in pack]
    alone = stacked([build_sequence([sample], SEQ, pad) for sample in samples])
    padded_losses = run(alone)
    reference = _per_sample_rows(padded_losses, alone["loss_mask"])

    # The same batch without its boundaries: positions run on and samples attend to the ones before them.
    unbounded = {key: value for key, value in packed.items() if key != "packed_seq_params"}
    unbounded["position_ids"] = torch.arange(2 * SEQ, device="cuda")[None]
    control = _per_sample(run(unbounded)[0], masks, starts)

    diffs = [abs(a - b) / abs(b) for a, b in zip(ours, reference)]
    # The microbatch's first sample sees nothing before it either way; every later one sees the others.
    control_diffs = [abs(a - b) / abs(b) for a, b in zip(control[1:], reference[1:])]
    print(
        f"\n{dtype}: per-sample losses {[round(x, 4) for x in reference]}; packed vs padded max rel. diff "
        f"{max(diffs):.2e}; without the boundaries {min(control_diffs):.2e}..{max(control_diffs):.2e}"
    )
    tolerance = 1e-3 if dtype == "bf16" else 1e-4
    assert max(diffs) < tolerance, diffs
    assert max(control_diffs) > 10 * tolerance, control_diffs  # the comparison sees a boundary that leaks


def _per_sample_rows(losses, masks) -> list[float]:
    return [float((row * m).sum() / m.sum()) for row, m in zip(losses, masks)]


# --------------------------------------------------------------------------- (b) packed and padded runs
# test_gpu_training's 2-GPU layouts but CP2: the plan refuses packing with context parallelism.
SFT_LAYOUTS = ["one_gpu", *(name for name in LAYOUTS if name != "cp2")]


@pytest.mark.parametrize("layout", SFT_LAYOUTS)
def test_packed_and_padded_runs_reach_the_same_validation_loss(layout, sft_data):
    if layout != "one_gpu" and gpu_count() < 2:
        pytest.skip("needs 2 GPUs")
    results = sft_data["root"] / "runs"
    runs = eval_pair(sft_data, results, layout)
    for overrides in runs.values():
        main_py(*overrides)
    padded, packed = (read_metrics(results / f"{layout}_{mode}") for mode in ("padded", "packed"))
    assert sorted(padded) == sorted(packed) == list(range(1, 51))
    first = abs(padded[1]["loss"] - packed[1]["loss"])
    steps = max(abs(padded[s]["loss"] - packed[s]["loss"]) for s in range(1, 51))
    val_padded, val_packed = padded[50]["val_loss"], packed[50]["val_loss"]
    trained = packed[50]["trained_tokens"]
    print(
        f"\n{layout}: step 1 loss {padded[1]['loss']:.4f} padded, {packed[1]['loss']:.4f} packed; max |step loss "
        f"difference| {steps:.2e}; validation loss after 50 steps {val_padded:.4f} padded, {val_packed:.4f} "
        f"packed; trained tokens at step 50: {trained} of {2 * SEQ} (packed), {padded[50]['trained_tokens']} of "
        f"{8 * SEQ} (padded); trained tokens/s {padded[50]['trained_tokens_per_s']:.0f} padded, "
        f"{packed[50]['trained_tokens_per_s']:.0f} packed"
    )
    # The same samples each step: the same loss-bearing tokens, and the same first loss up to kernel rounding.
    assert all(padded[s]["trained_tokens"] == packed[s]["trained_tokens"] for s in range(1, 51))
    assert first < 2e-3 * padded[1]["loss"]
    assert padded[50]["loss"] < padded[1]["loss"] - 0.5  # it trained
    assert abs(val_padded - val_packed) < 0.01


# --------------------------------------------------------------------------- (c) against transformers
def megatron_lr(step: int, lr: float, min_lr: float, warmup: int, decay: int) -> float:
    """The LR of training step `step` (1-based): megatron-core's OptimizerParamScheduler starts at 0 and steps
    after each optimizer step, so step k runs at the schedule's value after k - 1 steps (linear warmup, then
    cosine to min_lr at `decay`)."""
    done = step - 1
    if done <= warmup:
        return lr * done / warmup
    ratio = (done - warmup) / (decay - warmup)
    return min_lr + 0.5 * (math.cos(math.pi * ratio) + 1.0) * (lr - min_lr)


def training_sequences(overrides: list[str]) -> tuple[list[dict], object]:
    """Every training sequence of the run, exactly as the trainer reads them (same dataset, same order), and
    the run's config."""
    import tempfile

    from recipes.trainer import data

    cfg = compose([*overrides, "cluster.gpus_per_node=1"])
    plan = build_plan(cfg, LocalGpus(1, "h100", ("gpu",)))
    with tempfile.TemporaryDirectory() as cache:
        train_ds, _ = data.build_datasets(cfg, plan, data.build_tokenizer(cfg), True, cache)
        return [train_ds[i] for i in range(HF_STEPS * plan.global_batch_size)], cfg


def transformers_loop(model_dir: Path, sequences: list[dict], cfg, global_batch: int) -> tuple[list, list]:
    """Full fine-tuning in plain transformers and torch: each packed sequence cut at its cu_seqlens into samples
    (each alone, positions from 0), the loss mask's tokens averaged over the global batch, AdamW with weight decay
    on matrices only (megatron-core's default groups), the global gradient norm clipped, megatron's schedule.
    Weights in fp32 and bf16 autocast, as megatron keeps fp32 main weights and computes in bf16."""
    import torch
    import torch.nn.functional as F
    from transformers import LlamaForCausalLM

    train = cfg.training
    opt_cfg = train.optimizer
    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).cuda().train()
    params = list(model.parameters())
    groups = [
        {"params": [p for p in params if p.dim() > 1], "weight_decay": opt_cfg.weight_decay},
        {"params": [p for p in params if p.dim() == 1], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(
        groups, lr=0.0, betas=(opt_cfg.adam_beta1, opt_cfg.adam_beta2), eps=opt_cfg.adam_eps, foreach=False
    )
    losses, lrs = [], []
    for step in range(1, HF_STEPS + 1):
        lr = megatron_lr(step, opt_cfg.lr, opt_cfg.min_lr, train.scheduler.warmup_steps, train.train_steps)
        for group in optimizer.param_groups:
            group["lr"] = lr
        pieces = []
        for seq in sequences[(step - 1) * global_batch : step * global_batch]:
            bounds = seq["cu_seqlens"].tolist()
            for lo, hi in zip(bounds[:-1], bounds[1:]):
                mask = seq["loss_mask"][lo:hi]
                if mask.sum() > 0:  # the padding segment trains nothing
                    pieces.append((seq["tokens"][lo:hi], seq["labels"][lo:hi], mask))
        longest = max(len(t) for t, _, _ in pieces)
        tokens = torch.zeros(len(pieces), longest, dtype=torch.long)
        labels = torch.zeros(len(pieces), longest, dtype=torch.long)
        masks = torch.zeros(len(pieces), longest)
        for i, (t, y, m) in enumerate(pieces):  # right padding: a causal model's real tokens never see it
            tokens[i, : len(t)], labels[i, : len(t)], masks[i, : len(t)] = t, y, m
        tokens, labels, masks = tokens.cuda(), labels.cuda(), masks.cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=tokens).logits
        per_token = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none")
        loss = (per_token * masks.reshape(-1)).sum() / masks.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, opt_cfg.clip_grad)
        optimizer.step()
        losses.append(loss.item())
        lrs.append(lr)
    del model, optimizer
    torch.cuda.empty_cache()
    return losses, lrs


def hf_random_init(directory: Path, overrides: list[str]) -> Path:
    """A random Llama of the run's shape in Hugging Face format (bf16 safetensors), for init_from_hf."""
    import torch
    from transformers import LlamaForCausalLM

    from recipes.hf import mapping

    model_cfg = compose([*overrides, "cluster.gpus_per_node=1"]).training.model
    torch.manual_seed(0)
    model = LlamaForCausalLM(mapping.hf_config(model_cfg))
    model.to(torch.bfloat16).save_pretrained(directory)
    return directory


def test_full_sft_follows_a_transformers_loop(sft_data):
    results = sft_data["root"] / "runs"
    base = run_overrides(sft_data, results, "full_sft", *HF_RUN)
    source = hf_random_init(sft_data["root"] / "hf_init", base)
    main_py(*base, f"training.checkpoint.init_from_hf={source}")
    ours = read_metrics(results / "full_sft")
    assert sorted(ours) == list(range(1, HF_STEPS + 1))

    sequences, cfg = training_sequences(base)
    reference, lrs = transformers_loop(source, sequences, cfg, global_batch=4)
    # The schedule is megatron's: the trainer logs the LR the next step runs at.
    for step in range(1, HF_STEPS):
        assert ours[step]["lr"] == pytest.approx(lrs[step], rel=1e-5, abs=1e-12), step
    rel = [abs(ours[s]["loss"] - reference[s - 1]) / reference[s - 1] for s in range(1, HF_STEPS + 1)]
    worst = max(range(HF_STEPS), key=lambda i: rel[i])
    print(
        f"\nfull SFT vs transformers: loss {reference[0]:.4f} -> {reference[-1]:.4f} (transformers), "
        f"{ours[1]['loss']:.4f} -> {ours[HF_STEPS]['loss']:.4f} (megatron); step 1 rel. diff {rel[0]:.2e}; "
        f"worst {rel[worst]:.2e} at step {worst + 1}; mean {sum(rel) / len(rel):.2e}"
    )
    assert reference[-1] < reference[0] - 0.5  # the loop trains: a frozen or wrong-LR run would not follow
    assert rel[0] < 2e-3  # the same weights and samples before any update
    assert max(rel) < 0.01
