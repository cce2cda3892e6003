"""The models of conf/training/ against Meta's published config.json (tests/fixtures/hf_configs/, as the hub has them;
Llama 2's predate `rope_theta`, so transformers' default 10000 applies): every architecture key matches, a dry run
of `python main.py training=<model>` plans the parameters that transformers counts in the same model built on the
meta device, within 0.5% of the published size; the default layouts plan on 1 and 8 GPUs; tied embeddings are one
matrix in the count and in the memory estimate where the stages share them."""

from __future__ import annotations

import dataclasses
import json

import pytest
import yaml

from common import hf_config
from common.config import load_config
from hf_dirs import write_hf_dir
from launcher.config.compose import compose_plain
from launcher.plan.build import build_plan
from launcher.plan.errors import PlanError
from launcher.plan.formulas import num_parameters

from launcher_helpers import EIGHT_H100, REPO, planned, run_main

HF_CONFIGS = REPO / "tests" / "fixtures" / "hf_configs"
# training option -> (Meta's repository on the hub, the parameters its model card gives, what its dry run needs)
MODELS = {
    "llama32/1b": ("Llama-3.2-1B", 1.24e9, []),
    "llama32/3b": ("Llama-3.2-3B", 3.21e9, []),
    "llama2/70b": ("Llama-2-70b-hf", 69.0e9, ["cluster=bcm", "cluster.container_runtime=none"]),
}


def published(option: str) -> dict:
    return json.loads((HF_CONFIGS / f"{MODELS[option][0]}.json").read_text())


def transformers_count(config: dict) -> int:
    """Parameters of transformers' LlamaForCausalLM of `config`, built on the meta device (no memory); tied
    weights count once, as nn.Module.parameters() gives them."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig.from_dict(config))
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("option", list(MODELS))
def test_the_spec_is_the_published_architecture(cfg_for, option):
    model = cfg_for(f"training={option}").training.model
    config = published(option)
    assert hf_config.differences(config, model) == []
    assert model.max_position_embeddings == config["max_position_embeddings"]
    # And the config.json an export writes says the same.
    assert (
        hf_config.differences(
            hf_config.llama_config(model, torch_dtype="bfloat16", bos_token_id=None, eos_token_id=None), model
        )
        == []
    )


@pytest.mark.parametrize("option", list(MODELS))
def test_a_dry_run_plans_the_published_parameter_count(option, tmp_path):
    _, size, extra = MODELS[option]
    result = run_main(f"training={option}", *extra, "dry_run=true", f"results_dir={tmp_path}", "run_name=r")
    assert result.returncode == 0, result.stderr
    planned_count = json.loads((tmp_path / "r" / "plan.json").read_text())["num_parameters"]
    counted = transformers_count(published(option))
    print(f"\n{option}: plan {planned_count:,}, transformers {counted:,}, published {size:.3g}")
    assert planned_count == counted
    assert abs(planned_count - size) <= 0.005 * size


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
@pytest.mark.parametrize("gpus", [1, 8])
@pytest.mark.parametrize("option", ["llama32/1b", "llama32/3b"])
def test_llama32_default_layout_plans_on_one_gpu_and_on_eight(cfg_for, option, gpus, dtype):
    plan = planned(cfg_for(f"training={option}", f"dtype={dtype}", f"parallelism.num_gpus={gpus}"), EIGHT_H100)
    assert (plan.tp, plan.pp, plan.cp, plan.dp, plan.num_gpus) == (1, 1, 1, gpus, gpus)
    assert plan.cannot_train_reason is None


@pytest.mark.parametrize(
    "dtype,layout", [("bf16", "tp4_pp4_cp2_vp5"), ("fp8", "tp4_pp8_vp5"), ("nvfp4", "tp4_pp8_vp5")]
)
def test_llama2_70b_takes_the_70b_reference_layouts(cfg_for, dtype, layout):
    cfg = cfg_for("training=llama2/70b", f"dtype={dtype}", "cluster=bcm", "dry_run=true")
    assert cfg.parallelism.name == layout
    if dtype != "nvfp4":  # Blackwell only: H100 nodes refuse it
        planned(cfg)


def test_tied_embeddings_are_one_matrix_where_the_stages_share_them(cfg_for):
    tied = cfg_for("training=llama32/1b").training.model
    untied = dataclasses.replace(tied, share_embeddings_and_output_weights=False)
    assert num_parameters(untied) - num_parameters(tied) == tied.vocab_size * tied.hidden_size
    one_stage = {"parallelism.num_gpus": 8}
    two_stages = {"parallelism": "pp2_vp2_asym", "parallelism.num_gpus": 8, "parallelism.vp": "null"}

    def memory(model, layout: dict) -> float:
        cfg = cfg_for("training=llama32/1b", "cluster=bcm", *(f"{k}={v}" for k, v in layout.items()))
        cfg = dataclasses.replace(cfg, training=dataclasses.replace(cfg.training, model=model))
        return build_plan(cfg).est_memory_gib_per_gpu

    # One stage holds both ends: untied, a second vocabulary x hidden matrix with its gradient and Adam state.
    assert memory(untied, one_stage) > memory(tied, one_stage) + 0.5
    # Two stages: the last keeps a copy of the shared matrix (megatron-core), as many bytes as an output layer.
    assert memory(untied, two_stages) == memory(tied, two_stages)


# --------------------------------------------------------------------------- the architecture from config.json
def llama32_1b_dir(tmp_path, **changes) -> str:
    """Meta's Llama 3.2 1B config.json (with changes) and the header of every tensor of that model."""
    model = load_config(compose_plain(["training=llama32/1b"])).training.model  # the published model's tensors
    return str(write_hf_dir(tmp_path / "Llama-3.2-1B", {**published("llama32/1b"), **changes}, model))


def test_from_hf_takes_the_architecture_from_the_checkpoint(tmp_path):
    weights = llama32_1b_dir(tmp_path)
    base = ["training=llama31/8b", "cluster=bcm", "cluster.container_runtime=none", "dry_run=true", "run_name=r"]
    result = run_main(
        *base,
        f"results_dir={tmp_path / 'a'}",
        f"training.checkpoint.init_from_hf={weights}",
        "training.model.from_hf=true",
    )
    assert result.returncode == 0, result.stderr
    config = yaml.safe_load((tmp_path / "a" / "r" / "config.yaml").read_text())
    model = config["training"]["model"]  # config.yaml records what config.json said
    assert (model["num_layers"], model["hidden_size"], model["kv_channels"]) == (16, 2048, 64)
    assert model["share_embeddings_and_output_weights"] and model["rope_scaling"]["factor"] == 32.0
    assert json.loads((tmp_path / "a" / "r" / "plan.json").read_text())["num_parameters"] == 1_235_814_400

    # Without from_hf the 8B keys stay, and the plan names each way the checkpoint differs, in one line.
    result = run_main(*base, f"results_dir={tmp_path / 'b'}", f"training.checkpoint.init_from_hf={weights}")
    assert result.returncode == 2
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    for difference in (
        "num_hidden_layers=16 vs training.model.num_layers=32",
        "tie_word_embeddings=true vs training.model.share_embeddings_and_output_weights=false",
        "rope_scaling.factor=32.0 vs training.model.rope_scaling.factor=8.0",
        "training.model.from_hf=true",
    ):
        assert difference in line, line
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize(
    "changes,overrides,error",
    [
        ({}, [], "training.model.from_hf=true needs training.checkpoint.init_from_hf"),
        ({"hidden_act": "gelu_new"}, ["init"], "hidden_act=gelu_new (training.model.activation takes silu, gelu)"),
        (
            {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
            ["init"],
            "rope_scaling.rope_type=yarn (only llama3 is supported)",
        ),
        ({"attention_bias": True}, ["init"], "attention_bias=true with mlp_bias=false"),
        ({"num_hidden_layers": 16.5}, ["init"], "training.model.num_layers=16.5 must be an integer"),
        ({"model_type": "mistral"}, ["init"], "is not a Llama checkpoint (model_type=mistral"),
        ({}, ["hub"], "fetch it first (python -m recipes.hf.importer fetch org/not-cached)"),
    ],
)
def test_from_hf_refuses_what_no_model_spec_holds_in_one_line(
    cfg_for, tmp_path, monkeypatch, changes, overrides, error
):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    source = {
        "init": [f"training.checkpoint.init_from_hf={llama32_1b_dir(tmp_path, **changes)}"],
        "hub": ["training.checkpoint.init_from_hf=org/not-cached"],
    }
    extra = [o for key in overrides for o in source[key]]
    with pytest.raises(PlanError) as err:
        planned(cfg_for("training=llama31/8b", "training.model.from_hf=true", "dry_run=true", *extra))
    (line,) = err.value.problems
    assert error in line and "\n" not in line, line


def test_the_plan_refuses_what_megatron_core_and_the_hugging_face_form_cannot_build(cfg_for):
    with pytest.raises(PlanError) as err:
        planned(
            cfg_for(
                "training=llama32/1b",
                "training.model.rope_scaling.low_freq_factor=2.0",
                "training.model.normalization=layernorm",
                "stages=[training,export]",
                "dry_run=true",
            )
        )
    assert err.value.problems == [
        "training.model.rope_scaling.low_freq_factor=2.0: megatron-core's Llama 3 RoPE scaling fixes 1.0; set it to "
        "1.0 (or training.model.rope_scaling=null for none)",
        "training.model.normalization=layernorm (LlamaForCausalLM has rmsnorm only): the Hugging Face weights of "
        "the export stage cannot hold it",
    ]
    planned(cfg_for("training=llama32/1b", "training.model.normalization=layernorm", "dry_run=true"))  # no HF: fine


def test_a_training_option_without_a_default_layout_is_one_line(tmp_path):
    (tmp_path / "site" / "training").mkdir(parents=True)
    (tmp_path / "site" / "training" / "mine.yaml").write_text(
        "defaults:\n  - /training/llama32/_common@_here_\n  - _self_\nname: mine\nmodel: {num_layers: 2, "
        "hidden_size: 64, ffn_hidden_size: 128, num_attention_heads: 8, kv_channels: 8, init_method_std: 0.02}\n"
        "global_batch_size: 8\noptimizer: {lr: 1.0e-4, min_lr: 1.0e-5}\nscheduler: {warmup_steps: 10}\n"
    )
    args = ["--config-dir", str(tmp_path / "site"), "training=mine", "dry_run=true", f"results_dir={tmp_path / 'r'}"]
    result = run_main(*args)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: training=mine names no default layout (training.default_layout.bf16): set it to a layout of "
        "conf/parallelism/ in the option's YAML, or choose one with parallelism=<name>"
    )
    result = run_main(*args, "training.default_layout.bf16=tp9")
    assert result.returncode == 2 and "training.default_layout names parallelism=tp9, which is not a layout" in (
        result.stderr
    )
    assert run_main(*args, "training.default_layout.bf16=tp1", f"results_dir={tmp_path / 'named'}").returncode == 0
    assert run_main(*args, "parallelism=tp1", f"results_dir={tmp_path / 'picked'}").returncode == 0


# --------------------------------------------------------------------------- with the fine-tuning groups
@pytest.mark.parametrize("option", list(MODELS))
def test_each_model_plans_lora_from_its_hugging_face_weights(cfg_for, option, tmp_path):
    _, _, extra = MODELS[option]
    model = cfg_for(f"training={option}").training.model
    weights = write_hf_dir(tmp_path / MODELS[option][0], published(option), model)
    base = [f"training={option}", *extra, f"training.checkpoint.init_from_hf={weights}", "dry_run=true"]
    local_gpus = None if extra else EIGHT_H100
    full = planned(cfg_for(*base), local_gpus)
    lora = planned(cfg_for(*base, "peft=lora"), local_gpus)
    assert (lora.tp, lora.pp, lora.num_parameters) == (full.tp, full.pp, full.num_parameters)
    assert lora.est_memory_gib_per_gpu < full.est_memory_gib_per_gpu
    assert lora.model_flops_per_sample < full.model_flops_per_sample
    # A rank the model's narrowest projection (k and v: its KV heads) cannot hold is refused in its own words.
    kv_width = model.num_query_groups * (model.kv_channels or model.hidden_size // model.num_attention_heads)
    with pytest.raises(PlanError, match=f"smallest dimension \\({kv_width}\\)"):
        planned(cfg_for(*base, "peft=lora", f"peft.rank={kv_width + 1}"), local_gpus)
