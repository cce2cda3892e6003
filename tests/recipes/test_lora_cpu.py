"""LoRA (recipes/peft/lora.py) on the CPU, ranks as gloo processes with megatron-core's parallel state:
- the adapters' TP sharding (column- and row-parallel bases, with and without sequence parallelism, a SwiGLU fc1,
  and fused layers with one adapter per projection: q, k, v rows per query group, gate then up rows) at TP 1, 2 and
  4 against the unsharded math, scale * B_p A_p x for each projection p's rows, forward and the gradients of x, A
  and B; a wrong scale fails the same comparison;
- the transform on tiny GPTModels (megatron-core's local spec): the base frozen under its own names, the model
  unchanged at init (B = 0), gradients on the adapters only, and with B drawn at random the same logits at TP1 and
  TP2 (the adapters are initialised the same in every layout)."""

from __future__ import annotations

import contextlib
import os
import dataclasses
import functools
import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

import cpu_megatron  # noqa: E402
from common.config import LoraInit  # noqa: E402
from recipes.peft import lora  # noqa: E402

pytestmark = pytest.mark.timeout(600)

SEQ, BATCH, IN, OUT, RANK, SCALE = 8, 2, 16, 16, 4, 2.5
# Which projection each of the OUT output rows belongs to. "qkv": 4 query groups of [q, q, k, v] rows, as
# megatron-core orders linear_qkv (TP shards whole groups); "gate_up": 8 gate rows, then 8 up rows (linear_fc1).
ROWS = {
    "one": [0] * OUT,
    "qkv": [0, 0, 1, 2] * 4,
    "gate_up": [0] * 8 + [1] * 8,
}
# (name, column-parallel base, sequence parallel, SwiGLU fc1 rows, projections of the rows)
PLACEMENTS = [
    ("column", True, False, False, "one"),
    ("column_sp", True, True, False, "one"),
    ("column_swiglu_sp", True, True, True, "one"),
    ("qkv", True, False, False, "qkv"),
    ("qkv_sp", True, True, False, "qkv"),
    ("gate_up_swiglu_sp", True, True, True, "gate_up"),
    ("row", False, False, False, "one"),
    ("row_sp", False, True, False, "one"),
]


def projections(rows: str) -> int:
    return max(ROWS[rows]) + 1


def whole_tensors() -> dict[str, torch.Tensor]:
    """x, A (r rows per projection: up to 3), B and the gradient of the output, whole, the same in every process."""
    g = torch.Generator().manual_seed(7)
    return {
        "x": torch.randn(SEQ, BATCH, IN, generator=g),
        "a": torch.randn(3 * RANK, IN, generator=g),
        "b": torch.randn(OUT, RANK, generator=g),
        "dy": torch.randn(SEQ, BATCH, OUT, generator=g),
    }


def unsharded(t: dict[str, torch.Tensor], scale: float = SCALE) -> dict[str, dict[str, torch.Tensor]]:
    """Per placement: y and the gradients of x, A and B in one process with no parallelism, as Hugging Face PEFT
    computes a fused layer's projections: each projection p its own adapter, y[rows of p] = scale * B_p A_p x."""
    found = {}
    for name, *_, rows in PLACEMENTS:
        n = projections(rows)
        x, a, b = t["x"].clone().requires_grad_(True), t["a"][: n * RANK].clone(), t["b"].clone()
        a.requires_grad_(True)
        b.requires_grad_(True)
        which = torch.tensor(ROWS[rows])
        columns: list[torch.Tensor] = [torch.empty(0)] * OUT
        for p in range(n):
            rows_p = (which == p).nonzero().squeeze(1)
            part = scale * (x @ a[p * RANK : (p + 1) * RANK].T) @ b[rows_p].T
            for j, i in enumerate(rows_p.tolist()):
                columns[i] = part[..., j]
        y = torch.stack(columns, dim=-1)
        y.backward(t["dy"])
        found[name] = {"y": y.detach(), "dx": x.grad, "da": a.grad, "db": b.grad}
    return found


def _pieces(tensor: torch.Tensor, dim: int, n: int, swiglu: bool = False) -> list[torch.Tensor]:
    """The n shards of `tensor` along dim, as megatron-core lays them out (SwiGLU rows: gate and up separately)."""
    if not swiglu:
        return list(tensor.chunk(n, dim))
    gate, up = tensor.chunk(2, dim)
    return [torch.cat([g, u], dim) for g, u in zip(gate.chunk(n, dim), up.chunk(n, dim))]


def _whole(shards: list[torch.Tensor], dim: int, swiglu: bool = False) -> torch.Tensor:
    if not swiglu:
        return torch.cat(shards, dim)
    halves = [s.chunk(2, dim) for s in shards]
    return torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim)


# Where each tensor is sharded on a rank: (dimension, swiglu rows) or None for whole. Dimensions count from the end
# so that one table serves x, y (3-d) and A, B (2-d).
def layout(column: bool, sp: bool, swiglu: bool) -> dict[str, tuple[int, bool] | None]:
    sequence = (-3, False) if sp else None
    if column:
        return {"x": sequence, "dx": sequence, "y": (-1, swiglu), "dy": (-1, swiglu), "da": None, "db": (-2, swiglu)}
    return {"x": (-1, False), "dx": (-1, False), "y": sequence, "dy": sequence, "da": (-1, False), "db": None}


def local(tensor: torch.Tensor, where: tuple[int, bool] | None, n: int, rank: int) -> torch.Tensor:
    return tensor if where is None else _pieces(tensor, where[0], n, where[1])[rank].contiguous()


def adapter_ranks(rank: int) -> dict[str, dict[str, dict[str, torch.Tensor]]]:
    """On each rank: every placement's adapter built from the whole A and B, run forward and backward on this
    rank's part of x and of the output's gradient; what this rank holds of y, dx, dA and dB. Three variants: right
    (alpha / rank as LoRA scales), wrong (twice that: the negative control), dropout (p = 0.5)."""
    from megatron.core import parallel_state as ps, tensor_parallel

    world = torch.distributed.get_world_size()
    ps.initialize_model_parallel(tensor_model_parallel_size=world)
    # megatron-core's model-parallel generator lives on the GPU; the default one stands in (cpu_megatron does too).
    tensor_parallel.get_cuda_rng_tracker().fork = lambda *args, **kwargs: contextlib.nullcontext()
    t = whole_tensors()
    variants = {"right": (SCALE, 0.0), "wrong": (2 * SCALE, 0.0), "dropout": (SCALE, 0.5)}
    found: dict[str, dict[str, dict]] = {variant: {} for variant in variants}
    for variant, (scale, dropout) in variants.items():
        for name, column, sp, swiglu, rows in PLACEMENTS:
            where = layout(column, sp, swiglu)
            sharding = lora.Sharding(column=column, sequence_parallel=sp, tp_size=world, tp_rank=rank, swiglu=swiglu)
            n = projections(rows)
            a, b = sharding.shard(t["a"][: n * RANK], t["b"])
            # The one-hot projection of each output row, sharded as the rows are (None: one projection).
            blocks = sharding.rows(torch.nn.functional.one_hot(torch.tensor(ROWS[rows]), n)) if n > 1 else None
            adapter = lora.LoraAdapter(a.clone(), b.clone(), scale, dropout, sharding, blocks).train()
            x = local(t["x"], where["x"], world, rank).clone().requires_grad_(True)
            torch.manual_seed(0)  # the same default generator on every rank, as megatron-core seeds it
            y = adapter(x)
            y.backward(local(t["dy"], where["dy"], world, rank))
            results = {"y": y.detach(), "dx": x.grad, "da": adapter.a.grad, "db": adapter.b.grad}
            # As numpy arrays, which pickle by value: torch tensors cross the queue as shared-memory handles that
            # the parent may open only after this process has exited (then: FileNotFoundError in the parent).
            found[variant][name] = {k: v.detach().numpy().copy() for k, v in results.items()}
    return found


@functools.cache
def results_at(tp: int) -> dict[str, list[dict]]:
    """adapter_ranks on tp gloo ranks, once per test session: {variant: [rank 0's results, rank 1's, ...]}."""
    per_rank = cpu_megatron.run_ranks(adapter_ranks, tp)
    tensors = [
        {variant: {name: {k: torch.from_numpy(v) for k, v in r.items()} for name, r in by_name.items()}
         for variant, by_name in rank.items()}
        for rank in per_rank
    ]  # fmt: skip
    return {variant: [r[variant] for r in tensors] for variant in tensors[0]}


def mismatches(per_rank: list[dict], references: dict[str, dict[str, torch.Tensor]]) -> list[str]:
    """What the ranks' results, put together, get wrong against the unsharded math; a tensor every rank holds
    whole must be the same on every rank."""
    wrong = []
    for name, column, sp, swiglu, _ in PLACEMENTS:
        where = layout(column, sp, swiglu)
        reference = references[name]
        for key in ("y", "dx", "da", "db"):
            shards = [r[name][key] for r in per_rank]
            if where[key] is None:
                whole = shards[0]
                if not all(torch.equal(s, whole) for s in shards):
                    wrong.append(f"{name} {key}: the ranks' copies differ")
            else:
                whole = _whole(shards, where[key][0], where[key][1])
            # Relative to the tensor's largest element: fp32 sums in another order differ by a few ulps of that.
            if (whole - reference[key]).abs().max() > 1e-6 * reference[key].abs().max():
                wrong.append(f"{name} {key}: max |diff| {(whole - reference[key]).abs().max().item():.2e}")
    return wrong


# Over 30 s on a 2-core machine from TP2 on (spawning ranks that import megatron-core): the slow marker's rule.
@pytest.mark.parametrize("tp", [1, pytest.param(2, marks=pytest.mark.slow), pytest.param(4, marks=pytest.mark.slow)])
def test_adapter_sharding_equals_the_unsharded_math(tp):
    assert mismatches(results_at(tp)["right"], unsharded(whole_tensors())) == []


@pytest.mark.slow
def test_a_wrong_scale_fails_the_comparison():
    # The negative control: the same ranks with the adapters scaled by 2 * alpha / rank. y and the gradients of x,
    # A and B all scale with it: every comparison of every placement fails.
    wrong = mismatches(results_at(2)["wrong"], unsharded(whole_tensors()))
    assert len(wrong) == 4 * len(PLACEMENTS), wrong


@pytest.mark.slow
def test_with_dropout_the_replicated_tensors_stay_equal_on_every_rank():
    # Dropout draws the same mask on every rank for a replicated input (column-parallel without sequence
    # parallelism) and a mask per rank for a sharded one; either way a replicated A or B gets the same gradient
    # everywhere (mismatches checks that first), and the output differs from the undropped one.
    wrong = mismatches(results_at(2)["dropout"], unsharded(whole_tensors()))
    assert wrong and not any("copies differ" in line for line in wrong), wrong


# --------------------------------------------------------------------------- the transform on GPTModels
LAYOUTS, LORA = cpu_megatron.LAYOUTS, cpu_megatron.LORA


def transformed_model(rank: int, cfg, plan, tokens: torch.Tensor) -> dict:
    """A GPTModel before and after apply_lora: its parameters' names, what requires a gradient and gets one, the
    logits; then the logits with B drawn at random."""
    torch.manual_seed(1234)  # the base weights: megatron-core draws each whole on the CPU, then keeps the shard
    chunks = cpu_megatron.build_chunks(cfg, plan)
    model = chunks[0]
    before = [name for name, _ in model.named_parameters()]
    # The base's logits with its weights frozen: megatron-core's TP linear layers take another path for a weight
    # that needs no gradient, which rounds differently (1.8e-7 at TP2), so the exact comparison below is with that.
    for param in model.parameters():
        param.requires_grad_(False)
    base_logits = cpu_megatron.tp_logits(model, tokens)
    adapters = lora.apply_lora(chunks, LORA, seed=5)
    params = dict(model.named_parameters())
    trained = sorted(name for name, p in params.items() if p.requires_grad)
    init_logits = cpu_megatron.tp_logits(model, tokens)

    model.train()
    positions = torch.arange(tokens.shape[1]).unsqueeze(0).expand_as(tokens)
    causal = torch.triu(torch.ones(tokens.shape[1], tokens.shape[1]), diagonal=1).bool()[None, None]
    model(tokens, positions, causal, labels=tokens.roll(-1, dims=1)).sum().backward()
    with_grad = sorted(name for name, p in params.items() if p.grad is not None)
    b_grads_nonzero = all(bool(adapter.b.grad.abs().sum() > 0) for adapter in adapters)

    random_b = dataclasses.replace(LORA, b_init=LoraInit.kaiming_uniform)
    from megatron.core import parallel_state as ps

    ps.destroy_model_parallel()
    model, *_ = cpu_megatron.build_chunks(cfg, plan)
    model.load_state_dict({k: v for k, v in chunks[0].state_dict().items() if not lora.is_adapter_key(k)}, strict=False)
    lora.apply_lora([model], random_b, seed=5)
    adapted_logits = cpu_megatron.tp_logits(model.eval(), tokens)
    return {
        "before": before,
        "after": list(params),
        "trained": trained,
        "with_grad": with_grad,
        "b_grads_nonzero": b_grads_nonzero,
        "base": base_logits,
        "init": init_logits,
        "adapted": adapted_logits,
    }


def run_layout(layout: str, tokens: torch.Tensor) -> dict:
    cfg, plan = cpu_megatron.small_run(layout)
    return cpu_megatron.run_ranks(transformed_model, plan.num_gpus, cfg, plan, tokens)[0]


@pytest.mark.slow
def test_the_transform_freezes_the_base_and_trains_the_adapters_in_every_layout():
    tokens = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(3))
    found = {layout: run_layout(layout, tokens) for layout in LAYOUTS}
    for layout, r in found.items():
        # The base keeps its names; what is new are two tensors per target per layer, the only ones that train.
        assert set(r["before"]) <= set(r["after"]), layout
        added = sorted(set(r["after"]) - set(r["before"]))
        assert len(added) == 2 * 4 * 2 and all(lora.is_adapter_key(name) for name in added), (layout, added)
        assert not any(lora.is_adapter_key(name) for name in r["before"])
        assert r["trained"] == added and r["with_grad"] == added, layout
        assert r["b_grads_nonzero"], layout
        # B = 0: the adapted model starts as the base, exactly.
        assert torch.equal(r["init"], r["base"]), layout
    # The same base weights in both layouts (the precondition of what follows) ...
    torch.testing.assert_close(found["tp2"]["base"], found["tp1"]["base"], rtol=1e-4, atol=1e-4)
    # ... and the same adapters: with B drawn at random the logits change, and alike at TP1 and TP2.
    change = (found["tp1"]["adapted"] - found["tp1"]["base"]).abs().max().item()
    assert change > 1e-2
    torch.testing.assert_close(found["tp2"]["adapted"], found["tp1"]["adapted"], rtol=1e-4, atol=1e-4)


def base_then_lora(rank: int, cfg, plan, tokens: torch.Tensor, run_dir: str) -> dict:
    """A base model saved as training saves it; then another model, with adapters, started from that checkpoint
    (training.checkpoint.init_from)."""
    from megatron.core import parallel_state as ps

    from recipes.trainer import checkpoint

    torch.manual_seed(1234)
    base = cpu_megatron.build_chunks(cfg, plan)
    path = cpu_megatron.save_checkpoint(rank, base, run_dir)
    torch.distributed.broadcast_object_list(box := [path], src=0)
    base_logits = cpu_megatron.tp_logits(base[0], tokens)
    ps.destroy_model_parallel()
    torch.manual_seed(99)  # other base weights: the checkpoint's must replace them
    chunks = cpu_megatron.build_chunks(cfg, plan)
    lora.apply_lora(chunks, LORA, seed=5)
    adapters = {k: v.clone() for k, v in chunks[0].state_dict().items() if lora.is_adapter_key(k)}
    checkpoint.load_model_weights(box[0], chunks, lambda line: None)
    kept = all(torch.equal(v, chunks[0].state_dict()[k]) for k, v in adapters.items())
    return {"base": base_logits, "loaded": cpu_megatron.tp_logits(chunks[0], tokens), "kept": kept, "n": len(adapters)}


@pytest.mark.slow
def test_a_lora_run_starts_from_a_base_checkpoint_and_keeps_its_adapters(tmp_path):
    tokens = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(3))
    cfg, plan = cpu_megatron.small_run("tp2")
    found = cpu_megatron.run_ranks(base_then_lora, plan.num_gpus, cfg, plan, tokens, str(tmp_path))[0]
    assert found["kept"] and found["n"] == 2 * 4 * 2
    # B = 0: the adapted model computes the base's logits (up to the frozen weights' rounding, see above).
    torch.testing.assert_close(found["loaded"], found["base"], rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- adapter checkpoints
def adapters_saved_and_loaded(rank: int, cfg, plan, run_dir: str) -> dict:
    """A model with random adapters saved whole and adapters-only (what a LoRA run's checkpointer saves); the
    adapters-only checkpoint loaded into another model (another base, other adapters)."""
    from megatron.core import dist_checkpointing, parallel_state as ps

    from recipes.trainer import checkpoint

    random_b = dataclasses.replace(LORA, b_init=LoraInit.kaiming_uniform)
    torch.manual_seed(1234)
    chunks = cpu_megatron.build_chunks(cfg, plan)
    lora.apply_lora(chunks, random_b, seed=5)
    saved = {k: v.clone() for k, v in chunks[0].state_dict().items() if isinstance(v, torch.Tensor)}
    for name, adapters_only in (("full", False), ("adapters", True)):
        os.makedirs(os.path.join(run_dir, name), exist_ok=True)
        dist_checkpointing.save(checkpoint._model_sharded_state(chunks, adapters_only), os.path.join(run_dir, name))
    ps.destroy_model_parallel()
    torch.manual_seed(99)
    other = cpu_megatron.build_chunks(cfg, plan)
    lora.apply_lora(other, random_b, seed=6)
    other_base = {
        k: v.clone()
        for k, v in other[0].state_dict().items()
        if isinstance(v, torch.Tensor) and not lora.is_adapter_key(k)
    }
    sharded = checkpoint._model_sharded_state(other, adapters_only=True)
    checkpoint._load_model_state(other, dist_checkpointing.load(sharded, os.path.join(run_dir, "adapters")), True)
    state = other[0].state_dict()
    return {
        "adapters_restored": all(torch.equal(state[k], v) for k, v in saved.items() if lora.is_adapter_key(k)),
        "base_kept": all(torch.equal(state[k], v) for k, v in other_base.items()),
        "bases_differ": any(not torch.equal(v, saved[k]) for k, v in other_base.items() if k in saved),
    }


ADAPTER_STEMS = [
    "decoder.layers.self_attention.linear_qkv_lora",
    "decoder.layers.self_attention.linear_proj_lora",
    "decoder.layers.mlp.linear_fc1_lora",
    "decoder.layers.mlp.linear_fc2_lora",
]


def data_bytes(path) -> int:
    """The tensor data files of a dist_checkpointing directory (its metadata is a few kB whatever it holds)."""
    return sum(f.stat().st_size for f in path.rglob("*.distcp"))


def test_an_adapter_checkpoint_holds_the_adapters_alone_and_restores_them(tmp_path):
    cfg, plan = cpu_megatron.small_run("tp1")
    found = cpu_megatron.run_ranks(adapters_saved_and_loaded, plan.num_gpus, cfg, plan, str(tmp_path))[0]
    assert found["bases_differ"]  # the other model's base is another one, so keeping it is a real check
    assert found["adapters_restored"] and found["base_kept"]
    # A and B of 4 targets in 2 layers against the whole model: the adapters' share of the parameters, in bytes.
    full, adapters = data_bytes(tmp_path / "full"), data_bytes(tmp_path / "adapters")
    m = cfg.training.model
    # hidden 64, q 4 x 16 and k, v 2 x 16 rows, ffn 96, vocabulary 256.
    base = m.num_layers * (64 * 128 + 64 * 64 + 3 * 64 * 96 + 2 * 64) + 2 * 256 * 64 + 64
    adapter = m.num_layers * LORA.rank * ((3 * 64 + 128) + (64 + 64) + (2 * 64 + 2 * 96) + (96 + 64))
    print(f"\nfull {full:,} bytes, adapters {adapters:,} bytes; parameters {base + adapter:,} and {adapter:,}")
    # What it holds: A and B of every target, as global tensors (stacked over the layers) and nothing else.
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = FileSystemReader(str(tmp_path / "adapters")).read_metadata().state_dict_metadata
    stored = {k: v for k, v in metadata.items() if isinstance(v, TensorStorageMetadata)}
    assert sorted(stored) == sorted(f"{stem}.{t}" for stem in ADAPTER_STEMS for t in "ab")
    assert sum(math.prod(meta.size) for meta in stored.values()) == adapter
    # The bytes: the tensors' and some 2.5 kB per stored tensor (torch's serialisation), in each checkpoint alike.
    assert adapters < 0.2 * full


def test_a_resume_on_another_base_is_one_line(tmp_path):
    from common import checkpoints

    base, other = tmp_path / "base", tmp_path / "other"
    for directory, data in ((base, b"\0" * 3_000_000), (other, b"\0" * 1_500_000 + b"\1" + b"\0" * 1_499_999)):
        directory.mkdir()
        (directory / "model.safetensors").write_bytes(data)
    record = checkpoints.base_record("training.checkpoint.init_from_hf", str(base), str(base))
    ckpt = tmp_path / "iter_0000010"
    ckpt.mkdir()
    assert "holds no peft_base.json" in (checkpoints.base_problem(str(ckpt), record) or "")
    checkpoints.write_base_record(str(ckpt), record)
    assert checkpoints.base_problem(str(ckpt), record) is None
    # The same size, one byte changed in the middle MiB: another fingerprint, and the line says how to resume.
    moved = checkpoints.base_record("training.checkpoint.init_from_hf", str(other), str(other))
    problem = checkpoints.base_problem(str(ckpt), moved)
    assert problem is not None and "\n" not in problem
    assert f"set training.checkpoint.init_from_hf={base} to resume" in problem
    assert record.fingerprint[:12] in problem and moved.fingerprint[:12] in problem


def test_a_benchmarks_random_base_is_recorded_by_the_seed_that_drew_it(tmp_path):
    """peft.random_base=true (bench/bench_lora.py) names no weights: its adapters record the seed, and resume only
    on the same draw."""
    from common import checkpoints
    from launcher.config.compose import compose
    from recipes.trainer.build import _base_record

    lora_on_random = ["training=llama31/tiny", "peft=lora", "peft.random_base=true"]
    record = _base_record(compose(lora_on_random), None, rank=0)
    assert record.key == "peft.random_base"
    ckpt = tmp_path / "iter_0000010"
    ckpt.mkdir()
    checkpoints.write_base_record(str(ckpt), record)
    assert checkpoints.base_problem(str(ckpt), record) is None
    other_draw = _base_record(compose([*lora_on_random, "seed=7"]), None, rank=0)
    problem = checkpoints.base_problem(str(ckpt), other_draw)
    assert problem is not None and "\n" not in problem
