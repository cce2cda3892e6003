"""A checkpoint of this recipe as Hugging Face `LlamaForCausalLM` files: what `python -m recipes.hf.exporter`
(recipes/hf/exporter.py, the command line) runs.

It reads the dist_checkpointing checkpoint of any parallel layout directly (sharded tensors are stored with their
global shapes and offsets), one megatron tensor (one layer of it) at a time, in one process without
torch.distributed and without a GPU, and streams each Hugging Face tensor into its shard: host memory stays near
twice the largest tensor. Shards are written under a temporary name and renamed when complete; running the same
command again after an interruption keeps the finished shards.

A LoRA run's checkpoint (adapters only, with the record of its base: common/checkpoints.py's BASE_FILE) exports in
two forms: merged (its base, from the recorded Hugging Face directory or checkpoint, with alpha / r * B A of each
projection added to the projection's weight, as PEFT's merge_and_unload does) through the same shards, or with
`peft=True` as a Hugging Face PEFT adapter directory (adapter_config.json and adapter_model.safetensors) that
`peft.PeftModel.from_pretrained` loads on that base."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
import shutil
from typing import Any, Mapping

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadPlan
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list
from tqdm import tqdm

from common import hf_config
from common.checkpoints import (
    BASE_FILE,
    STATE_FILE,
    BaseRecord,
    fingerprint,
    latest_checkpoint,
    read_base_record,
)
from common.config import Config, LoraConfig, LoraTarget, ModelConfig
from common.files import atomic_output, atomic_write
from common.run import CONFIG_FILE, RunDirError, load_run_config
from common.safetensors_io import DTYPE_CODES, INDEX_FILE, encode_header
from recipes.hf import hub, mapping
from recipes.peft import hf as peft_hf

MANIFEST = ".export.json"
PEFT_CONFIG, PEFT_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model")
_ITEMSIZE = {"bfloat16": 2, "float16": 2, "float32": 4}


class ExportError(ValueError):
    """A checkpoint or destination that cannot be exported; str() is one line naming the path and the fix."""


# --------------------------------------------------------------------------- reading the checkpoint
def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """An `iter_NNNNNNN` directory, or a run directory / its checkpoints/ (then the newest complete one)."""
    path = Path(path).expanduser().absolute()
    if path.is_dir() and not (path / STATE_FILE).exists() and not (path / ".metadata").exists():
        root = path / "checkpoints" if (path / "checkpoints").is_dir() else path  # a run directory, or its checkpoints/
        latest = latest_checkpoint(str(root))
        if latest:
            return Path(latest[1])
        if not path.name.startswith(("iter_", ".partial_")):
            raise ExportError(f"no complete checkpoint under {root} (train first, or name an iter_NNNNNNN directory)")
    if not path.is_dir():
        raise ExportError(f"--checkpoint {path} does not exist")
    if not (path / STATE_FILE).is_file():
        raise ExportError(
            f"--checkpoint {path} is not a complete checkpoint (no {STATE_FILE}: its save did not "
            "finish); export an iter_NNNNNNN directory that training completed"
        )
    if not (path / ".metadata").is_file():
        raise ExportError(
            f"--checkpoint {path} has no .metadata: its files are incomplete or it is not a torch_dist checkpoint"
        )
    return path


class DistCheckpoint:
    """Tensors of a megatron torch_dist checkpoint (PyTorch DCP files), read region by region in this process."""

    def __init__(self, path: Path):
        self.path = path
        backend = self._backend()
        if backend != "torch_dist":
            raise ExportError(f"{path} is a {backend} checkpoint; only torch_dist (this recipe's format) is read")
        self.reader = FileSystemReader(str(path))
        try:
            self.metadata = self.reader.read_metadata()
        except Exception as err:  # a truncated or foreign pickle
            raise ExportError(f"{path / '.metadata'} cannot be read ({err}); the checkpoint is incomplete") from None
        self.reader.set_up_storage_reader(self.metadata, True)
        self.tensors = {
            k: v for k, v in self.metadata.state_dict_metadata.items() if isinstance(v, TensorStorageMetadata)
        }

    def _backend(self) -> str:
        try:
            return json.loads((self.path / "metadata.json").read_text()).get("sharded_backend", "unknown")
        except (OSError, ValueError):
            return "torch_dist"  # older checkpoints without metadata.json

    def locate(self, name: str, layer: int | None) -> tuple[str, list[int], list[int]]:
        """(key, offsets, sizes) of `name` (one layer of it) in the checkpoint."""
        if layer is None:
            if name not in self.tensors:
                raise ExportError(f"{self.path} has no tensor {name}; is it a checkpoint of this recipe's model?")
            size = list(self.tensors[name].size)
            return name, [0] * len(size), size
        numbered = f"{mapping.LAYER_PREFIX}{layer}.{mapping.layer_suffix(name)}"
        if numbered in self.tensors:  # non-homogeneous layout: one key per layer
            size = list(self.tensors[numbered].size)
            return numbered, [0] * len(size), size
        if name not in self.tensors:
            raise ExportError(f"{self.path} has no tensor {name}; is it a checkpoint of this recipe's model?")
        size = list(self.tensors[name].size)
        if layer >= size[0]:
            raise ExportError(f"{self.path}: {name} holds {size[0]} layers, the model config says more")
        return name, [layer] + [0] * (len(size) - 1), [1] + size[1:]

    def check_files(self, keys: set[str]) -> None:
        """Every data file holding `keys` exists and is as long as the metadata says (else: truncated copy)."""
        needed: dict[str, int] = {}
        for index, info in self.metadata.storage_data.items():
            if index.fqn in keys:
                needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
        for relative, length in sorted(needed.items()):
            file = self.path / relative
            if not file.is_file():
                raise ExportError(f"{file} is missing: the checkpoint is incomplete")
            if file.stat().st_size < length:
                raise ExportError(
                    f"{file} is truncated ({file.stat().st_size:,} of {length:,} bytes): the "
                    "checkpoint is incomplete or was copied partially"
                )

    def read(self, name: str, layer: int | None):
        """The whole tensor `name` (one layer of it), assembled from every rank's shard that overlaps it."""
        key, offsets, sizes = self.locate(name, layer)
        meta = self.tensors[key]
        out = torch.empty(sizes, dtype=meta.properties.dtype)
        wanted = ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=torch.Size(sizes))
        items = create_read_items_for_chunk_list(key, meta, [wanted])
        covered = sum(int(torch.Size(item.lengths).numel()) for item in items)
        if covered != out.numel():
            raise ExportError(
                f"{self.path}: the shards of {key} cover {covered:,} of {out.numel():,} elements; "
                "the checkpoint is incomplete"
            )
        self.reader.read_data(LoadPlan(items), _Into(out)).wait()
        return out[0] if layer is not None and key == name else out


class _Into:
    """The two calls of a DCP load planner that FileSystemReader.read_data makes: where each read goes."""

    def __init__(self, out):
        self.out = out

    def resolve_tensor(self, item):
        view = self.out
        for dim, (start, length) in enumerate(zip(item.dest_offsets, item.lengths)):
            view = view.narrow(dim, start, length)
        return view

    def commit_tensor(self, item, tensor) -> None:
        pass

    def load_bytes(self, item, value) -> None:
        raise ExportError(f"{item.storage_index.fqn} is stored as bytes, not as a tensor")


# --------------------------------------------------------------------------- writing safetensors
def shard_plan(shapes: Mapping[str, tuple[int, ...]], itemsize: int, max_bytes: int) -> list[list[str]]:
    """Tensors, in order, grouped into shards of at most max_bytes (a bigger tensor gets a shard of its own)."""
    shards: list[list[str]] = [[]]
    size = 0
    for name, shape in shapes.items():
        nbytes = itemsize * math.prod(shape)
        if shards[-1] and size + nbytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    return shards


def shard_name(index: int, count: int) -> str:
    return f"model-{index + 1:05d}-of-{count:05d}.safetensors"


# --------------------------------------------------------------------------- the export
class HFTensors:
    """Hugging Face tensors one at a time from the checkpoint; the megatron tensor they come from is kept until
    its last Hugging Face tensor was taken (q, k, v from one linear_qkv read)."""

    def __init__(self, ckpt: DistCheckpoint, model: ModelConfig):
        self.ckpt, self.model = ckpt, model
        self.path = ckpt.path
        self.source: dict[str, tuple[str, int | None]] = {}
        for name, layer in mapping.global_names(model):
            for piece in mapping.pieces(name, layer, model, model.vocab_size):
                self.source[piece.hf_name] = (name, layer)
        self._cached: tuple[tuple[str, int | None], dict[str, Any]] | None = None

    def checkpoint_keys(self) -> set[str]:
        return {self.ckpt.locate(name, layer)[0] for name, layer in set(self.source.values())}

    def get(self, hf_name: str):
        where = self.source[hf_name]
        if self._cached is None or self._cached[0] != where:
            self._cached = None  # free the previous megatron tensor before reading the next
            tensor = self.ckpt.read(*where)
            self._cached = (where, mapping.split_to_hf(where[0], where[1], tensor, self.model))
        return self._cached[1][hf_name]


class SafetensorsTensors:
    """Hugging Face tensors one at a time from a Hugging Face directory (a LoRA run's base)."""

    def __init__(self, directory: Path):
        from common.safetensors_io import SafetensorsFiles, SafetensorsFileError

        self.path = directory
        try:
            self.files = SafetensorsFiles(directory)
        except SafetensorsFileError as err:
            raise ExportError(str(err)) from None

    def get(self, hf_name: str):
        from safetensors import safe_open

        if hf_name not in self.files.weight_map:
            raise ExportError(f"{self.path} has no tensor {hf_name}: is it the base of this run?")
        with safe_open(str(self.path / self.files.weight_map[hf_name]), framework="pt") as f:
            return f.get_tensor(hf_name)


class MergedTensors:
    """The base's Hugging Face tensors with each adapted projection's alpha / r * B A added (in fp32)."""

    def __init__(self, base: Any, adapters: dict[str, torch.Tensor], lora: LoraConfig):
        self.base, self.path = base, base.path
        self.scale = lora.alpha / lora.rank
        self.adapters = adapters  # PEFT's names (recipes/peft/hf.py)

    def get(self, hf_name: str):
        tensor = self.base.get(hf_name)
        module = peft_hf.PEFT_PREFIX + hf_name.removesuffix(".weight")
        a = self.adapters.get(f"{module}.lora_A.weight")
        if a is None:
            return tensor
        b = self.adapters[f"{module}.lora_B.weight"]
        return tensor.float() + self.scale * (b.float() @ a.float())


def read_adapters(ckpt: DistCheckpoint, model: ModelConfig, lora: LoraConfig) -> dict[str, torch.Tensor]:
    """Every adapter of a LoRA checkpoint, whole, under PEFT's names."""
    out: dict[str, torch.Tensor] = {}
    for target in lora.target_modules:
        a_name, b_name = peft_hf.adapter_names(LoraTarget(target))
        for layer in range(model.num_layers):
            a, b = ckpt.read(a_name, layer), ckpt.read(b_name, layer)
            out.update(peft_hf.to_peft(LoraTarget(target), layer, a, b, model))
    return out


def lora_base(path: Path, run_config: Config, base: str | None) -> tuple[BaseRecord, Any]:
    """The base a LoRA checkpoint was trained on (or `base`, in its place), checked against its record, as a
    source of Hugging Face tensors."""
    record = read_base_record(str(path))
    assert record is not None
    where = Path(base or record.path).expanduser().absolute()
    if not where.exists():
        raise ExportError(
            f"the base of {path}, {where} ({record.key}), does not exist: pass --base DIR where it is now"
        )
    if fingerprint(str(where)) != record.fingerprint:
        raise ExportError(
            f"{where} is not the base {path} was trained on (its files' fingerprint differs from {BASE_FILE}'s): "
            "pass --base with the base the run started from"
        )
    if record.key == "training.checkpoint.init_from":
        return record, HFTensors(DistCheckpoint(resolve_checkpoint(where)), run_config.training.model)
    return record, SafetensorsTensors(where)


def is_lora_checkpoint(path: Path) -> bool:
    return (path / BASE_FILE).is_file()


def export_peft(checkpoint: str | os.PathLike, out: str | os.PathLike, *, run_config: Config) -> Path:
    """Write the Hugging Face PEFT adapter directory of a LoRA checkpoint into `out` (fp32 tensors)."""
    path = resolve_checkpoint(checkpoint)
    lora = run_config.peft
    if not is_lora_checkpoint(path) or not isinstance(lora, LoraConfig):
        raise ExportError(f"--peft: {path} is not a LoRA adapter checkpoint (no {BASE_FILE}); export it without --peft")
    out = Path(out).expanduser().absolute()
    if out.exists() and any(out.iterdir()):
        raise ExportError(f"--out {out} is not empty: choose a new directory or empty it")
    ckpt = DistCheckpoint(path)
    adapters = {k: v.float().contiguous() for k, v in read_adapters(ckpt, run_config.training.model, lora).items()}
    record = read_base_record(str(path))
    out.mkdir(parents=True, exist_ok=True)
    names = list(adapters)
    shapes = {k: tuple(v.shape) for k, v in adapters.items()}
    with atomic_output(out / PEFT_WEIGHTS, binary=True) as f:
        f.write(encode_header(names, shapes, "float32", 4))
        for name in names:
            f.write(adapters[name].view(torch.uint8).numpy().data)
    config = peft_hf.adapter_config(lora, record.path if record else "")
    atomic_write(out / PEFT_CONFIG, json.dumps(config, indent=2) + "\n")
    return out


class _Progress:
    """Bytes done / total, with tensors done / total beside them."""

    def __init__(self, total_bytes: int, total_tensors: int, enabled: bool):
        self.bar = tqdm(
            total=total_bytes, unit="B", unit_scale=True, desc="export_hf", disable=not enabled, mininterval=1.0
        )
        self.tensors, self.total_tensors = 0, total_tensors

    def add(self, nbytes: int, tensors: int = 1) -> None:
        self.tensors += tensors
        self.bar.update(nbytes)
        self.bar.set_postfix_str(f"{self.tensors}/{self.total_tensors} tensors", refresh=False)


def _write_shard(
    target: Path,
    names: list[str],
    shapes: Mapping[str, tuple[int, ...]],
    dtype: str,
    tensors: Any,
    progress: _Progress,
) -> None:
    """One safetensors file, tensor by tensor, under a temporary name until it is complete."""
    torch_dtype = getattr(torch, dtype)
    itemsize = torch.empty((), dtype=torch_dtype).element_size()
    with atomic_output(target, binary=True) as f:
        f.write(encode_header(names, shapes, dtype, itemsize))
        for name in names:
            tensor = tensors.get(name).to(torch_dtype).contiguous()
            if tuple(tensor.shape) != tuple(shapes[name]):
                raise ExportError(
                    f"{tensors.path}: {name} has shape {list(tensor.shape)} in the checkpoint, "
                    f"{list(shapes[name])} from the run's training.model"
                )
            f.write(tensor.view(torch.uint8).numpy().data if tensor.numel() else b"")
            progress.add(tensor.numel() * itemsize)
            del tensor


def export(
    checkpoint: str | os.PathLike,
    out: str | os.PathLike,
    *,
    run_config: Config,
    dtype: str = "bfloat16",
    max_shard_bytes: int = 5 * 10**9,
    tokenizer: str | None = None,
    copy_tokenizer: bool = True,
    progress: bool = True,
    base: str | None = None,
) -> Path:
    """Write the Hugging Face model of `checkpoint` (a run's training.model in `run_config`) into `out`; a LoRA
    checkpoint's merged into its base (`base`: where that base is now, if it moved)."""
    model = run_config.training.model
    try:  # before anything is read or written
        hf_config.check_exportable(model)
    except hf_config.HFConfigError as err:
        raise ExportError(str(err)) from None
    if dtype not in DTYPE_CODES:
        raise ExportError(f"--dtype {dtype}: use one of {', '.join(DTYPE_CODES)}")
    path = resolve_checkpoint(checkpoint)
    out = Path(out).expanduser().absolute()
    ckpt = DistCheckpoint(path)
    tensors: Any
    if is_lora_checkpoint(path):
        if not isinstance(run_config.peft, LoraConfig):
            raise ExportError(
                f"{path} is a LoRA adapter checkpoint and its run's config has no peft=lora: pass --config"
            )
        _, source = lora_base(path, run_config, base)
        if isinstance(source, HFTensors):
            source.ckpt.check_files(source.checkpoint_keys())
        tensors = MergedTensors(source, read_adapters(ckpt, model, run_config.peft), run_config.peft)
    else:
        tensors = HFTensors(ckpt, model)
        ckpt.check_files(tensors.checkpoint_keys())
    itemsize = _ITEMSIZE[dtype]
    shapes = mapping.hf_shapes(model)
    shards = shard_plan(shapes, itemsize, max_shard_bytes)
    _prepare_out(out, {"checkpoint": str(path), "dtype": dtype, "shards": shards})

    total = sum(itemsize * math.prod(s) for s in shapes.values())
    bar = _Progress(total, len(shapes), progress)
    for index, names in enumerate(shards):
        target = out / shard_name(index, len(shards))
        if target.is_file():  # finished by an earlier, interrupted run of the same export
            bar.add(sum(itemsize * math.prod(shapes[n]) for n in names), len(names))
        else:
            _write_shard(target, names, shapes, dtype, tensors, bar)
    bar.bar.close()

    weight_index = {
        "metadata": {"total_size": total},
        "weight_map": {n: shard_name(i, len(shards)) for i, names in enumerate(shards) for n in names},
    }
    atomic_write(out / INDEX_FILE, json.dumps(weight_index, indent=2) + "\n")
    bos, eos = _copy_tokenizer(run_config, tokenizer, out) if copy_tokenizer else (None, None)
    config = hf_config.llama_config(model, torch_dtype=dtype, bos_token_id=bos, eos_token_id=eos)
    atomic_write(out / "config.json", json.dumps(config, indent=2) + "\n")
    generation = {k: v for k, v in (("bos_token_id", bos), ("eos_token_id", eos)) if v is not None}
    atomic_write(out / "generation_config.json", json.dumps(generation, indent=2) + "\n")
    (out / MANIFEST).unlink(missing_ok=True)
    return out


def _prepare_out(out: Path, manifest: dict[str, Any]) -> None:
    """A new or empty directory, or one that an interrupted run of this same export left behind."""
    marker = out / MANIFEST
    if out.exists() and any(out.iterdir()):
        try:
            same = json.loads(marker.read_text()) == manifest
        except (OSError, ValueError):
            same = False
        if not same:
            raise ExportError(
                f"--out {out} is not empty (and not an interrupted export of this checkpoint): choose "
                "a new directory or empty it"
            )
        return
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(marker, json.dumps(manifest))


# --------------------------------------------------------------------------- tokenizer
def _tokenizer_source(run_config: Config, override: str | None) -> Path:
    value = override or run_config.training.tokenizer.path
    if not value:
        raise ExportError("the run has no training.tokenizer.path; pass --tokenizer DIR or --no-tokenizer")
    if hf_config.is_hub_id(str(value)):
        cached = hf_config.cached_snapshot(str(value))
        if cached is None:
            try:
                cached = Path(
                    hub.download(str(value), patterns=[*TOKENIZER_FILES, "generation_config.json", "config.json"])
                )
            except Exception as err:  # offline, gated, not found: the hub's line; anything else by its kind
                why = str(err) if isinstance(err, hub.HubError) else type(err).__name__
                raise ExportError(
                    f"tokenizer {value} is not in the Hugging Face cache and cannot be downloaded "
                    f"({why}); pass --tokenizer DIR or --no-tokenizer"
                ) from None
        return cached
    path = Path(str(value)).expanduser()
    if not path.exists():
        raise ExportError(f"tokenizer {path} does not exist; pass --tokenizer DIR or --no-tokenizer")
    return path


def _copy_tokenizer(run_config: Config, override: str | None, out: Path) -> tuple[int | None, int | list[int] | None]:
    """Copy the run's tokenizer files; returns (bos_token_id, eos_token_id) for config.json."""
    source = _tokenizer_source(run_config, override)
    if source.is_file():
        target = "tokenizer.model" if source.suffix == ".model" else "tokenizer.json"
        shutil.copyfile(source, out / target)
        return None, None
    copied = [name for name in TOKENIZER_FILES if (source / name).is_file()]
    if not copied:
        raise ExportError(f"tokenizer directory {source} has none of {', '.join(TOKENIZER_FILES)}")
    for name in copied:
        shutil.copyfile(source / name, out / name)
    return _special_ids(source)


def _special_ids(source: Path) -> tuple[int | None, int | list[int] | None]:
    """bos/eos ids: from the tokenizer directory's generation_config.json or config.json (a model snapshot),
    else the bos_token/eos_token of tokenizer_config.json looked up in tokenizer.json."""
    for name in ("generation_config.json", "config.json"):
        try:
            data = json.loads((source / name).read_text())
        except (OSError, ValueError):
            continue
        if "eos_token_id" in data:
            return data.get("bos_token_id"), data.get("eos_token_id")
    try:
        config = json.loads((source / "tokenizer_config.json").read_text())
        vocab = json.loads((source / "tokenizer.json").read_text())
    except (OSError, ValueError):
        return None, None
    ids = (vocab.get("model") or {}).get("vocab")
    ids = dict(ids) if isinstance(ids, dict) else {}
    ids.update({t["content"]: t["id"] for t in vocab.get("added_tokens", [])})

    def token_id(token):
        text = token.get("content") if isinstance(token, dict) else token
        return ids.get(text)

    return token_id(config.get("bos_token")), token_id(config.get("eos_token"))


def run_config_for(checkpoint: Path, config: str | None) -> Config:
    path = Path(config) if config else checkpoint.parent.parent / CONFIG_FILE
    if not path.is_file():
        raise ExportError(f"{path} not found: pass --config RUN_DIR/config.yaml of the run that wrote the checkpoint")
    try:
        return load_run_config(path)
    except RunDirError as err:
        raise ExportError(str(err)) from None
