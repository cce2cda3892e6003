"""Two things every room does with the job's ranks and model: agree on a flag (any_rank, a collective) and reach the
GPTModel inside its data-parallel wrapper (unwrap)."""

from __future__ import annotations

import torch


def any_rank(flag: bool) -> bool:
    """True on every rank when `flag` is true on at least one: how ranks agree to stop together."""
    tensor = torch.tensor([int(flag)], dtype=torch.int32, device="cuda")
    torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX)
    return bool(tensor.item())


def unwrap(chunk):
    """The GPTModel inside a DDP wrapper (or the model itself)."""
    return getattr(chunk, "module", chunk)
