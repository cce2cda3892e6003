"""LoRA as a model transform (peft=lora): every parameter of the built model chunks is frozen, and each targeted
linear layer of every decoder layer gets a trained low-rank adapter, y = W x + alpha / rank * B A dropout(x).
The trainer calls `apply_lora` after megatron-core built the chunks and before the DDP wrapper, so DDP and the
optimizer see the adapters as the only parameters that train (no gradient buffer, no optimizer state for the base).

Where an adapter lives. The target `<parent>.<name>` (self_attention.linear_qkv, self_attention.linear_proj,
mlp.linear_fc1, mlp.linear_fc2) keeps its parameters and their names, so the Hugging Face importer and checkpoints
of the base see the keys they know; its adapter is the sibling module `<parent>.<name>_lora` (A as `a`, B as `b`),
and a forward hook on the target adds the adapter's output to the target's. The adapter is a sibling, not a child:
megatron-core and Transformer Engine build a linear layer's sharded state from its own state_dict() with TP axes
for `weight` and `bias` only, so a child's tensors would be declared replicated; the adapter declares its own.

One adapter per Hugging Face projection, as PEFT has them. PEFT on a Hugging Face Llama puts a LoRA of its own on each
of q_proj, k_proj and v_proj (gate_proj and up_proj), where megatron-core has one fused linear_qkv (linear_fc1). The
adapter of a fused layer is exactly those n adapters: A stacks theirs, [n r, in] (q, k, v; gate, up), and B [out, r]
holds each output row's row of its own projection's B, in the layer's row order (megatron-core's q, k, v rows per
query group; gate rows, then up rows). An output row reads only its own projection's r columns of A x: the forward
spreads B over the n blocks ([out, n r], zero outside a row's block), so B's gradient stays in the blocks too. The
tensors then map one to one to PEFT's lora_A and lora_B (recipes/peft/hf.py), with the rows of B split as the
importer and the exporter split the layer's weight (recipes/hf/mapping.py).

TP sharding (megatron-core's tensor_parallel mappings; every rank computes the unsharded math's result):
- column-parallel base (linear_qkv, linear_fc1: output sharded): A [n r, in] whole on every rank, B [out/tp, r] this
  rank's rows (the same rows as the layer's weight, so each rank's rows keep their projections).
  h = copy_to_tp(A x) (backward: all-reduce, so dA and dx are complete and equal on every rank), then B h. With
  sequence parallelism x is this rank's part of the sequence: it is gathered first, and the gather's backward is a
  split (not a reduce-scatter), since dx is already complete.
- row-parallel base (linear_proj, linear_fc2: input sharded): A [r, in/tp] this rank's columns, B [out, r] whole.
  h = reduce_from_tp(A x) (forward: all-reduce of the partial products), then B h, scattered over the sequence with
  sequence parallelism (backward: the all-gather of dy).
A replicated A or B gets the same gradient on every rank, so it stays equal without any other communication; its
`tensor_model_parallel` attribute is false, so the gradient norm counts it once.

Transformer Engine's fused layernorm. With the Transformer Engine spec linear_qkv and linear_fc1 are
TELayerNormColumnParallelLinear: the layer's input is the residual stream, and the layernorm runs inside. The
adapter must read the normalised input, so the layer is asked for it (`return_layernorm_output=True`); its gradient
is then added to the layer's own input gradient before the layernorm's backward. The normalised input comes back
as this rank's part of the sequence (`return_layernorm_output_gathered=False`) and the adapter gathers it itself:
Transformer Engine (2.x) drops the gradient of a gathered layernorm output in the backward, so with the gathered
form the adapter's gradient would not reach the layers below. The price is one all-gather of the normalised
input per adapted fused layer with sequence parallelism. With megatron-core's local spec (the CPU tests) the
layernorm is a module of its own and the target's input is already normalised.

Initialisation. A and B are drawn whole for the unsharded layer from a generator seeded with the run's seed and
the layer's global number and name, and each rank keeps its shard: the same adapters in every layout (TP, PP, VP),
and equal replicated copies on every rank. Dropout uses megatron-core's model-parallel generator (a mask per rank)
where the tensor is sharded over TP, and the default generator, which megatron-core seeds alike across the TP group,
where it is replicated, so that a replicated A sees the same input on every rank."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
import functools
import math
import zlib
from typing import Any

from megatron.core import parallel_state as ps, tensor_parallel
from megatron.core.tensor_parallel import mappings
from megatron.core.transformer.mlp import apply_swiglu_sharded_factory
from megatron.core.transformer.transformer_layer import TransformerLayer
from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint
import torch
import torch.nn.functional as F

from common.config import LoraConfig, LoraInit, LoraTarget

ADAPTER_SUFFIX = "_lora"

# Where each target sits in a decoder layer: (its parent module, its name).
TARGETS: dict[LoraTarget, tuple[str, str]] = {
    LoraTarget.linear_qkv: ("self_attention", "linear_qkv"),
    LoraTarget.linear_proj: ("self_attention", "linear_proj"),
    LoraTarget.linear_fc1: ("mlp", "linear_fc1"),
    LoraTarget.linear_fc2: ("mlp", "linear_fc2"),
}


def is_adapter_key(key: str) -> bool:
    """A state-dict or checkpoint key of an adapter's tensor: the Hugging Face importer leaves those as initialised."""
    return any(f".{name}{ADAPTER_SUFFIX}." in key for _, name in TARGETS.values())


@dataclass(frozen=True)
class Sharding:
    """How one adapter is laid out over the TP group."""

    column: bool  # the base's output is sharded (linear_qkv, linear_fc1); else its input (linear_proj, linear_fc2)
    sequence_parallel: bool
    tp_size: int
    tp_rank: int
    # linear_fc1 of a gated MLP: a rank's output rows are its share of the gate rows, then its share of the up rows.
    swiglu: bool = False

    def shard(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's A and B of the whole A [n r, in] and B [out, r]."""
        if not self.column:
            return a.chunk(self.tp_size, dim=1)[self.tp_rank], b
        return a, self.rows(b)

    def rows(self, whole: torch.Tensor) -> torch.Tensor:
        """This rank's rows of a column-parallel layer's whole output rows (its weight's, B's, their blocks')."""
        halves = whole.chunk(2) if self.swiglu else (whole,)
        return torch.cat([half.chunk(self.tp_size)[self.tp_rank] for half in halves])


class LoraAdapter(torch.nn.Module):
    """A and B of one linear layer (this rank's shards) and what the layer's output gets: scale * B A dropout(x) in
    the layout of the base's output on this rank. `blocks` [out rows here, n] (one-hot: each of this rank's output
    rows' projection) makes it n adapters of one fused layer (A [n r, in]); None: one projection (A [r, in])."""

    def __init__(
        self,
        a: torch.Tensor,
        b: torch.Tensor,
        scale: float,
        dropout: float,
        sharding: Sharding,
        blocks: torch.Tensor | None = None,
    ):
        super().__init__()
        self.a = torch.nn.Parameter(a)
        self.b = torch.nn.Parameter(b)
        self.scale, self.dropout, self.sharding = scale, dropout, sharding
        if blocks is not None and (blocks.shape[0] != b.shape[0] or a.shape[0] != blocks.shape[1] * b.shape[1]):
            raise ValueError(f"blocks {list(blocks.shape)} do not fit A {list(a.shape)} and B {list(b.shape)}")
        # Not persistent: a function of the layer's shape, not trained state; checkpoints hold A and B only.
        self.register_buffer("blocks", None if blocks is None else blocks.to(b.dtype), persistent=False)
        sharded, dim = (self.b, 0) if sharding.column else (self.a, 1)
        replicated = self.a if sharding.column else self.b
        tensor_parallel.set_tensor_model_parallel_attributes(sharded, True, dim, 1)
        tensor_parallel.set_defaults_if_not_set_tensor_model_parallel_attributes(replicated)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sharding.column:
            h = mappings.copy_to_tensor_model_parallel_region(F.linear(self._column_input(x), self.a))
            return self.scale * F.linear(h, self.block_b())
        h = mappings.reduce_from_tensor_model_parallel_region(F.linear(self._dropped(x, sharded=True), self.a))
        y = self.scale * F.linear(h, self.b)
        return mappings.scatter_to_sequence_parallel_region(y) if self.sharding.sequence_parallel else y

    def block_b(self) -> torch.Tensor:
        """B spread over the projections' blocks of A x: [out, n r], row i zero outside its projection's r columns."""
        if self.blocks is None:
            return self.b
        rows, n = self.blocks.shape
        return (self.blocks.unsqueeze(2) * self.b.unsqueeze(1)).reshape(rows, n * self.b.shape[1])

    def _column_input(self, x: torch.Tensor) -> torch.Tensor:
        """The whole input of a column-parallel layer, dropped out alike on every rank."""
        if not self.sharding.sequence_parallel:
            return self._dropped(x, sharded=False)
        # Each rank drops its own part of the sequence, then the parts are gathered: every rank has the same.
        x = self._dropped(x, sharded=True)
        return mappings.gather_from_sequence_parallel_region(x, tensor_parallel_output_grad=False)

    def _dropped(self, x: torch.Tensor, sharded: bool) -> torch.Tensor:
        if not self.training or not self.dropout:
            return x
        rng = tensor_parallel.get_cuda_rng_tracker().fork() if sharded else contextlib.nullcontext()
        with rng:
            return F.dropout(x, self.dropout, training=True)

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None) -> Any:
        """The adapter's tensors for dist_checkpointing, with their TP axes (megatron-core's module protocol)."""
        axes = {"b": 0} if self.sharding.column else {"a": 1}
        state = self.state_dict(prefix="", keep_vars=True)
        sharded = make_sharded_tensors_for_checkpoint(state, prefix, axes, sharded_offsets)
        if self.sharding.swiglu:  # B's rows are [gate; up], each half sharded separately, as linear_fc1's weight
            sharded[f"{prefix}b"] = apply_swiglu_sharded_factory(
                sharded[f"{prefix}b"],
                sharded_offsets,
                tp_group=ps.get_tensor_model_parallel_group(),
                dp_group=(metadata or {}).get("dp_cp_group"),
            )
        return sharded


def initial_weights(
    in_features: int, out_features: int, lora: LoraConfig, seed: int, projections: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """A [n r, in] and B [out, r] of the unsharded layer (n projections), drawn on the CPU from a generator of `seed`
    alone. Kaiming's bound depends on `in` only: each projection's [r, in] block is drawn as PEFT draws its lora_A."""
    generator = torch.Generator().manual_seed(seed)
    a = _initialised(torch.empty(projections * lora.rank, in_features), lora.a_init, generator)
    b = _initialised(torch.empty(out_features, lora.rank), lora.b_init, generator)
    return a, b


def _initialised(tensor: torch.Tensor, how: LoraInit, generator: torch.Generator) -> torch.Tensor:
    if how == LoraInit.zero:
        return tensor.zero_()
    # a = sqrt(5): nn.Linear's default, which Hugging Face PEFT uses for lora_A (bound 1 / sqrt(in_features)).
    return torch.nn.init.kaiming_uniform_(tensor, a=math.sqrt(5), generator=generator)


def row_projections(target: LoraTarget, config: Any) -> torch.Tensor | None:
    """Which Hugging Face projection each output row of the unsharded layer belongs to, in megatron-core's row
    order: linear_qkv's q, k, v (0, 1, 2) rows per query group, a gated linear_fc1's gate (0) then up (1) rows;
    None for a layer that is one projection. `config` is megatron-core's TransformerConfig."""
    if target == LoraTarget.linear_qkv:
        groups = config.num_query_groups or config.num_attention_heads
        d = config.kv_channels
        per_group = config.num_attention_heads // groups
        return torch.tensor([0] * (per_group * d) + [1] * d + [2] * d).repeat(groups)
    if target == LoraTarget.linear_fc1 and config.gated_linear_unit:
        return torch.arange(2).repeat_interleave(config.ffn_hidden_size)
    return None


def adapter_seed(seed: int, layer_number: int, target: LoraTarget) -> int:
    """A seed per adapter that depends on the run's seed and the adapter's place in the whole model only."""
    return (seed + zlib.crc32(f"{layer_number}.{target}".encode())) % 2**63


def apply_lora(chunks: list[torch.nn.Module], lora: LoraConfig, seed: int) -> list[LoraAdapter]:
    """Freeze every parameter of this rank's model chunks and attach an adapter to each targeted layer; the
    adapters, in model order."""
    adapters = []
    for chunk in chunks:
        for param in chunk.parameters():
            param.requires_grad_(False)
        for layer in (m for m in chunk.modules() if isinstance(m, TransformerLayer)):
            adapters += [_attach(layer, target, lora, seed) for target in lora.target_modules]
    return adapters


def _attach(layer: TransformerLayer, target: LoraTarget, lora: LoraConfig, seed: int) -> LoraAdapter:
    parent_name, name = TARGETS[target]
    column = target.column_parallel
    parent = getattr(layer, parent_name)
    linear = getattr(parent, name)
    config = layer.config
    sharding = Sharding(
        column=column,
        sequence_parallel=config.sequence_parallel,
        tp_size=ps.get_tensor_model_parallel_world_size(),
        tp_rank=ps.get_tensor_model_parallel_rank(),
        swiglu=target == LoraTarget.linear_fc1 and config.gated_linear_unit,
    )
    out_local, in_local = linear.weight.shape
    in_features, out_features = (
        (in_local, out_local * sharding.tp_size) if column else (in_local * sharding.tp_size, out_local)
    )
    rows = row_projections(target, config)
    n = 1 if rows is None else int(rows.max()) + 1
    if rows is not None and rows.numel() != out_features:
        raise ValueError(f"{target}: {out_features} output rows, {rows.numel()} from the model's shape")
    whole = initial_weights(in_features, out_features, lora, adapter_seed(seed, layer.layer_number, target), n)
    a, b = (t.to(device=linear.weight.device, dtype=config.params_dtype) for t in sharding.shard(*whole))
    blocks = None if rows is None else sharding.rows(F.one_hot(rows, n)).to(device=b.device, dtype=b.dtype)
    adapter = LoraAdapter(a.contiguous(), b.contiguous(), lora.alpha / lora.rank, lora.dropout, sharding, blocks)
    parent.add_module(name + ADAPTER_SUFFIX, adapter)
    # Transformer Engine's layer with the layernorm inside (TELayerNormColumnParallelLinear) has this switch.
    fused_norm = hasattr(linear, "return_layernorm_output")
    if fused_norm:
        linear.return_layernorm_output = True
        linear.return_layernorm_output_gathered = False  # see the module's docstring: the gathered form loses dx
    linear.register_forward_hook(functools.partial(_add_adapter_output, adapter, fused_norm))
    return adapter


def _add_adapter_output(adapter: LoraAdapter, fused_norm: bool, module, args: tuple, output: Any) -> tuple:
    """The forward hook: the target's (output, bias) with the adapter's output added."""
    out, bias, x = _split_output(output, args, fused_norm)
    return out + adapter(x), bias


def _split_output(output: Any, args: tuple, fused_norm: bool) -> tuple[torch.Tensor, Any, torch.Tensor]:
    """(output, bias, the input the adapter reads) of megatron-core's linear layer. With return_layernorm_output
    megatron-core's Transformer Engine wrapper returns ((output, normalised input), None), or (output, bias,
    normalised input) where the layer returns its bias."""
    if not fused_norm:
        out, bias = output
        return out, bias, args[0]
    if len(output) == 3:
        return output
    (out, normalised), bias = output
    return out, bias, normalised
