"""LoRA against Hugging Face PEFT on the CPU, with a tiny random Llama made by transformers:
- our adapters of the fused layers (linear_qkv, linear_fc1) are PEFT's per-projection adapters: a PeftModel (q_proj,
  k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, random lora_B) and our megatron-core model with the same base
  and the adapters mapped from PEFT's tensors give the same logits, at TP1 and TP2; a mapping with k and v swapped
  fails the comparison;
- the mapping is one to one (to PEFT and back gives the same tensors)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

import cpu_megatron  # noqa: E402
from common.config import LoraTarget  # noqa: E402
from common.plan import Plan  # noqa: E402
from recipes.hf import mapping  # noqa: E402
from recipes.peft import hf as peft_hf  # noqa: E402

pytestmark = pytest.mark.timeout(900)

LORA = cpu_megatron.LORA


def peft_model(base_dir: Path):
    """A PeftModel on the saved base: LoRA on every projection, B drawn at random (PEFT starts it at zero)."""
    from transformers import LlamaForCausalLM

    base = LlamaForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    config = peft.LoraConfig(
        r=LORA.rank,
        lora_alpha=LORA.alpha,
        lora_dropout=0.0,
        target_modules=peft_hf.peft_modules(list(LORA.target_modules)),
    )
    model = peft.get_peft_model(base, config)
    torch.manual_seed(11)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.3)
    return model.eval()


@pytest.fixture(scope="module")
def hf(tmp_path_factory) -> dict:
    """A random tiny Llama saved in Hugging Face format, a PeftModel on it, its logits and PEFT's adapter tensors."""
    from transformers import LlamaForCausalLM

    cfg, _ = cpu_megatron.small_run("tp1")
    model_cfg = cfg.training.model
    directory = tmp_path_factory.mktemp("hf_base")
    torch.manual_seed(0)
    model = LlamaForCausalLM(mapping.hf_config(model_cfg))
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 1:
                param.copy_(1 + 0.2 * torch.randn_like(param))
            else:
                param.normal_(0, 0.15)
    model.save_pretrained(directory)
    tokens = torch.randint(0, model_cfg.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1))
    reference = peft_model(directory)
    with torch.no_grad():
        logits = reference(tokens).logits
    adapters = {k: v.detach().clone() for k, v in reference.state_dict().items() if "lora_" in k}
    # PEFT's state dict names carry the adapter's name ("default"); its saved files do not.
    adapters = {k.replace(".default.weight", ".weight"): v for k, v in adapters.items()}
    return {"dir": directory, "tokens": tokens, "logits": logits, "adapters": adapters, "model": model_cfg}


def with_peft_adapters(rank: int, cfg, plan: Plan, hf_dir: str, adapters: dict, tokens, swap_kv: bool) -> dict:
    """Our model: the Hugging Face base imported, LoRA applied, every adapter set from PEFT's tensors (mapped by
    from_peft, then this rank's shard); its logits."""
    from megatron.core.transformer.transformer_layer import TransformerLayer

    from recipes.hf import importer
    from recipes.peft import lora

    chunks = cpu_megatron.build_chunks(cfg, plan)
    importer.load_hf_weights(hf_dir, chunks, cfg.training.model, plan.padded_vocab_size, lambda m: None, False)
    lora.apply_lora(chunks, LORA, seed=5)
    if swap_kv:  # the negative control: k's adapter where v's belongs, and v's where k's
        adapters = dict(adapters)
        for key in [k for k in adapters if ".k_proj." in k]:
            other = key.replace(".k_proj.", ".v_proj.")
            adapters[key], adapters[other] = adapters[other], adapters[key]
    with torch.no_grad():
        for layer in (m for m in chunks[0].modules() if isinstance(m, TransformerLayer)):
            for target in LORA.target_modules:
                parent, name = lora.TARGETS[target]
                adapter = getattr(getattr(layer, parent), name + lora.ADAPTER_SUFFIX)
                a, b = peft_hf.from_peft(target, layer.layer_number - 1, adapters, cfg.training.model)
                local_a, local_b = adapter.sharding.shard(a, b)
                adapter.a.copy_(local_a)
                adapter.b.copy_(local_b)
    return {"logits": cpu_megatron.tp_logits(chunks[0], tokens)}


def our_logits(layout: str, hf: dict, swap_kv: bool = False) -> torch.Tensor:
    cfg, plan = cpu_megatron.small_run(layout)
    args = (cfg, plan, str(hf["dir"]), hf["adapters"], hf["tokens"], swap_kv)
    found = cpu_megatron.run_ranks(with_peft_adapters, plan.num_gpus, *args)[0]
    return found["logits"][..., : hf["model"].vocab_size]


def logit_error(ours: torch.Tensor, reference: torch.Tensor) -> float:
    return ((ours - reference).abs().max() / reference.abs().max()).item()


@pytest.mark.parametrize("layout", ["tp1", pytest.param("tp2", marks=pytest.mark.slow)])
def test_our_fused_adapters_are_pefts_per_projection_adapters(layout, hf):
    error = logit_error(our_logits(layout, hf), hf["logits"])
    print(f"\n{layout}: our LoRA vs PEFT logits, max |diff| / max |logit| = {error:.2e}")
    assert error < 1e-4


@pytest.mark.slow
def test_a_mapping_with_k_and_v_swapped_fails_the_comparison(hf):
    # k and v have the same shapes, so a mix-up would load without complaint: only the logits tell.
    assert logit_error(our_logits("tp1", hf, swap_kv=True), hf["logits"]) > 1e-2


def test_the_mapping_is_one_to_one(hf):
    model = hf["model"]
    for layer in range(model.num_layers):
        for target in LoraTarget:
            a, b = peft_hf.from_peft(target, layer, hf["adapters"], model)
            n = len(peft_hf.HF_MODULES[target])
            assert a.shape[0] == n * LORA.rank and b.shape[1] == LORA.rank
            back = peft_hf.to_peft(target, layer, a, b, model)
            assert back.keys() <= hf["adapters"].keys()
            assert all(torch.equal(v, hf["adapters"][k]) for k, v in back.items())
    mapped = {
        k
        for layer in range(model.num_layers)
        for target in LoraTarget
        for k in peft_hf.to_peft(target, layer, *peft_hf.from_peft(target, layer, hf["adapters"], model), model)
    }
    assert mapped == set(hf["adapters"])  # every PEFT tensor, none twice


# --------------------------------------------------------------------------- exports
def lora_checkpoint(rank: int, cfg, plan: Plan, hf_dir: str, run_dir: str, tokens) -> dict:
    """What a LoRA run started from `hf_dir` saves (its adapters, drawn at random here, and the base's record);
    the model's logits."""
    import shutil

    from megatron.core import dist_checkpointing

    from common import checkpoints
    from recipes.hf import importer
    from recipes.peft import lora
    from recipes.trainer import checkpoint

    chunks = cpu_megatron.build_chunks(cfg, plan)
    importer.load_hf_weights(hf_dir, chunks, cfg.training.model, plan.padded_vocab_size, lambda m: None, False)
    lora.apply_lora(chunks, cfg.peft, seed=5)
    root = f"{run_dir}/checkpoints"
    partial = checkpoints.partial_path(root, 10)
    if rank == 0:
        shutil.rmtree(partial, ignore_errors=True)
        os.makedirs(partial)
        record = checkpoints.base_record("training.checkpoint.init_from_hf", hf_dir, hf_dir)
        checkpoints.write_base_record(partial, record)
    torch.distributed.barrier()
    dist_checkpointing.save(checkpoint._model_sharded_state(chunks, adapters_only=True), partial)
    torch.distributed.barrier()
    if rank == 0:
        checkpoints.finalize_checkpoint(root, checkpoints.TrainState(step=10, consumed_samples=0))
    torch.distributed.barrier()
    return {"logits": cpu_megatron.tp_logits(chunks[0], tokens)}


def lora_config(hf_dir: Path, layout: str = "tp2"):
    return cpu_megatron.small_run(
        layout,
        "peft=lora",
        f"peft.rank={LORA.rank}",
        f"peft.alpha={LORA.alpha}",
        "peft.dropout=0",
        "peft.b_init=kaiming_uniform",  # B at random, so the adapters change the model
        f"training.checkpoint.init_from_hf={hf_dir}",
    )


@pytest.fixture(scope="module")
def trained(hf, tmp_path_factory) -> dict:
    """A TP2 LoRA checkpoint of the tiny base, and our model's logits."""
    run_dir = tmp_path_factory.mktemp("lora_run")
    cfg, plan = lora_config(hf["dir"])
    found = cpu_megatron.run_ranks(lora_checkpoint, 2, cfg, plan, str(hf["dir"]), str(run_dir), hf["tokens"])[0]
    vocab = hf["model"].vocab_size
    return {"run_dir": run_dir, "cfg": cfg, "logits": found["logits"][..., :vocab]}


@pytest.mark.slow
def test_the_peft_export_loads_with_peft_and_the_merged_one_with_transformers(hf, trained, tmp_path):
    from transformers import LlamaForCausalLM

    from recipes.hf import checkpoint_to_hf

    ckpt = trained["run_dir"] / "checkpoints"
    adapter_dir = checkpoint_to_hf.export_peft(ckpt, tmp_path / "adapter", run_config=trained["cfg"])
    assert sorted(p.name for p in adapter_dir.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    base = LlamaForCausalLM.from_pretrained(hf["dir"], dtype=torch.float32)
    with torch.no_grad():
        base_logits = base(hf["tokens"]).logits
    with_adapters = peft.PeftModel.from_pretrained(base, str(adapter_dir)).eval()
    merged_dir = checkpoint_to_hf.export(
        ckpt, tmp_path / "merged", run_config=trained["cfg"], dtype="float32", copy_tokenizer=False, progress=False
    )
    merged = LlamaForCausalLM.from_pretrained(merged_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        peft_logits, merged_logits = with_adapters(hf["tokens"]).logits, merged(hf["tokens"]).logits
    ours = trained["logits"]
    # The adapters change the model (B at random), and both exports compute what our model computes.
    assert logit_error(base_logits, ours) > 1e-2
    assert logit_error(peft_logits, ours) < 1e-4, logit_error(peft_logits, ours)
    assert logit_error(merged_logits, ours) < 1e-4, logit_error(merged_logits, ours)


@pytest.mark.slow
def test_exports_of_a_lora_checkpoint_refuse_another_base_in_one_line(hf, trained, tmp_path, capsys):
    import shutil

    from recipes.hf import exporter

    other = tmp_path / "other_base"
    shutil.copytree(hf["dir"], other)
    weights = next(other.glob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # one bit of the last weight: the same shapes, another base
    weights.write_bytes(bytes(data))
    config = tmp_path / "config.yaml"
    import yaml

    from common.typed import to_plain

    config.write_text(yaml.safe_dump(to_plain(trained["cfg"])))
    ckpt = str(trained["run_dir"] / "checkpoints")
    args = ["--checkpoint", ckpt, "--config", str(config), "--no-tokenizer", "--no-progress"]
    assert exporter.main([*args, "--out", str(tmp_path / "out"), "--base", str(other)]) == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith("error: ") and "\n" not in line and "is not the base" in line
    assert not (tmp_path / "out").exists()  # refused before anything is written
    # A full (not LoRA) checkpoint has no adapters to export as PEFT's.
    full = tmp_path / "full_ckpt"
    shutil.copytree(trained["run_dir"] / "checkpoints" / "iter_0000010", full)
    (full / "peft_base.json").unlink()
    assert (
        exporter.main(["--checkpoint", str(full), "--config", str(config), "--peft", "--out", str(tmp_path / "p")]) == 2
    )
    line = capsys.readouterr().err.strip()
    assert "is not a LoRA adapter checkpoint" in line and "\n" not in line
