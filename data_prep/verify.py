"""Check finished outputs the way training will read them (megatron-core's IndexedDataset)."""

from __future__ import annotations

import os
import warnings

import numpy as np

from data_prep.pipeline import megatron_indexed_dataset, read_marker
from data_prep.shards import LOSS_MASK
from data_prep.shards import Shard


def verify_shard(shard: Shard) -> list[str]:
    """Problems with a shard's outputs (empty when it is sound): done marker, counts, dtype, EOD placement (when
    EOD was appended)."""
    IndexedDataset = megatron_indexed_dataset().IndexedDataset

    prefix = shard.output_prefix
    marker = read_marker(prefix)
    if marker is None:
        return [f"not finished: no valid {os.path.basename(prefix)}.done.json matching the .bin/.idx sizes"]
    try:
        with warnings.catch_warnings():  # megatron warns that it guessed rank 0, outside distributed runs
            warnings.simplefilter("ignore")
            ds = IndexedDataset(prefix, mmap=True)
    except Exception as e:  # a broken .idx raises anything from struct.error to ValueError
        return [f"megatron cannot read it: {type(e).__name__}: {e}"]
    problems = []
    lengths = ds.sequence_lengths.astype(np.int64)
    documents = len(ds.document_indices) - 1
    tokens = int(lengths.sum())
    if documents != marker["documents"] or len(ds) != documents:
        problems.append(f"{documents} documents / {len(ds)} sequences, the summary says {marker['documents']}")
    if tokens != marker["tokens"]:
        problems.append(f"{tokens} tokens, the summary says {marker['tokens']}")
    dtype = ds.index.dtype
    if dtype.__name__ != marker["dtype"]:
        problems.append(f"dtype {dtype.__name__}, the summary says {marker['dtype']}")
    if os.path.getsize(prefix + ".bin") != tokens * np.dtype(dtype).itemsize:
        problems.append(".bin size does not match the token count")
    elif tokens and marker.get("append_eod", True):
        data = np.memmap(prefix + ".bin", dtype=dtype, mode="r")
        ends = np.cumsum(lengths) - 1
        eod = marker["tokenizer"]["eod"]
        wrong = int(np.count_nonzero(data[ends] != eod))
        if wrong:
            problems.append(f"{wrong} documents do not end with the EOD token {eod}")
        del data
    if "loss_mask" in marker:
        problems += _loss_mask_problems(IndexedDataset, prefix, lengths)
    return problems


def _loss_mask_problems(IndexedDataset, prefix: str, lengths: np.ndarray) -> list[str]:
    """Fine-tuning samples: the loss mask must have the tokens' boundaries, and hold only 0 and 1."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mask = IndexedDataset(prefix + LOSS_MASK, mmap=True)
    except Exception as e:
        return [f"megatron cannot read its loss mask: {type(e).__name__}: {e}"]
    if not np.array_equal(mask.sequence_lengths.astype(np.int64), lengths):
        return ["the loss mask's sample lengths differ from the tokens'"]
    values = np.memmap(prefix + LOSS_MASK + ".bin", dtype=mask.index.dtype, mode="r")
    if len(values) and int(values.max()) > 1:
        return ["the loss mask holds values other than 0 and 1"]
    return []
