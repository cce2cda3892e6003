"""LoRA against Hugging Face PEFT on the CPU, with a tiny random Llama made by transformers:
- our adapters of the fused layers (linear_qkv, linear_fc1) are PEFT's per-projection adapters: a PeftModel (q_proj,
  k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, random lora_B) and our megatron-core model with the same base
  and the adapters mapped from PEFT's tensors give the same logits, at TP1 and TP2; a mapping with k and v swapped
  fails the comparison;
- the mapping is one to one (to PEFT and back gives the same tensors)."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

import cpu_megatron  # noqa: E402
from common.config import LoraConfig, LoraInit, LoraTarget  # noqa: E402
from common.plan import Plan  # noqa: E402
from launcher.config.compose import compose  # noqa: E402
from launcher.plan.build import build_plan  # noqa: E402
from launcher.plan.hardware import LocalGpus  # noqa: E402
from recipes.hf import mapping  # noqa: E402
from recipes.peft import hf as peft_hf  # noqa: E402

pytestmark = pytest.mark.timeout(900)

SMALL = [
    "training=llama31/tiny",
    "training.model.vocab_size=256",
    "training.model.num_layers=2",
    "training.model.hidden_size=64",
    "training.model.ffn_hidden_size=96",
    "training.model.num_attention_heads=4",
    "training.model.num_query_groups=2",
    "training.model.kv_channels=16",
    "training.seq_length=16",
    "training.micro_batch_size=1",
    "training.global_batch_size=2",
    "cluster.gpus_per_node=2",
]
LAYOUTS = {
    "tp1": ["parallelism=tp1"],
    "tp2": ["parallelism=tp2_sp", "parallelism.sequence_parallel=false", "parallelism.tp_comm_overlap=false"],
}
LORA = LoraConfig(
    method="lora",
    rank=4,
    alpha=8.0,
    dropout=0.0,
    target_modules=list(LoraTarget),
    a_init=LoraInit.kaiming_uniform,
    b_init=LoraInit.zero,
)


def configured(layout: str) -> tuple:
    cfg = compose([*SMALL, *LAYOUTS[layout]])
    return cfg, build_plan(cfg, LocalGpus(2, "h100", ("gpu",)))


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
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg, _ = configured("tp1")
    model_cfg = cfg.training.model
    directory = tmp_path_factory.mktemp("hf_base")
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**mapping.hf_config_kwargs(model_cfg)))
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
    cfg, plan = configured(layout)
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
