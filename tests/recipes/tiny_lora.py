"""A real LoRA fine-tuning run on the CPU, for tests: GovReport-shaped samples of real text (Python's standard
library, tokenized by a sentencepiece model trained on it) written by data_prep's govreport_mlperf source, and
the steps the training loop calls (recipes/trainer/loop.py's Trainer: train_step, evaluate, synced_params, lr,
peak_memory_gib) on a tiny transformers Llama with PEFT's LoRA, in fp32, from a composed config and plan. The
frozen base is the tiny model trained whole beforehand and saved in Hugging Face format, where
training.checkpoint.init_from_hf names it, as Meta's weights for the real benchmark.

What stands in for megatron-core is only the model and its optimizer step; the rest is the project's own: the
data (data_prep's pipeline, recipes/trainer/data.py's SFT sequences and loader order), the LoRA settings and
their Hugging Face module names (recipes/peft/hf.py), and the LR schedule (megatron-core's
OptimizerParamScheduler with recipes/trainer/settings.py's arguments). The loss is recipes/trainer/steps.py's:
token-weighted over the loss mask of the global batch, for training and evaluation alike."""

from __future__ import annotations

import contextlib
import json
import resource
from pathlib import Path
from typing import Iterator

import torch
import torch.nn.functional as F

from common.config import Config, LoraConfig, ModelConfig
from common.evaluation import eval_microbatches, eval_samples
from common.plan import Plan
from data_prep.pipeline import Pipeline, Settings
from data_prep.shards import list_shards
from data_prep.sft import IGNORE_INDEX
from data_prep.tokenizer import load_tokenizer
from data_prep.train_tokenizer import train_sentencepiece
from recipes.peft import hf as peft_hf
from recipes.trainer import data

# A Llama small enough for a few hundred steps in seconds on two cores; the tokenizer's vocabulary.
VOCAB = 1024
TINY_MODEL = [
    "training.model.num_layers=2",
    "training.model.hidden_size=64",
    "training.model.ffn_hidden_size=176",
    "training.model.num_attention_heads=4",
    "training.model.num_query_groups=2",
    "training.model.kv_channels=16",
    f"training.model.vocab_size={VOCAB}",
]


# ----------------------------------------------------------------------------- GovReport-shaped samples
def sentencepiece_on(corpus: Path, directory: Path) -> str:
    """A sentencepiece model of VOCAB tokens trained on the corpus (JSON lines of `text`); its path."""
    return train_sentencepiece([str(corpus)], str(directory / "sp"), vocab_size=VOCAB)


def govreport_rows(texts: list[str], tokenizer_path: str, seq_length: int, train: int, validation: int):
    """(training rows, validation rows) in MLPerf's schema (input_ids, labels: -100 where the loss is masked,
    attention_mask), as its GovReport files hold them: training rows are packed blocks of seq_length tokens with
    every label kept, validation rows single samples whose first half (the report) and last token are masked, so
    the loss is on what follows (the summary). Every third block is held out for validation until there are
    enough: the evaluation is on text the run never trains on, from the same sources."""
    tokenizer = load_tokenizer("sentencepiece", tokenizer_path)
    ids = [t for doc in tokenizer.encode_batch(texts) for t in [*map(int, doc), int(tokenizer.eod)]]
    every = [ids[i : i + seq_length] for i in range(0, len(ids) - seq_length + 1, seq_length)]
    held_out = every[::3][:validation]
    trained = [block for k, block in enumerate(every) if k % 3 or k // 3 >= validation][:train]
    if len(held_out) < validation or len(trained) < train:
        raise ValueError(f"the corpus makes {len(every)} blocks of {seq_length} tokens, not {train} + {validation}")

    def row(ids: list[int], masked: int) -> dict:
        labels = [IGNORE_INDEX] * masked + ids[masked:-1] + [IGNORE_INDEX] if masked else list(ids)
        return {"input_ids": ids, "labels": labels, "attention_mask": [1] * len(ids)}

    return [row(ids, 0) for ids in trained], [row(ids, seq_length // 2) for ids in held_out]


def pretrained_base(model: ModelConfig, rows: list[dict], directory: Path, seed: int, steps: int, lr: float) -> str:
    """A tiny Llama trained whole on the rows' tokens, in Hugging Face format (training.checkpoint.init_from_hf):
    the benchmark adapts a pretrained base, and through adapters a random one of this size learns next to nothing
    (its logits, of weights drawn with init_method_std, stay too small to move far from uniform: 6.851 -> 6.850
    between the two evaluations of the test's run)."""
    from transformers import LlamaForCausalLM

    from recipes.hf import mapping

    torch.manual_seed(seed)
    base = LlamaForCausalLM(mapping.hf_config(model)).train()
    optimizer = torch.optim.AdamW(base.parameters(), lr=lr)
    batches = torch.tensor([row["input_ids"] for row in rows]).split(8)
    for step in range(steps):
        batch = batches[step % len(batches)]
        optimizer.zero_grad()
        base(input_ids=batch, labels=batch).loss.backward()
        optimizer.step()
    base.save_pretrained(directory)
    return str(directory)


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path.name


def prepare(cfg: Config) -> None:
    """Run the config's data_preparation section (govreport_mlperf) as the data_preparation stage would."""
    dp = cfg.data_preparation
    results = Pipeline(Settings.from_config(dp), log=lambda _: None).run(list_shards(dp), progress=False)
    assert [r.status for r in results] == ["done"] * len(results), results


# ----------------------------------------------------------------------------- the steps
def cpu_loader(dataset, micro_batch_size: int) -> Iterator[dict[str, torch.Tensor]]:
    """The trainer's loader (its sample order) on the CPU: microbatches as recipes/trainer/data.py's
    MicrobatchSource hands them to the model, without the copy to a GPU."""
    for stacked in data.make_loader(dataset, 0, micro_batch_size, 0, 1, num_workers=0):
        batch = dict(zip(data.BATCH_FIELDS, stacked.unbind(0)))
        batch["loss_mask"] = batch["loss_mask"].float()
        yield batch


class LoraSteps:
    """Training steps and evaluations of a tiny LlamaForCausalLM with LoRA adapters, one process, fp32: the
    config's base, adapters (peft), optimizer, schedule and data; the plan's batch sizes and microbatches."""

    def __init__(self, cfg: Config, plan: Plan, datasets):
        import peft
        from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
        from transformers import LlamaForCausalLM

        from recipes.trainer import settings

        lora, train = cfg.peft, cfg.training
        assert isinstance(lora, LoraConfig), "a LoRA benchmark"
        torch.manual_seed(cfg.seed)
        base = LlamaForCausalLM.from_pretrained(train.checkpoint.init_from_hf, dtype=torch.float32)
        # PEFT starts A Kaiming-uniform and B at zero, as the preset's a_init and b_init.
        adapters = peft.LoraConfig(
            r=lora.rank,
            lora_alpha=lora.alpha,
            lora_dropout=lora.dropout,
            target_modules=peft_hf.peft_modules(list(lora.target_modules)),
        )
        self.model = peft.get_peft_model(base, adapters).train()
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        opt = train.optimizer
        self.optimizer = torch.optim.AdamW(
            self.params,
            lr=opt.lr,
            betas=(opt.adam_beta1, opt.adam_beta2),
            eps=opt.adam_eps,
            weight_decay=opt.weight_decay,
        )
        self.scheduler = OptimizerParamScheduler(self.optimizer, **settings.scheduler_kwargs(cfg))
        self.clip, self.plan, self.train_cfg = opt.clip_grad, plan, train
        train_ds, self.valid_ds = datasets
        self.train_iter = cpu_loader(train_ds, plan.micro_batch_size)
        self.val_losses: list[float] = []  # every evaluation's, in order, for the test to compare with the log

    def _loss_sum(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Sum of the per-token losses over the loss mask, and its token count (steps.loss_func's)."""
        logits = self.model(input_ids=batch["tokens"], position_ids=batch["position_ids"]).logits
        losses = F.cross_entropy(logits.flatten(0, 1).float(), batch["labels"].flatten(), reduction="none")
        mask = batch["loss_mask"].flatten()
        return (losses * mask).sum(), mask.sum()

    def _microbatches(self, source: Iterator[dict[str, torch.Tensor]], count: int) -> dict[str, torch.Tensor]:
        """`count` microbatches as one batch: the summed loss and its gradients are those of running them one by
        one, at a fraction of the per-call overhead of the Hugging Face model on a CPU."""
        batches = [next(source) for _ in range(count)]
        return {key: torch.cat([b[key] for b in batches]) for key in batches[0]}

    def train_step(self) -> tuple[float, float]:
        """One optimizer step over the plan's microbatches: (the global batch's mean loss, the gradient norm before
        clipping). The gradients are the global batch's token mean's, as megatron's calculate_per_token_loss."""
        self.optimizer.zero_grad()
        loss, tokens = self._loss_sum(self._microbatches(self.train_iter, self.plan.num_microbatches))
        mean = loss / tokens.clamp(min=1)
        mean.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.clip)
        self.optimizer.step()
        self.scheduler.step(increment=1)
        return mean.item(), float(grad_norm)

    def evaluate(self) -> float:
        """Mean loss over every trained token of the evaluation's sequences (the same ones each time), read in the
        trainer's schedule calls."""
        plan = self.plan
        calls = eval_microbatches(
            eval_samples(self.train_cfg, plan.global_batch_size), plan.micro_batch_size, 1, plan.num_microbatches
        )
        batches = cpu_loader(self.valid_ds, plan.micro_batch_size)
        total, tokens = 0.0, 0.0
        self.model.eval()
        with torch.no_grad():
            for count in calls:
                loss, trained = self._loss_sum(self._microbatches(batches, count))
                total, tokens = total + loss.item(), tokens + trained.item()
        self.model.train()
        self.val_losses.append(total / max(tokens, 1.0))
        return self.val_losses[-1]

    @contextlib.contextmanager
    def synced_params(self):
        yield  # one process: nothing in flight

    def lr(self) -> float:
        return self.scheduler.get_lr(self.optimizer.param_groups[0])

    def peak_memory_gib(self) -> float:
        """The process's peak resident memory (Linux reports KiB): the CPU's counterpart of the GPU's peak."""
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
