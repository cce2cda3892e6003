"""Fine-tuning data on the trainer side: samples with loss masks (data_prep's sft_jsonl and govreport_mlperf
outputs) into sequences of seq_length tokens. Numpy and torch only, so a batch is built and tested on a CPU;
megatron-core is imported only for its packed-sequence parameters.

- A sample of L tokens x with loss mask m (1 where a token is a target) takes L positions: inputs x, labels
  x[1:] then padding, loss mask m[1:] then 0. Its last position predicts nothing, so a sample of seq_length tokens
  fits a sequence of seq_length (as MLPerf's 8192-token GovReport rows fit 8192).
- Packing (training.data.packing=true) puts consecutive samples, in the seed's order, into a sequence while they
  fit; position ids restart at 0 for each, and cu_seqlens (the sample boundaries, the padding at the end as one
  more segment) tell the attention that each sample sees only itself (megatron-core's THD layout). Without
  packing each sequence holds one sample, padded.
- Padding is the EOD id with loss mask 0 and never counts.
- Samples longer than seq_length are cut to their first seq_length tokens (training.data.truncate=true) or
  refused in one line naming the sample (false; the plan refuses them before anything is submitted).
- The held-out validation part is the `split` validation share of the samples after the seed's shuffle, or every
  sample of training.data.valid_blend in order. Training walks the training part epoch after epoch, each epoch in
  its own seeded order.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np
import torch

from data_prep.checks import INDEX_DTYPES, INDEX_HEADER
from data_prep.shards import LOSS_MASK

# The arrays of one sequence; cu_seqlens varies in length with the number of samples in it.
SEQUENCE_FIELDS = ("tokens", "labels", "loss_mask", "position_ids")


class SftDataError(SystemExit):
    """A fine-tuning data problem the trainer cannot go on with; its message is one line."""


# -- reading prepared samples --------------------------------------------------------------------------------


def _read_index(prefix: str) -> tuple[np.dtype, np.ndarray, np.ndarray]:
    """(token dtype, sequence lengths, byte offsets) of megatron's `<prefix>.idx`, with numpy alone."""
    with open(prefix + ".idx", "rb") as f:
        _, _, code, sequences, _ = INDEX_HEADER.unpack(f.read(INDEX_HEADER.size))
        lengths = np.frombuffer(f.read(4 * sequences), dtype="<i4").astype(np.int64)
        pointers = np.frombuffer(f.read(8 * sequences), dtype="<i8").copy()
    return np.dtype(INDEX_DTYPES[code][0]), lengths, pointers


class SftSamples:
    """Every sample of the prefixes in order: tokens and loss mask (`<prefix>.{bin,idx}` and
    `<prefix>.loss_mask.{bin,idx}`, one sequence per sample with the same lengths)."""

    def __init__(self, prefixes: Sequence[str], key: str = "training.data.blend"):
        self.prefixes = list(prefixes)
        self._tokens: list[tuple[np.memmap, np.ndarray]] = []
        self._masks: list[tuple[np.memmap, np.ndarray]] = []
        lengths = []
        for prefix in self.prefixes:
            dtype, n, pointers = _read_index(prefix)
            try:
                mask_dtype, mask_n, mask_pointers = _read_index(prefix + LOSS_MASK)
            except FileNotFoundError:
                raise SftDataError(
                    f"{key}: {prefix} has no loss mask ({prefix}{LOSS_MASK}.idx): it is not fine-tuning data "
                    "(data_preparation=sft_jsonl or govreport_mlperf), or set training.data.format=pretrain"
                ) from None
            if not np.array_equal(n, mask_n):
                raise SftDataError(f"{key}: {prefix}: its loss mask has other sample boundaries than its tokens")
            self._tokens.append((np.memmap(prefix + ".bin", dtype=dtype, mode="r"), pointers // dtype.itemsize))
            self._masks.append((np.memmap(prefix + LOSS_MASK + ".bin", dtype=mask_dtype, mode="r"), mask_pointers))
            lengths.append(n)
        self.lengths = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
        counts = [len(n) for n in lengths]
        self._part = np.repeat(np.arange(len(counts)), counts)
        self._first = np.cumsum([0] + counts)[:-1]

    def __len__(self) -> int:
        return len(self.lengths)

    def where(self, index: int) -> str:
        part = int(self._part[index])
        return f"sample {index - int(self._first[part])} of {self.prefixes[part]}"

    def sample(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Sample `index`'s tokens (int64) and loss mask (uint8)."""
        part = int(self._part[index])
        local = index - int(self._first[part])
        n = int(self.lengths[index])
        data, starts = self._tokens[part]
        mask, mask_starts = self._masks[part]
        start, mask_start = int(starts[local]), int(mask_starts[local])
        return np.asarray(data[start : start + n], np.int64), np.asarray(mask[mask_start : mask_start + n], np.uint8)


def fitted_lengths(samples: SftSamples, seq_length: int, truncate: bool) -> np.ndarray:
    """Each sample's length in a sequence: cut to seq_length, or SftDataError naming the first longer one."""
    longer = np.flatnonzero(samples.lengths > seq_length)
    if len(longer) and not truncate:
        first = int(longer[0])
        raise SftDataError(
            f"training.data.truncate=false: {samples.where(first)} has {int(samples.lengths[first]):,} tokens, more "
            f"than training.seq_length={seq_length}; set training.data.truncate=true to cut such samples"
        )
    return np.minimum(samples.lengths, seq_length)


# -- order, split, packing -----------------------------------------------------------------------------------


def split_samples(count: int, split: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(training, validation) sample indices: the seed's shuffle of all samples cut by the train,validation
    shares of `split` ("train,validation,test"). The same seed gives the same parts."""
    shares = np.array([float(s) for s in split.split(",")], dtype=np.float64)
    bounds = np.round(np.cumsum(shares) / shares.sum() * count).astype(np.int64)
    order = np.random.default_rng(seed).permutation(count)
    return order[: bounds[0]], order[bounds[0] : bounds[1]]


def pack(order: np.ndarray, lengths: np.ndarray, seq_length: int, packing: bool) -> list[np.ndarray]:
    """Sample indices per sequence, in `order`: consecutive samples while they fit (packing), or one each."""
    if not packing:
        return [np.array([i]) for i in order]
    sequences: list[np.ndarray] = []
    current: list[int] = []
    used = 0
    for index in order.tolist():
        n = int(lengths[index])
        if current and used + n > seq_length:
            sequences.append(np.array(current))
            current, used = [], 0
        current.append(index)
        used += n
    if current:
        sequences.append(np.array(current))
    return sequences


def epochs(part: np.ndarray, seed: int, needed: int, lengths: np.ndarray, seq_length: int, packing: bool):
    """Sequences of the training part, epoch after epoch (epoch e shuffled by (seed, e)) until `needed`."""
    sequences: list[np.ndarray] = []
    epoch = 0
    while len(sequences) < needed:
        order = part if epoch == 0 else np.random.default_rng([seed, epoch]).permutation(part)
        sequences += pack(order, lengths, seq_length, packing)
        epoch += 1
        if not len(part):
            break
    return sequences[:needed]


# -- one sequence ----------------------------------------------------------------------------------------------


def build_sequence(samples: Sequence[tuple[np.ndarray, np.ndarray]], seq_length: int, pad_id: int) -> dict:
    """One sequence of `samples` (tokens, loss mask), each at most seq_length tokens together: the four
    per-token fields, cu_seqlens (int32: each sample's start, then the padding's when there is padding, then
    seq_length) and max_seqlen (the longest segment)."""
    total = sum(len(ids) for ids, _ in samples)
    if total > seq_length:
        raise ValueError(f"samples of {total} tokens do not fit a sequence of {seq_length}")
    tokens = np.full(seq_length, pad_id, np.int64)
    labels = np.full(seq_length, pad_id, np.int64)
    loss_mask = np.zeros(seq_length, np.float32)
    positions = np.zeros(seq_length, np.int64)
    bounds = [0]
    for ids, mask in samples:
        start, n = bounds[-1], len(ids)
        end = start + n
        tokens[start:end] = ids
        labels[start : end - 1] = ids[1:]
        loss_mask[start : end - 1] = mask[1:]
        positions[start:end] = np.arange(n)
        bounds.append(end)
    if bounds[-1] < seq_length:  # the padding: its own segment, so the attention's total is the sequence
        positions[bounds[-1] :] = np.arange(seq_length - bounds[-1])
        bounds.append(seq_length)
    cu_seqlens = np.asarray(bounds, np.int32)
    return {
        "tokens": tokens,
        "labels": labels,
        "loss_mask": loss_mask,
        "position_ids": positions,
        "cu_seqlens": cu_seqlens,
        "max_seqlen": int(np.diff(cu_seqlens).max()),
    }


class SftSequences(torch.utils.data.Dataset):
    """Sequences of fine-tuning samples as the trainer's loader reads them: item i is sequence i of the plan
    (sample indices per sequence), built from the samples on demand."""

    def __init__(self, samples: SftSamples, sequences: list[np.ndarray], seq_length: int, pad_id: int):
        self.samples = samples
        self.sequences = sequences
        self.seq_length = seq_length
        self.pad_id = pad_id

    def __len__(self) -> int:
        return len(self.sequences)

    def __getitem__(self, index: int) -> dict[str, Any]:
        picked = []
        for i in self.sequences[index].tolist():
            ids, mask = self.samples.sample(i)
            picked.append((ids[: self.seq_length], mask[: self.seq_length]))
        built = build_sequence(picked, self.seq_length, self.pad_id)
        return {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in built.items()}


def sft_datasets(
    blend: Sequence[str],
    valid_blend: Optional[Sequence[str]],
    split: str,
    seed: int,
    seq_length: int,
    packing: bool,
    truncate: bool,
    pad_id: int,
    train_sequences: int,
    valid_sequences: int,
) -> tuple[SftSequences, Optional[SftSequences]]:
    """Training sequences (train_sequences of them, epochs repeating) and validation sequences (at most
    valid_sequences, the held-out part once; None when there is none)."""
    samples = SftSamples(blend)
    lengths = fitted_lengths(samples, seq_length, truncate)
    if valid_blend:
        train_part, _ = split_samples(len(samples), "1,0,0", seed)
        valid_samples = SftSamples(valid_blend, key="training.data.valid_blend")
        valid_order = np.arange(len(valid_samples))
    else:
        train_part, valid_order = split_samples(len(samples), split, seed)
        valid_samples = samples
    if not len(train_part):
        raise SftDataError(f"training.data.split={split!r} leaves no training samples of {len(samples)}")
    train_plan = epochs(train_part, seed, train_sequences, lengths, seq_length, packing)
    train = SftSequences(samples, train_plan, seq_length, pad_id)
    if not len(valid_order) or valid_sequences <= 0:
        return train, None
    valid_lengths = fitted_lengths(valid_samples, seq_length, truncate)
    valid_plan = pack(valid_order, valid_lengths, seq_length, packing)
    if len(valid_plan) < valid_sequences:  # every evaluation reads the same valid_sequences sequences
        raise SftDataError(
            f"the held-out samples make {len(valid_plan)} validation sequences but an evaluation reads "
            f"{valid_sequences} (training.val_samples or val_steps); hold out more (training.data.split, or "
            "training.data.valid_blend) or evaluate fewer"
        )
    valid_plan = valid_plan[:valid_sequences]
    return train, SftSequences(valid_samples, valid_plan, seq_length, pad_id)


# -- batches ---------------------------------------------------------------------------------------------------


def collate_packed(items: list[dict[str, Any]]) -> dict[str, Any]:
    """A microbatch of packed sequences: the per-token fields stacked [mbs, seq], and cu_seqlens over the
    microbatch flattened to one THD sequence of mbs * seq tokens (sequence k's boundaries offset by k * seq),
    with the longest segment. The trainer derives the same boundaries from the position ids (boundaries_of)."""
    batch: dict[str, Any] = {k: torch.stack([item[k] for item in items]) for k in SEQUENCE_FIELDS}
    seq = batch["tokens"].shape[1]
    bounds = [items[0]["cu_seqlens"][:1]] + [item["cu_seqlens"][1:] + k * seq for k, item in enumerate(items)]
    batch["cu_seqlens"] = torch.cat(bounds).to(torch.int32)
    batch["max_seqlen"] = max(int(item["max_seqlen"]) for item in items)
    return batch


def boundaries_of(position_ids: torch.Tensor) -> torch.Tensor:
    """cu_seqlens (int32) of a microbatch flattened to one THD sequence, from its position ids alone: every
    segment (a sample, or the padding at the end of a sequence) starts at position 0, so the starts are where
    the flattened position ids are 0, and the total closes the list. collate_packed computes the same from the
    items; the trainer derives it here, where the position ids are already on every rank of the TP group."""
    flat = position_ids.reshape(-1)
    starts = torch.nonzero(flat == 0).reshape(-1)
    total = torch.full((1,), flat.numel(), dtype=starts.dtype, device=flat.device)
    return torch.cat([starts, total]).to(torch.int32)


def packed_microbatch(batch: dict[str, Any]) -> dict[str, Any]:
    """A microbatch of packed sequences ([mbs, seq] per field) as the model takes it: each field flattened to
    [1, mbs * seq] (megatron-core's THD layout has one sequence per microbatch; the samples' boundaries are in
    cu_seqlens) and `packed_seq_params` with them. max_seqlen is the longest segment, read back once per
    microbatch: the attention kernels size their work by it, and megatron-core's unfused RoPE for THD reads
    frequencies as large as the whole microbatch as positions that run on across samples."""
    cu_seqlens = boundaries_of(batch["position_ids"])
    max_seqlen = int((cu_seqlens[1:] - cu_seqlens[:-1]).max().item())
    packed = {key: value.reshape(1, -1) for key, value in batch.items()}
    packed["packed_seq_params"] = packed_seq_params(cu_seqlens, max_seqlen)
    return packed


def packed_seq_params(cu_seqlens: torch.Tensor, max_seqlen: int):
    """megatron-core's PackedSeqParams for the THD layout (self-attention: the same boundaries for queries and
    keys). The samples lie back to back with no padding between them (the padding at the end is a segment of
    its own), so the padded boundaries are the boundaries. Imported here only: building batches needs no
    megatron."""
    from megatron.core.packed_seq_params import PackedSeqParams

    return PackedSeqParams(
        qkv_format="thd",
        cu_seqlens_q=cu_seqlens,
        cu_seqlens_kv=cu_seqlens,
        cu_seqlens_q_padded=cu_seqlens,
        cu_seqlens_kv_padded=cu_seqlens,
        max_seqlen_q=max_seqlen,
        max_seqlen_kv=max_seqlen,
        pad_between_seqs=False,
    )
