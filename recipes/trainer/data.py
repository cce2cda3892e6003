"""Training data: megatron's GPTDataset over the data-preparation outputs (or its mock dataset), a sampler that
resumes at any consumed-sample count, and per-rank batches (loaded once per TP group and broadcast; sliced
for context parallelism)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
import os
from typing import Any, Iterator

from megatron.core import parallel_state as ps
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig, MockGPTDataset
from megatron.core.datasets.indexed_dataset import IndexedDataset
from megatron.core.utils import get_batch_on_this_cp_rank
import numpy as np
import torch

from common.config import Config, DataFormat
from common.evaluation import eval_samples
from common.plan import Plan
from data_prep.tokenizer import load_tokenizer
from recipes.runtime.stop_signals import helpers_immune_to_stop_signals
from recipes.trainer.sft import packed_microbatch, sft_datasets

# The four per-token fields a microbatch carries, stacked into one int64 tensor so the TP broadcast is one call.
BATCH_FIELDS = ("tokens", "labels", "loss_mask", "position_ids")


@dataclass(frozen=True)
class MockTokenizer:
    """What megatron's mock dataset needs of a tokenizer: vocabulary size, end-of-document id, and identifiers
    for the hash naming its cached sample indices. Real data uses data_prep's tokenizer, which has all three."""

    vocab_size: int
    eod: int

    @property
    def unique_identifiers(self) -> dict:
        return {"class": "MockTokenizer", "vocab_size": self.vocab_size, "eod": self.eod}


def blend_of(blend: list[Any]) -> tuple[list[str], list[float] | None]:
    """training.data.blend as megatron's (prefixes, weights): [w, p, w, p, ...] or [p, p, ...]."""
    if all(isinstance(item, str) for item in blend):
        return blend, None
    return [str(p) for p in blend[1::2]], [float(w) for w in blend[::2]]


def split_sizes(train_steps: int, global_batch_size: int, val_interval: int, val_samples: int) -> list[int]:
    """Samples per split (train, validation, test). Every evaluation reads the same val_samples sequences, so
    validation losses compare across evaluations and across a resume."""
    return [train_steps * global_batch_size, val_samples if val_interval > 0 else 0, 0]


class InOrderSequences(torch.utils.data.Dataset):
    """The first `num_samples` sequences of the documents of `prefixes` (data preparation outputs), read in order
    and never shuffled: sample i is tokens [i*seq, (i+1)*seq] of the documents laid end to end (seq + 1 tokens:
    inputs and labels shifted by one), cut as megatron's GPTDataset cuts its samples. MLPerf evaluates on exactly
    these sequences."""

    def __init__(self, prefixes: list[str], seq_length: int, num_samples: int, key: str = "training.data.valid_blend"):
        self.seq_length = seq_length
        self.parts = []
        for prefix in prefixes:
            dtype = IndexedDataset(prefix, mmap=True).index.dtype
            self.parts.append(np.memmap(prefix + ".bin", dtype=dtype, mode="r"))
        self.offsets = np.cumsum([0] + [len(p) for p in self.parts])
        available = max(0, int(self.offsets[-1]) - 1) // seq_length
        if num_samples > available:
            raise SystemExit(
                f"{key} holds {available} sequences of {seq_length} tokens but an evaluation reads "
                f"{num_samples}; prepare more data or evaluate fewer sequences (training.val_samples, or the "
                "blend's samples)"
            )
        self.num_samples = num_samples

    def __len__(self) -> int:
        return self.num_samples

    def _tokens(self, start: int, stop: int) -> np.ndarray:
        pieces = []
        for part, first in zip(self.parts, self.offsets[:-1]):
            lo, hi = max(start - first, 0), min(stop - first, len(part))
            if lo < hi:
                pieces.append(np.asarray(part[lo:hi], dtype=np.int64))
        return np.concatenate(pieces)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        start = index * self.seq_length
        window = torch.from_numpy(self._tokens(start, start + self.seq_length + 1))
        return {
            "tokens": window[:-1],
            "labels": window[1:],
            "loss_mask": torch.ones(self.seq_length, dtype=torch.float32),
            "position_ids": torch.arange(self.seq_length, dtype=torch.int64),
        }


def build_tokenizer(cfg: Config):
    """The configured tokenizer (the one data preparation used), or a stand-in for mock data."""
    train = cfg.training
    vocab = train.model.vocab_size
    if train.data.mock:
        return MockTokenizer(vocab_size=vocab, eod=min(128001, vocab - 1))
    tokenizer = load_tokenizer(train.tokenizer.type, train.tokenizer.path, key="training.tokenizer")
    if tokenizer.vocab_size > vocab:
        raise SystemExit(
            f"training.tokenizer has {tokenizer.vocab_size} tokens but training.model.vocab_size is "
            f"{vocab}; raise the model's vocab_size"
        )
    return tokenizer


def build_datasets(cfg: Config, plan: Plan, tokenizer, build_here: bool, cache_dir: str):
    """Train and validation datasets (None on ranks that do not read data). The validation set is the `split`
    share of the blend, or training.data.valid_blend read in order."""
    train = cfg.training
    data = train.data
    if data.format == DataFormat.sft:
        return build_sft_datasets(cfg, plan, tokenizer) if build_here else (None, None)
    config = GPTDatasetConfig(
        random_seed=cfg.seed,
        sequence_length=plan.seq_length,
        blend=None if data.mock or data.blend is None else blend_of(data.blend),
        split=data.split,
        path_to_cache=cache_dir,
        tokenizer=tokenizer,
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        create_attention_mask=False,  # causal attention is implied by the TE kernels
        mmap_bin_files=True,
    )
    val_samples = eval_samples(train, plan.global_batch_size)
    separate = bool(data.valid_blend) and not data.mock
    sizes = split_sizes(train.train_steps, plan.global_batch_size, train.val_interval, 0 if separate else val_samples)
    cls = MockGPTDataset if data.mock else GPTDataset
    train_ds, valid_ds, _ = BlendedMegatronDatasetBuilder(cls, sizes, lambda: build_here, config).build()
    if separate and build_here and train.val_interval > 0:
        valid_ds = InOrderSequences(list(data.valid_blend or []), plan.seq_length, val_samples)
    return train_ds, valid_ds


def build_sft_datasets(cfg: Config, plan: Plan, tokenizer):
    """Fine-tuning samples (training.data.format=sft): sequences of samples with loss masks, one sample each or
    packed (recipes/trainer/sft.py); the held-out validation part as its evaluations read it."""
    train, data = cfg.training, cfg.training.data
    return sft_datasets(
        blend_of(list(data.blend or []))[0],
        data.valid_blend,
        data.split,
        cfg.seed,
        plan.seq_length,
        data.packing,
        data.truncate,
        int(tokenizer.eod),
        train_sequences=train.train_steps * plan.global_batch_size,
        valid_sequences=eval_samples(train, plan.global_batch_size) if train.val_interval > 0 else 0,
    )


def sample_indices(
    consumed_samples: int, total_samples: int, micro_batch_size: int, dp_rank: int, dp_size: int
) -> Iterator[list[int]]:
    """Megatron's pretraining order: global positions walk the dataset in order; each step of mbs*dp samples
    gives DP rank r the slice [r*mbs, (r+1)*mbs). Starting at consumed_samples resumes the exact order."""
    stride = micro_batch_size * dp_size
    start = consumed_samples - consumed_samples % stride
    for base in range(start, total_samples - stride + 1, stride):
        first = base + dp_rank * micro_batch_size
        yield list(range(first, first + micro_batch_size))


class _IndexBatches(torch.utils.data.Sampler):
    def __init__(self, **kwargs):
        self.kwargs = kwargs

    def __iter__(self):
        return sample_indices(**self.kwargs)

    def __len__(self):
        k = self.kwargs
        return max(0, (k["total_samples"] - k["consumed_samples"]) // (k["micro_batch_size"] * k["dp_size"]))


def _stack_fields(samples: list[dict]) -> torch.Tensor:
    fields = [torch.stack([torch.as_tensor(s[name]) for s in samples]).to(torch.int64) for name in BATCH_FIELDS]
    return torch.stack(fields)  # [4, mbs, seq]


def make_loader(
    dataset, consumed_samples: int, micro_batch_size: int, dp_rank: int, dp_size: int, num_workers: int
) -> Iterator[torch.Tensor]:
    sampler = _IndexBatches(
        consumed_samples=consumed_samples,
        total_samples=len(dataset),
        micro_batch_size=micro_batch_size,
        dp_rank=dp_rank,
        dp_size=dp_size,
    )
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_sampler=sampler,
        num_workers=num_workers,
        collate_fn=_stack_fields,
        pin_memory=True,
        persistent_workers=False,
    )
    with helpers_immune_to_stop_signals():  # the workers start here
        return iter(loader)


def close_loader(loader: Iterator[torch.Tensor] | None) -> None:
    """Shut a loader's worker processes down now, rather than leaving it to the iterator's finalizer. Run by the
    garbage collector (the trainer holds its iterators in reference cycles, and collects only at set steps), that
    finalizer finds the queues' feeder threads already stopped by their own finalizers: the workers never hear
    that the loader is done, and the interpreter's exit then waits for them forever (they block SIGTERM,
    helpers_immune_to_stop_signals, so multiprocessing's terminate() does not end them either)."""
    shutdown = getattr(loader, "_shutdown_workers", None)  # torch's multiprocess iterator (num_workers > 0)
    if shutdown is not None:
        shutdown()


def close_sources(sources) -> None:
    """Close what Trainer._iterators returned: one source, one per model chunk, or None."""
    for source in sources if isinstance(sources, list) else [sources]:
        if source is not None:
            source.close()


class MicrobatchSource:
    """One rank's microbatches. TP rank 0 of a stage that needs data reads them; the other TP ranks receive
    them by broadcast. Every rank of the stage then keeps its context-parallel share of the sequence. Packed
    sequences (`packing`) leave as one THD sequence with their packed_seq_params (recipes/trainer/sft.py)."""

    def __init__(self, loader: Iterator[torch.Tensor] | None, shape: tuple[int, int], packing: bool = False):
        self.loader = loader
        self.shape = shape
        self.packing = packing
        self.tp_group = ps.get_tensor_model_parallel_group()
        self.tp_src = ps.get_tensor_model_parallel_src_rank()
        self.tp_size = ps.get_tensor_model_parallel_world_size()
        self.cp_size = ps.get_context_parallel_world_size()
        self.cp_group = ps.get_context_parallel_group() if self.cp_size > 1 else None

    def __iter__(self):
        return self

    def close(self) -> None:
        close_loader(self.loader)
        self.loader = None

    def __next__(self) -> dict[str, torch.Tensor]:
        if self.loader is not None:
            stacked = next(self.loader).cuda(non_blocking=True)
        else:
            stacked = torch.empty((len(BATCH_FIELDS), *self.shape), dtype=torch.int64, device="cuda")
        if self.tp_size > 1:
            torch.distributed.broadcast(stacked, src=self.tp_src, group=self.tp_group)
        batch = dict(zip(BATCH_FIELDS, stacked.unbind(0)))
        batch["loss_mask"] = batch["loss_mask"].float()
        if self.packing:  # the plan refuses packing with context parallelism
            return packed_microbatch(batch)
        if self.cp_size > 1:
            batch["cu_seqlens"] = None
            batch = get_batch_on_this_cp_rank(batch, is_hybrid_cp=False, cp_group=self.cp_group)
            batch.pop("cu_seqlens", None)
        return batch


class ChunkViews:
    """One rank's microbatches for several of its model chunks: with packed sequences every pipeline stage needs
    the samples' boundaries, so with virtual pipeline stages one rank holds several chunks that read data. Each
    view yields every microbatch once, in order; a microbatch is read when the first view asks for it and kept
    until the others have had it."""

    def __init__(self, source, count: int):
        self.source = source
        self.queues: list[deque] = [deque() for _ in range(count)]

    def views(self) -> list["ChunkView"]:
        return [ChunkView(self, k) for k in range(len(self.queues))]

    def next_for(self, k: int):
        if not self.queues[k]:
            batch = next(self.source)
            for queue in self.queues:
                queue.append(batch)
        return self.queues[k].popleft()

    def close(self) -> None:
        self.source.close()


class ChunkView:
    def __init__(self, shared: ChunkViews, k: int):
        self.shared, self.k = shared, k

    def __iter__(self):
        return self

    def __next__(self):
        return self.shared.next_for(self.k)

    def close(self) -> None:
        self.shared.close()


def dataset_cache_dir(run_dir: str) -> str:
    path = os.path.join(run_dir, "dataset_cache")
    os.makedirs(path, exist_ok=True)
    return path
