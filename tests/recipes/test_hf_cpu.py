"""Hugging Face weights in and out, on the CPU: a random Llama 3.1-shaped model made with transformers (GQA, RoPE
scaling, a vocabulary that is not a multiple of 128, several safetensors shards) is imported into megatron-core
models in several layouts (ranks as gloo processes), checked against transformers' logits, saved with
dist_checkpointing as training saves, exported back and compared tensor by tensor; errors for broken inputs. The
other architectures' features (Llama 3.2's tied embeddings, Llama 2's RoPE without scaling, biases, GeGLU) make the
same round trip."""

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")
pytest.importorskip("tokenizers")

import cpu_megatron  # noqa: E402
from hf_dirs import write_hf_dir  # noqa: E402
from common.run import load_run_config  # noqa: E402
from common.typed import to_plain  # noqa: E402
from common import hf_config  # noqa: E402
from common.plan import Plan  # noqa: E402
from launcher.config.compose import compose  # noqa: E402
from launcher.plan.build import build_plan  # noqa: E402
from launcher.plan.hardware import LocalGpus  # noqa: E402
from common import safetensors_io  # noqa: E402
from recipes.hf import checkpoint_to_hf, exporter, importer, mapping  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(900)

SHAPE = [
    "training.model.vocab_size=1000",
    "training.model.num_layers=6",
    "training.model.hidden_size=64",
    "training.model.ffn_hidden_size=96",
    "training.model.num_attention_heads=4",
    "training.model.num_query_groups=2",
    "training.model.kv_channels=16",
    "training.seq_length=32",
    "training.micro_batch_size=1",
    "training.global_batch_size=4",
    "cluster.gpus_per_node=2",
]
SMALL = ["training=llama31/tiny", *SHAPE]
# The small shape with each architecture's features: a training option and what it changes.
VARIANTS = {
    "llama32_tied": ["training=llama32/1b", *SHAPE],
    "llama2_rope": ["training=llama2/70b", *SHAPE],
    "biases_geglu": [*SMALL, "training.model.add_bias_linear=true", "training.model.activation=geglu"],
}
LAYOUTS = {
    "tp1": ["parallelism=tp1"],
    "tp2": ["parallelism=tp2_sp", "parallelism.sequence_parallel=false", "parallelism.tp_comm_overlap=false"],
    "pp2_vp2_asym": ["parallelism=pp2_vp2_asym"],
}


def configured(layout: str, *extra: str, small: list[str] = SMALL) -> tuple[dict, Plan]:
    cfg = compose([*small, *LAYOUTS[layout], *extra])
    plan = build_plan(cfg, LocalGpus(2, "h100", ("gpu",)))
    return cfg, plan


def write_tokenizer(directory: Path) -> None:
    """A small byte-level BPE with Llama 3's special tokens: what an export copies."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"])
    tok.train_from_iterator(["def f(x):\n    return x + 1\n"] * 50, trainer=trainer)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "bos_token": "<|begin_of_text|>",
                "eos_token": "<|end_of_text|>",
                "tokenizer_class": "PreTrainedTokenizerFast",
            }
        )
    )


def make_source(tmp_path_factory, small: list[str]) -> dict:
    """A random model of the small shape `small` in bf16, saved in several shards, with a tokenizer."""
    from transformers import LlamaForCausalLM

    directory = tmp_path_factory.mktemp("hf_source")
    cfg, _ = configured("tp1", small=small)
    model_cfg = cfg.training.model
    torch.manual_seed(0)
    model = LlamaForCausalLM(mapping.hf_config(model_cfg))
    with torch.no_grad():  # large enough weights that every mix-up shows; norms not all ones
        for param in model.parameters():
            if param.dim() == 1:
                param.copy_(1 + 0.2 * torch.randn_like(param))
            else:
                param.normal_(0, 0.15)
    model = model.to(torch.bfloat16)
    model.save_pretrained(directory, max_shard_size="200KB")
    tokenizer = tmp_path_factory.mktemp("tokenizer")
    write_tokenizer(tokenizer)
    shards = sorted(p.name for p in directory.glob("*.safetensors"))
    assert len(shards) >= 3 and (directory / safetensors_io.INDEX_FILE).is_file(), shards
    tokens = torch.randint(0, model_cfg.vocab_size, (2, 32), generator=torch.Generator().manual_seed(1))
    # Loaded back, not the model above: .to(bfloat16) also rounded its RoPE frequency buffer.
    reference = LlamaForCausalLM.from_pretrained(directory, dtype=torch.float32)
    with torch.no_grad():
        logits = reference(tokens).logits
    return {
        "dir": directory,
        "tokenizer": tokenizer,
        "tokens": tokens,
        "logits": logits,
        "model": model_cfg,
        "small": small,
    }


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> dict:
    return make_source(tmp_path_factory, SMALL)


@pytest.fixture(scope="module", params=list(VARIANTS))
def variant_source(request, tmp_path_factory) -> dict:
    return make_source(tmp_path_factory, VARIANTS[request.param])


def with_tokenizer(source: dict) -> list[str]:
    return ["training.tokenizer.type=huggingface", f"training.tokenizer.path={source['tokenizer']}"]


# --------------------------------------------------------------------------- import: logits and padding rows
def import_and_forward(rank: int, cfg: dict, plan: Plan, hf_dir: str, tokens):
    from megatron.core import parallel_state as ps

    chunks = cpu_megatron.build_chunks(cfg, plan)
    importer.load_hf_weights(
        hf_dir, chunks, cfg.training.model, plan.padded_vocab_size, lambda m: None, show_progress=False
    )
    logits = cpu_megatron.tp_logits(chunks[0], tokens)
    embedding = chunks[0].embedding.word_embeddings.weight.detach().clone()
    output = chunks[0].output_layer.weight  # none of its own with tied embeddings: the embedding is the output
    output = embedding if output is None else output.detach().clone()
    return ps.get_tensor_model_parallel_rank(), logits, embedding, output


def imported_logits_match(layout: str, source: dict) -> tuple[list, Plan]:
    """Import `source` into megatron in `layout`: its logits are transformers'. The ranks' results, and the plan."""
    cfg, plan = configured(layout, *with_tokenizer(source), small=source["small"])
    results = cpu_megatron.run_ranks(import_and_forward, plan.num_gpus, cfg, plan, str(source["dir"]), source["tokens"])
    logits = results[0][1][..., : source["model"].vocab_size]
    ref = source["logits"]
    diff = (logits - ref).abs().max().item()
    print(
        f"\n{layout}: megatron (fp32, imported) vs transformers (fp32) logits: max |diff| {diff:.2e}, "
        f"logit scale {ref.abs().max().item():.1f}"
    )
    assert diff < 1e-3 * ref.abs().max().item()
    return results, plan


@pytest.mark.parametrize("layout", ["tp1", "tp2"])
def test_import_gives_transformers_logits(layout, source):
    results, plan = imported_logits_match(layout, source)

    # Vocabulary padding rows are copies of the last vocabulary row, in both the embedding and the output layer.
    vocab, padded = source["model"].vocab_size, plan.padded_vocab_size
    assert padded > vocab
    for position, name in ((2, "model.embed_tokens.weight"), (3, "lm_head.weight")):
        full = torch.cat([r[position] for r in sorted(results, key=lambda r: r[0])])
        assert full.shape[0] == padded
        original = importer.SafetensorsDir(source["dir"]).read(name, slice(0, vocab), None).float()
        assert torch.equal(full[:vocab], original)
        assert torch.equal(full[vocab:], original[-1:].expand(padded - vocab, -1))


# --------------------------------------------------------------------------- checkpoints of any layout -> export
def import_and_save(rank: int, cfg: dict, plan: Plan, hf_dir: str, run_dir: str) -> str:
    chunks = cpu_megatron.build_chunks(cfg, plan)
    importer.load_hf_weights(
        hf_dir, chunks, cfg.training.model, plan.padded_vocab_size, lambda m: None, show_progress=False
    )
    return cpu_megatron.save_checkpoint(rank, chunks, run_dir)


def checkpoint_from(hf_dir: Path, layout: str, run_dir: Path, source: dict) -> Path:
    cfg, plan = configured(layout, *with_tokenizer(source), small=source["small"])
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(to_plain(cfg)))  # as main.py writes it; export reads it
    path = cpu_megatron.run_ranks(import_and_save, plan.num_gpus, cfg, plan, str(hf_dir), str(run_dir))[0]
    return Path(path)


def tensors_of(directory: Path) -> dict:
    from safetensors.torch import load_file

    out = {}
    for file in sorted(directory.glob("*.safetensors")):
        out.update(load_file(file))
    return out


@pytest.fixture(scope="module")
def pp_checkpoint(source, tmp_path_factory) -> Path:
    return checkpoint_from(source["dir"], "pp2_vp2_asym", tmp_path_factory.mktemp("run_pp") / "run", source)


@pytest.mark.slow
def test_export_of_a_tp2_and_a_pp2_vp2_checkpoint_gives_back_the_source_weights(source, pp_checkpoint, tmp_path):
    from transformers import AutoModelForCausalLM

    original = tensors_of(source["dir"])
    tp_checkpoint = checkpoint_from(source["dir"], "tp2", tmp_path / "run_tp", source)
    for name, ckpt in (("tp2", tp_checkpoint), ("pp2_vp2_asym", pp_checkpoint)):
        out = tmp_path / f"export_{name}"
        code = exporter.main(
            ["--checkpoint", str(ckpt), "--out", str(out), "--max-shard-size", "150KB", "--no-progress"]
        )
        assert code == 0
        exported = tensors_of(out)
        assert sorted(exported) == sorted(original)
        different = [k for k in original if not torch.equal(exported[k], original[k])]
        assert not different, different
        index = json.loads((out / safetensors_io.INDEX_FILE).read_text())
        assert set(index["weight_map"]) == set(original) and len(set(index["weight_map"].values())) >= 3
        config = json.loads((out / "config.json").read_text())
        assert config["architectures"] == ["LlamaForCausalLM"] and config["num_key_value_heads"] == 2
        assert config["rope_scaling"]["rope_type"] == "llama3" and config["rope_scaling"]["factor"] == 8.0
        tokenizer_ids = json.loads((source["tokenizer"] / "tokenizer.json").read_text())["added_tokens"]
        ids = {t["content"]: t["id"] for t in tokenizer_ids}
        assert (config["bos_token_id"], config["eos_token_id"]) == (ids["<|begin_of_text|>"], ids["<|end_of_text|>"])
        assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == ids["<|end_of_text|>"]
        assert (out / "tokenizer.json").read_bytes() == (source["tokenizer"] / "tokenizer.json").read_bytes()
        assert not list(out.glob(".*"))  # no temporary files or export manifest left behind
        reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
        with torch.no_grad():
            logits = reloaded(source["tokens"]).logits
        print(
            f"\n{name}: exported model's logits vs the source model's: max |diff| "
            f"{(logits - source['logits']).abs().max().item():.1e}"
        )
        assert torch.equal(logits, source["logits"])


def test_each_architecture_feature_makes_the_round_trip(variant_source, tmp_path):
    """Tied embeddings (the last pipeline stage holds megatron's copy of the embedding), RoPE without scaling, biases
    and GeGLU: the import gives transformers' logits (TP2), a PP2 x VP2 checkpoint exports the source's tensors, and
    transformers' forward on the export gives the source's logits."""
    from transformers import AutoModelForCausalLM

    imported_logits_match("tp2", variant_source)
    checkpoint = checkpoint_from(variant_source["dir"], "pp2_vp2_asym", tmp_path / "run", variant_source)
    out = tmp_path / "export"
    assert exporter.main(["--checkpoint", str(checkpoint), "--out", str(out), "--no-progress"]) == 0
    original, exported = tensors_of(variant_source["dir"]), tensors_of(out)
    assert sorted(exported) == sorted(original)
    different = [k for k in original if not torch.equal(exported[k], original[k])]
    assert not different, different
    model = variant_source["model"]
    assert hf_config.differences(json.loads((out / "config.json").read_text()), model) == []
    assert ("lm_head.weight" in exported) != model.share_embeddings_and_output_weights
    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    with torch.no_grad():
        logits = reloaded(variant_source["tokens"]).logits
    print(
        f"\nexported model's logits vs the source model's: max |diff| "
        f"{(logits - variant_source['logits']).abs().max().item():.1e}"
    )
    assert torch.equal(logits, variant_source["logits"])


def test_export_import_export_is_byte_identical(source, pp_checkpoint, tmp_path):
    first = tmp_path / "first"
    assert (
        exporter.main(
            ["--checkpoint", str(pp_checkpoint), "--out", str(first), "--max-shard-size", "150KB", "--no-progress"]
        )
        == 0
    )
    again = checkpoint_from(first, "tp1", tmp_path / "run_again", source)
    second = tmp_path / "second"
    assert (
        exporter.main(["--checkpoint", str(again), "--out", str(second), "--max-shard-size", "150KB", "--no-progress"])
        == 0
    )
    files = sorted(p.name for p in first.iterdir())
    assert files == sorted(p.name for p in second.iterdir())
    assert len([f for f in files if f.endswith(".safetensors")]) >= 3
    for name in files:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


def test_an_interrupted_export_resumes_and_keeps_finished_shards(pp_checkpoint, tmp_path):
    out = tmp_path / "out"
    args = ["--checkpoint", str(pp_checkpoint), "--out", str(out), "--max-shard-size", "150KB", "--no-progress"]
    assert exporter.main(args) == 0
    reference = {p.name: p.read_bytes() for p in out.iterdir()}
    # As if killed after the first shard: the manifest is back, later shards and the index are gone.
    shards = sorted(p for p in out.glob("model-*.safetensors"))
    for path in shards[1:] + [out / safetensors_io.INDEX_FILE, out / "config.json"]:
        path.unlink()
    stamp = shards[0].stat().st_mtime_ns
    checkpoint = checkpoint_to_hf.resolve_checkpoint(pp_checkpoint)
    model = load_run_config(pp_checkpoint.parents[1]).training.model
    manifest = {
        "checkpoint": str(checkpoint),
        "dtype": "bfloat16",
        "shards": checkpoint_to_hf.shard_plan(mapping.hf_shapes(model), 2, 150_000),
    }
    (out / checkpoint_to_hf.MANIFEST).write_text(json.dumps(manifest))
    assert exporter.main(args) == 0
    assert shards[0].stat().st_mtime_ns == stamp  # kept, not rewritten
    assert {p.name: p.read_bytes() for p in out.iterdir()} == reference
    # A different export into the same, non-empty directory is refused.
    assert exporter.main([*args[:-1], "--dtype", "float32", "--no-progress"]) == 2


# --------------------------------------------------------------------------- the file format
def test_a_header_we_encode_is_what_safetensors_and_our_reader_read(tmp_path):
    from safetensors import safe_open

    shapes = {"b": (3, 2), "a": (5,)}
    tensors = {"b": torch.arange(6, dtype=torch.bfloat16).reshape(3, 2), "a": torch.ones(5, dtype=torch.bfloat16)}
    path = tmp_path / "x.safetensors"
    with open(path, "wb") as f:
        f.write(safetensors_io.encode_header(["b", "a"], shapes, "bfloat16", 2))
        for name in ("b", "a"):
            f.write(tensors[name].view(torch.uint8).numpy().tobytes())
    with safe_open(str(path), framework="pt") as f:
        assert all(torch.equal(f.get_tensor(n), tensors[n]) for n in tensors)
    header = safetensors_io.read_header(path)
    assert header["b"] == {"dtype": "BF16", "shape": [3, 2], "data_offsets": [0, 12]}
    assert header["a"]["data_offsets"] == [12, 22]
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(safetensors_io.SafetensorsFileError, match=r"x.safetensors is truncated: .* declares"):
        safetensors_io.read_header(path)


# --------------------------------------------------------------------------- errors
def test_export_refuses_incomplete_and_truncated_checkpoints(pp_checkpoint, tmp_path, capsys):
    def broken(name: str, damage) -> Path:
        copy = tmp_path / name / "checkpoints" / pp_checkpoint.name
        shutil.copytree(pp_checkpoint, copy)
        shutil.copy(pp_checkpoint.parents[1] / "config.yaml", tmp_path / name / "config.yaml")
        damage(copy)
        return copy

    def export_error(path: Path) -> str:
        assert exporter.main(["--checkpoint", str(path), "--out", str(tmp_path / "never"), "--no-progress"]) == 2
        return capsys.readouterr().err

    unfinished = broken("unfinished", lambda p: (p / "train_state.json").unlink())
    assert "not a complete checkpoint (no train_state.json" in export_error(unfinished)

    def truncate(path: Path) -> None:
        data = max(path.glob("*.distcp"), key=lambda f: f.stat().st_size)
        data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])

    assert "is truncated" in export_error(broken("truncated", truncate))
    assert "has no .metadata" in export_error(broken("nometa", lambda p: (p / ".metadata").unlink()))
    assert not (tmp_path / "never").exists()


def test_import_errors_name_the_file_and_the_fix(source, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(source["dir"], copy)
    shard = sorted(copy.glob("*.safetensors"))[1]
    shard.write_bytes(shard.read_bytes()[:-100])
    name = next(n for n, f in importer.SafetensorsDir(copy).weight_map.items() if f == shard.name)
    with pytest.raises(importer.SourceError, match=f"{shard.name} is truncated.*download it again"):
        importer.SafetensorsDir(copy).read(name, slice(0, 1), None)

    (copy / safetensors_io.INDEX_FILE).unlink()
    with pytest.raises(importer.SourceError, match="no model.safetensors.index.json"):
        importer.SafetensorsDir(copy)

    smaller = dataclasses.replace(source["model"], num_layers=7)
    with pytest.raises(importer.SourceError, match=r"no tensor model\.layers\.6\."):
        importer.SafetensorsDir(source["dir"]).check(mapping.hf_shapes(smaller))


def test_config_mismatch_names_the_keys(source):
    config = hf_config.read_config(source["dir"])
    hf_config.check(config, source["model"], "src")  # the saved model fits its own config
    wrong = dataclasses.replace(source["model"], num_query_groups=4, rotary_base=10000)
    with pytest.raises(hf_config.HFConfigError) as err:
        hf_config.check(config, wrong, "src")
    message = str(err.value)
    assert "\n" not in message
    assert "num_key_value_heads=2 vs training.model.num_query_groups=4" in message
    assert "rope_theta=500000.0 vs training.model.rotary_base=10000" in message


# --------------------------------------------------------------------------- before any GPU work
def fake_llama_dir(directory: Path, **changes) -> Path:
    """config.json of Meta's Llama 3.1 8B (transformers 4 layout), with changes, and the header of every tensor of
    that model (tests/hf_dirs.py)."""
    model = compose(["training=llama31/8b"]).training.model
    config = hf_config.llama_config(model, torch_dtype="bfloat16", bos_token_id=128000, eos_token_id=128001)
    config.update(changes)
    return write_hf_dir(directory, config, model)


def main_py(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "main.py"), *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def test_plan_rejects_a_mismatching_config_before_writing_anything(tmp_path):
    wrong = fake_llama_dir(tmp_path / "wrong", num_key_value_heads=16)
    result = main_py(
        "training=llama31/8b",
        "cluster=bcm",
        "cluster.container_runtime=none",
        "dry_run=true",
        f"results_dir={tmp_path / 'results'}",
        f"training.checkpoint.init_from_hf={wrong}",
        cwd=tmp_path,
    )
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "num_key_value_heads=16 vs training.model.num_query_groups=8" in errors[0], errors
    assert not (tmp_path / "results").exists()

    right = fake_llama_dir(tmp_path / "right")
    result = main_py(
        "training=llama31/8b",
        "cluster=bcm",
        "cluster.container_runtime=none",
        "dry_run=true",
        f"results_dir={tmp_path / 'results'}",
        f"training.checkpoint.init_from_hf={right}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr


def test_training_ranks_check_the_config_before_touching_a_gpu(tmp_path):
    """The rank-side check runs before CUDA or NCCL start: on this GPU-less machine the rank stops with the
    config error, not with the missing GPU."""
    source = fake_llama_dir(tmp_path / "weights")
    result = main_py(
        "training=llama31/8b",
        "cluster=bcm",
        "cluster.container_runtime=none",
        "dry_run=true",
        "stack_check=false",
        f"results_dir={tmp_path / 'results'}",
        "run_name=r",
        f"training.checkpoint.init_from_hf={source}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    fake_llama_dir(source, num_key_value_heads=16)  # changed after planning
    env = dict(os.environ, RANK="0", WORLD_SIZE="8", LOCAL_RANK="0", PYTHONPATH=str(REPO))
    rank = subprocess.run(
        [sys.executable, "-m", "recipes.train", "--run-dir", str(tmp_path / "results" / "r")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert rank.returncode != 0
    last = rank.stderr.strip().splitlines()[-1]
    assert last.startswith("error: training.checkpoint.init_from_hf=") and "num_key_value_heads=16" in last, (
        rank.stderr[-2000:]
    )
    assert "CUDA" not in rank.stderr and "GPU" not in rank.stderr


def test_the_export_stage_exports_the_newest_checkpoint_of_a_run(source, pp_checkpoint, tmp_path):
    results = tmp_path / "results"
    shutil.copytree(pp_checkpoint.parent, results / "r" / "checkpoints")
    overrides = [o for o in SMALL if not o.startswith("cluster.")]
    result = main_py(
        *overrides,
        *LAYOUTS["pp2_vp2_asym"],
        *with_tokenizer(source),
        "stages=[export]",
        f"results_dir={results}",
        "run_name=r",
        "training.checkpoint.export_max_shard_size=150KB",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    exported, original = tensors_of(results / "r" / "hf"), tensors_of(source["dir"])
    assert sorted(exported) == sorted(original)
    assert all(torch.equal(exported[k], original[k]) for k in original)
    assert "exported" in (results / "r" / "logs" / "export.log").read_text()


# --------------------------------------------------------------------------- hub ids
def fake_hub_snapshot(cache: Path, repo_id: str, **changes) -> Path:
    """The layout huggingface_hub leaves in its cache: refs/main names the snapshot of the main revision."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    return fake_llama_dir(repo / "snapshots" / "abc123", **changes)


def test_the_plan_checks_a_cached_hub_id_and_refuses_one_for_several_nodes(tmp_path, monkeypatch):
    from launcher.cli import prepare
    from launcher.plan.errors import PlanError

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    fake_hub_snapshot(tmp_path / "hub", "meta-llama/Llama-3.1-8B", num_hidden_layers=80)
    base = [
        "training=llama31/8b",
        "cluster=bcm",
        "cluster.container_runtime=none",
        "dry_run=true",
        f"results_dir={tmp_path / 'results'}",
        "memory_check=false",
    ]
    with pytest.raises(PlanError, match="num_hidden_layers=80 vs training.model.num_layers=32"):
        prepare(compose([*base, "training.checkpoint.init_from_hf=meta-llama/Llama-3.1-8B"]))
    # Not cached: nothing to check yet (rank 0 downloads it); with several nodes a shared directory is required.
    prepare(
        compose(
            [
                *base,
                "training.checkpoint.init_from_hf=meta-llama/Llama-3.1-70B",
                "parallelism=tp1",
                "parallelism.num_gpus=8",
                "training.global_batch_size=8",
            ]
        )
    )
    with pytest.raises(PlanError, match=r"hub id.*2-node job.*recipes.hf.importer fetch"):
        prepare(
            compose(
                [
                    *base,
                    "training.checkpoint.init_from_hf=meta-llama/Llama-3.1-70B",
                    "parallelism=tp1",
                    "parallelism.num_gpus=16",
                    "training.global_batch_size=16",
                ]
            )
        )
    with pytest.raises(PlanError, match="init_from and training.checkpoint.init_from_hf are both set"):
        prepare(
            compose(
                [
                    *base,
                    "training.checkpoint.init_from_hf=meta-llama/Llama-3.1-8B",
                    "training.checkpoint.init_from=/somewhere/iter_0000010",
                ]
            )
        )


def test_rank_zero_downloads_a_hub_id_and_the_others_read_where(tmp_path, monkeypatch):
    snapshot = fake_llama_dir(tmp_path / "snapshot")
    downloads = []
    monkeypatch.setattr(importer, "download", lambda repo, local_dir=None: downloads.append(repo) or str(snapshot))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    assert importer.locate("meta-llama/Llama-3.1-8B", str(run_dir), rank=0) == str(snapshot)
    assert importer.locate("meta-llama/Llama-3.1-8B", str(run_dir), rank=5) == str(snapshot)
    assert downloads == ["meta-llama/Llama-3.1-8B"]  # once, by rank 0
    cfg = compose(["training=llama31/8b", "training.checkpoint.init_from_hf=meta-llama/Llama-3.1-8B"])
    assert importer.source_for_run(cfg, str(run_dir), rank=3) == str(snapshot)
    # A rank that cannot see rank 0's download says so, with the fix.
    (run_dir / ".init_from_hf.json").write_text(json.dumps({"source": "org/other", "path": "/not/shared"}))
    with pytest.raises(importer.SourceError, match="cannot see /not/shared.*HF_HOME"):
        importer.locate("org/other", str(run_dir), rank=1)


def test_a_resumed_lora_run_reads_its_base_again_and_a_resumed_full_run_does_not(tmp_path):
    """A LoRA checkpoint holds the adapters only: the frozen base comes from init_from_hf on every start."""
    from common.checkpoints import TrainState, finalize_checkpoint, partial_path

    base = fake_llama_dir(tmp_path / "base")
    run_dir = tmp_path / "run"
    full = compose(["training=llama31/8b", f"training.checkpoint.init_from_hf={base}"])
    lora = compose(["training=llama31/8b", f"training.checkpoint.init_from_hf={base}", "peft=lora"])
    assert importer.source_for_run(full, str(run_dir), rank=0) == str(base)
    root = run_dir / "checkpoints"
    os.makedirs(partial_path(str(root), 50))
    finalize_checkpoint(str(root), TrainState(step=50, consumed_samples=400))
    assert importer.source_for_run(full, str(run_dir), rank=0) is None  # its own checkpoint holds every weight
    assert importer.source_for_run(lora, str(run_dir), rank=0) == str(base)


def test_a_hub_id_that_cannot_be_downloaded_is_one_line_with_the_fix(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(importer.SourceError) as err:
        importer.download("org/never-cached")
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(
        "downloading training.checkpoint.init_from_hf=org/never-cached failed: "
        "HF_HUB_OFFLINE is set and no copy is cached ("
    )
    assert message.endswith(
        "(python -m recipes.hf.importer fetch org/never-cached --local-dir DIR), into a "
        "directory every node sees, and set training.checkpoint.init_from_hf=DIR"
    )
