"""Start a run from Hugging Face Llama weights (`training.checkpoint.init_from_hf`: a directory or a hub id).

Every rank reads only what its model chunks hold, straight from the `*.safetensors` shards with lazy slicing: its
rows of q/k/v (whole KV groups) and of gate/up, its columns of the row-parallel weights, its vocabulary rows,
the norms, for the layers its pipeline (and virtual pipeline) stages hold. What a rank holds comes from
megatron-core itself (the chunks' `sharded_state_dict()`: global tensor, offset and shape of every local
tensor), so every layout megatron can build is covered, the asymmetric pipeline split included. Context- and
data-parallel ranks read the same as their tensor/pipeline peer. A rank's host memory holds one slice at a time.
LoRA adapters (peft=lora) are no Llama weights: they keep their initialisation.

A hub id is downloaded once, by rank 0, into the Hugging Face cache (HF_TOKEN for gated models) while the other
ranks wait; compute nodes without internet use a directory fetched beforehand:

    python -m recipes.hf.importer fetch meta-llama/Llama-3.1-8B --local-dir /shared/models/Llama-3.1-8B
"""

from __future__ import annotations

if __name__ == "__main__":  # python -m recipes.hf.importer fetch ...: the hub's command, which needs no torch
    import sys

    from recipes.hf import hub

    sys.exit(hub.main())

import json
import os
from pathlib import Path
import sys
import time
from typing import Callable

from megatron.core.dist_checkpointing.dict_utils import dict_list_map_inplace, merge, nested_values
from megatron.core.dist_checkpointing.mapping import ShardedObject, ShardedTensor, apply_factory_merges
from megatron.core.dist_checkpointing.state_dict_utils import load_preprocess
from megatron.core.dist_checkpointing.utils import force_all_tensors_to_non_fp8
from safetensors import SafetensorError, safe_open
import torch
from tqdm import tqdm

from common import hf_config
from common.checkpoints import latest_checkpoint
from common.config import Config, LoraConfig, ModelConfig
from common.files import atomic_write
from common.hf_config import KEY, HFConfigError
from common.safetensors_io import SafetensorsFileError, SafetensorsFiles
from recipes.hf import hub, mapping
from recipes.peft.lora import is_adapter_key
from recipes.runtime.distributed import unwrap

READ_BLOCK_BYTES = 64 * 2**20
_MARKER = ".init_from_hf.json"  # in the run directory: where rank 0 found (or downloaded) a hub id


# A Hugging Face checkpoint that cannot be read; str() is one line naming the file and the fix. One error for the
# plan's look at the files on the host (common/safetensors_io.py) and for what the ranks find.
SourceError = SafetensorsFileError


# --------------------------------------------------------------------------- the safetensors files
class SafetensorsDir(SafetensorsFiles):
    """A Hugging Face model directory: which file holds each tensor, and slices of tensors read lazily."""

    def dtype(self, name: str):
        kinds = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
        kind = self.entry(name)["dtype"]
        if kind not in kinds:
            raise SourceError(f"{self.directory}: {name} is {kind}; only BF16, F16 and F32 weights are read")
        return kinds[kind]

    def read(self, name: str, rows: slice, cols: slice | None):
        """Rows (and columns) of one tensor, read from its shard without loading the rest of it."""
        self.entry(name)  # validates the file (complete) before safetensors maps it
        path = self.directory / self.weight_map[name]
        try:
            with safe_open(str(path), framework="pt") as f:  # closed at once: no mapped pages linger
                part = f.get_slice(name)
                return part[rows] if cols is None else part[rows, cols]
        except SafetensorError as err:
            raise SourceError(f"{path}: {err}; download it again") from None


def read_region(
    src: SafetensorsDir,
    name: str,
    layer: int | None,
    model: ModelConfig,
    padded_vocab: int,
    start: list[int],
    size: list[int],
):
    """The block [start, start + size) of megatron's global tensor `name` (one layer of it), from Hugging Face
    tensors: a TP shard of q/k/v or gate/up gathers its rows from several of them. Read in row blocks of at most
    READ_BLOCK_BYTES into one preallocated tensor, so a rank's host memory holds its slice and one block."""
    cols = slice(start[1], start[1] + size[1]) if len(size) == 2 else None
    first, last = start[0], start[0] + size[0]
    out = None
    row = 0
    for piece in mapping.pieces(name, layer, model, padded_vocab):
        lo, hi = max(first, row), min(last, row + piece.rows)
        if lo < hi:
            if out is None:
                out = torch.empty(size, dtype=src.dtype(piece.hf_name))
            target = out[lo - first : hi - first]
            if piece.repeat:
                target.copy_(src.read(piece.hf_name, slice(piece.start, piece.start + 1), cols).expand_as(target))
            else:
                step = max(1, READ_BLOCK_BYTES // max(1, target[0].numel() * target.element_size()))
                for begin in range(0, hi - lo, step):
                    rows = min(step, hi - lo - begin)
                    first_row = piece.start + lo - row + begin
                    target[begin : begin + rows].copy_(
                        src.read(piece.hf_name, slice(first_row, first_row + rows), cols)
                    )
        row += piece.rows
    if out is None or row < last:
        raise SourceError(f"{name}: rows {first}-{last} requested, training.model gives {row}")
    return out


def read_sharded_tensor(src: SafetensorsDir, sh_ten, model: ModelConfig, padded_vocab: int):
    """The local data of one of megatron's ShardedTensors, from the Hugging Face files."""
    name, layer = mapping.global_key(sh_ten.key)
    start, size = list(sh_ten.global_offset), list(sh_ten.local_shape)
    if sh_ten.prepend_axis_num:  # layers stacked along a leading axis: the offset there is the layer
        layer = start[0]
        start = start[sh_ten.prepend_axis_num :]
    try:
        tensor = read_region(src, name, layer, model, padded_vocab, start, size)
    except KeyError:
        raise SourceError(f"the model has a tensor {sh_ten.key} that a Llama checkpoint does not hold") from None
    return tensor.to(sh_ten.dtype)


def load_hf_weights(
    directory: str, chunks, model: ModelConfig, padded_vocab: int, say: Callable[[str], None], show_progress: bool
) -> None:
    """Fill this rank's model chunks from a Hugging Face directory: what dist_checkpointing.load does with a
    checkpoint of its own, with the Hugging Face files as the storage."""
    src = SafetensorsDir(directory)
    src.check(mapping.hf_shapes(model))
    say(f"initialising weights from Hugging Face {directory}")
    prepared = []
    for chunk in chunks:
        sharded = unwrap(chunk).sharded_state_dict()
        force_all_tensors_to_non_fp8(sharded)  # FP8 parameters: load the high-precision values
        prepared.append(load_preprocess(sharded))
    local = [t for sharded, _, _ in prepared for t in _sharded_tensors(sharded) if not is_adapter_key(t.key)]
    count = len(local)
    bar = tqdm(
        total=sum(t.data.numel() * t.data.element_size() for t in local),
        unit="B",
        unit_scale=True,
        desc="init_from_hf",
        disable=not show_progress,
        mininterval=2.0,
    )
    del local
    done = 0

    def fill(value):
        nonlocal done
        if isinstance(value, ShardedTensor) and not is_adapter_key(value.key):
            tensor = read_sharded_tensor(src, value, model, padded_vocab).to(value.data.device)
            done += 1
            bar.update(tensor.numel() * tensor.element_size())
            bar.set_postfix_str(f"{done}/{count} tensors", refresh=False)
            return tensor
        if isinstance(value, (ShardedObject, ShardedTensor)):  # TE's extra state, adapters: keep the built ones
            return value.data
        return value

    for chunk, (sharded, nonpersistent, factories) in zip(chunks, prepared):
        dict_list_map_inplace(fill, sharded)
        merge(sharded, nonpersistent)
        unwrap(chunk).load_state_dict(apply_factory_merges(sharded, factories))
    bar.close()


def _sharded_tensors(sharded):
    return [x for x in nested_values(sharded) if isinstance(x, ShardedTensor)]


# --------------------------------------------------------------------------- where the weights are, per rank
def download(repo_id: str, local_dir: str | None = None) -> str:
    """A hub id's weights, configs and tokenizer, into the Hugging Face cache (or `local_dir`)."""
    try:
        return hub.download(
            repo_id,
            local_dir,
            hub.MODEL_FILES,
            what=f"{KEY}={repo_id}",
            offline_fix=f"fetch it where the hub is reachable (python -m recipes.hf.importer fetch "
            f"{repo_id} --local-dir DIR), into a directory every node sees, and set "
            f"{KEY}=DIR",
        )
    except hub.HubError as err:
        raise SourceError(str(err)) from None


def _wait_for_marker(marker: Path, repo_id: str, poll_s: float = 2.0) -> str:
    """Rank 0 writes the marker when its download is done; the other ranks wait for it (a failed download ends
    the job through the launcher, which stops every rank)."""
    waited = 0.0
    while True:
        try:
            record = json.loads(marker.read_text())
            if record.get("source") == repo_id:
                return record["path"]
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(poll_s)
        waited += poll_s
        if waited % 300 < poll_s:
            print(f"[recipes] waiting for rank 0 to download {repo_id} ({waited:.0f} s)", flush=True)


def locate(value: str, run_dir: str, rank: int) -> str:
    """The directory of `init_from_hf` on this rank. A hub id: rank 0 downloads it (nothing to do when cached)
    and tells the others where it is through a file in the run directory."""
    if not hf_config.is_hub_id(value):
        local = Path(value).expanduser()
        if not local.is_dir():
            raise SourceError(
                f"{KEY}={value} is not a directory on this node (rank {rank}): put it on a filesystem every node sees"
            )
        return str(local)
    marker = Path(run_dir) / _MARKER
    if rank == 0:
        path = download(value)
        atomic_write(marker, json.dumps({"source": value, "path": path}))
        return path
    path = _wait_for_marker(marker, value)
    if not Path(path, "config.json").is_file():
        raise SourceError(
            f"rank {rank} cannot see {path}, where rank 0 downloaded {value}: set HF_HOME to a "
            "shared filesystem, or fetch it first (python -m recipes.hf.importer fetch "
            f"{value} --local-dir DIR) and set {KEY}=DIR"
        )
    return path


def source_for_run(cfg: Config, run_dir: str, rank: int) -> str | None:
    """The checked Hugging Face directory this run starts from, or None (not configured, or a full run resuming
    from a checkpoint of its own). A LoRA run's checkpoints hold its adapters only, so it reads its base on every
    start, resumes included. Runs on every rank before any GPU work; a problem ends the process with one line
    (printed by rank 0, or by the rank that alone has it)."""
    ckpt = cfg.training.checkpoint
    value = ckpt.init_from_hf
    resumes = ckpt.load and latest_checkpoint(os.path.join(run_dir, "checkpoints"))
    if not value or (resumes and not isinstance(cfg.peft, LoraConfig)):
        return None
    try:
        path = locate(str(value), run_dir, rank)
    except SourceError as err:
        raise SystemExit(f"error: {err}") from None
    try:
        hf_config.check_directory(path, cfg.training.model, source=str(value))
    except HFConfigError as err:
        raise SystemExit(f"error: {err}" if rank == 0 else 2) from None
    return path
