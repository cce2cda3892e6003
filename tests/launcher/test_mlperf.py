"""MLPerf Training configs, host side: the resolved configs hold the benchmarks' values as cited from the rules
(mlperf-logging's compliance checker and RCPs, the reference implementation), their dry runs plan the reference
layouts, settings that leave the rules are named, and the data preparation configs make the benchmarks' files."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from data_prep.shards import list_shards
from common.config import LoraConfig
from common.typed import to_plain
from launcher.plan.checks import mlperf
from launcher.plan.errors import PlanError
from launcher.plan.findings import Findings
from launcher.plan.sizes import sizes_of

from launcher_helpers import planned, run_main

# The values cited in conf/training/mlperf/*.yaml, written out again by hand.
LLAMA31_8B = {
    "seq_length": 8192,
    "micro_batch_size": 1,
    "global_batch_size": 32,
    "optimizer": {
        "lr": 8e-4,
        "min_lr": 8e-5,
        "adam_beta1": 0.9,
        "adam_beta2": 0.95,
        "adam_eps": 1e-5,
        "weight_decay": 0.1,
        "clip_grad": 1.0,
    },
    "scheduler": {"warmup_steps": 128, "decay_steps": 1_200_000},
    "val_interval": 384,
    "val_samples": 1024,
    "target_val_loss": 3.3,
    "tokenizer": {"type": "huggingface", "path": "meta-llama/Llama-3.1-8B"},
}
LLAMA31_405B = {
    "seq_length": 8192,
    "micro_batch_size": 1,
    "global_batch_size": 1152,
    "optimizer": {
        "lr": 8e-5,
        "min_lr": 8e-7,
        "adam_beta1": 0.9,
        "adam_beta2": 0.95,
        "adam_eps": 1e-5,
        "weight_decay": 0.1,
        "clip_grad": 1.0,
    },
    "scheduler": {"warmup_steps": 8000, "decay_steps": 1_200_000},
    "val_interval": 40,
    "val_samples": 5760,
    "target_val_loss": 5.6,
    "tokenizer": {"type": "huggingface", "path": "mistralai/Mixtral-8x22B-v0.1"},
}


def _package_file(*parts: str) -> Path:
    import mlperf_logging

    return Path(mlperf_logging.__file__).parent.joinpath(*parts)


def _rule_checks(ruleset: str, benchmark: str) -> dict[str, dict]:
    rules = yaml.safe_load(
        _package_file("compliance_checker", f"training_{ruleset}", f"closed_{benchmark}.yaml").read_text()
    )
    return {r["KEY"]["NAME"]: r["KEY"] for r in rules if "KEY" in r}


def _passes(rule: dict, field: str, value, state: dict) -> bool:
    """Evaluate a rule's CHECK (or ATLEAST_ONE_CHECK) expression as the compliance checker does."""
    return bool(eval(rule[field].strip(), {"s": state, "math": math}, {"v": {"value": value}}))


def _subset(expected: dict, actual: dict) -> dict:
    return {k: (_subset(v, actual[k]) if isinstance(v, dict) else actual[k]) for k, v in expected.items()}


def test_8b_config_holds_the_benchmark_values(cfg_for):
    cfg = cfg_for("training=mlperf/llama31_8b", "cluster=bcm", "dry_run=true")
    train = cfg.training
    assert _subset(LLAMA31_8B, to_plain(train)) == LLAMA31_8B
    model = train.model
    assert (model.num_layers, model.hidden_size, model.ffn_hidden_size) == (32, 4096, 14336)
    assert (model.num_attention_heads, model.num_query_groups, model.vocab_size) == (32, 8, 128256)
    assert train.val_interval * train.global_batch_size == 12288  # the reference's evaluation frequency
    assert train.data.blend == [f"{cfg.mlperf.data_dir}/c4-train.en_6_text_document"]
    assert train.data.valid_blend == [f"{cfg.mlperf.data_dir}/c4-validation-91205-samples.en_text_document"]
    assert not train.data.mock and train.data.split == "100,0,0"
    assert (cfg.mlperf.benchmark, cfg.mlperf.ruleset, cfg.mlperf.result_runs) == (
        "llama31_8b",
        "6.1.0",
        10,
    )

    # The RCP the batch size, LR and warmup come from.
    rcps = json.loads(_package_file("rcp_checker", "training_6.1.0", "rcps_llama31_8b.json").read_text())
    rcp = rcps["llama31_8b_ref_32"]
    assert rcp["BS"] == train.global_batch_size
    assert rcp["Hyperparams"]["opt_base_learning_rate"] == train.optimizer.lr
    assert rcp["Hyperparams"]["opt_learning_rate_warmup_samples"] == 128 * 32

    # The compliance rules' own checks, on the values this config trains with.
    checks = _rule_checks(cfg.mlperf.ruleset, "llama31_8b")
    opt, sched, state = train.optimizer, train.scheduler, {"opt_learning_rate_warmup_steps": 128}
    for key, value in [
        ("max_sequence_length", train.seq_length),
        ("opt_adamw_beta_1", opt.adam_beta1),
        ("opt_adamw_beta_2", opt.adam_beta2),
        ("opt_adamw_epsilon", opt.adam_eps),
        ("opt_adamw_weight_decay", opt.weight_decay),
        ("opt_gradient_clip_norm", opt.clip_grad),
        ("eval_samples", train.val_samples),
        ("max_steps", sched.decay_steps),
        ("opt_learning_rate_decay_steps", sched.decay_steps - sched.warmup_steps),
    ]:
        assert _passes(checks[key], "CHECK", value, state), key
    assert _passes(checks["eval_accuracy"], "ATLEAST_ONE_CHECK", train.target_val_loss, state)
    assert not _passes(checks["eval_accuracy"], "ATLEAST_ONE_CHECK", train.target_val_loss + 0.01, state)

    from mlperf_logging.benchmark_meta import _ALL_RESULT_FILE_COUNTS

    assert _ALL_RESULT_FILE_COUNTS["training"]["llama31_8b"] == cfg.mlperf.result_runs


def test_405b_config_holds_the_benchmark_values(cfg_for):
    cfg = cfg_for("training=mlperf/llama31_405b", "cluster=bcm", "dry_run=true")
    train = cfg.training
    assert _subset(LLAMA31_405B, to_plain(train)) == LLAMA31_405B
    model = train.model
    assert (model.num_layers, model.hidden_size, model.ffn_hidden_size) == (126, 16384, 53248)
    assert (model.num_attention_heads, model.num_query_groups, model.vocab_size) == (128, 8, 32768)
    assert train.val_interval * train.global_batch_size == 46080
    data_dir = cfg.mlperf.data_dir
    assert train.data.blend == [
        50,
        f"{data_dir}/c4-train.en_6_text_document",
        50,
        f"{data_dir}/c4-train.en_7_text_document",
    ]
    assert (cfg.mlperf.benchmark, cfg.mlperf.ruleset, cfg.mlperf.result_runs) == (
        "llama31_405b",
        "6.0.0",
        3,
    )
    rcp = json.loads(_package_file("rcp_checker", "training_6.0.0", "rcps_llama31_405b.json").read_text())[
        "llama31_405b_ref_1152"
    ]
    assert rcp["BS"] == train.global_batch_size
    assert rcp["Hyperparams"]["opt_base_learning_rate"] == train.optimizer.lr
    assert rcp["Hyperparams"]["opt_learning_rate_warmup_steps"] == train.scheduler.warmup_steps

    checks = _rule_checks("6.0.0", "llama31_405b")
    state = {"global_batch_size": train.global_batch_size}
    exec(checks["opt_learning_rate_warmup_steps"]["POST"].strip(), {"s": state, "math": math}, {})
    sched = train.scheduler
    assert state["opt_learning_rate_warmup_steps"] == sched.warmup_steps
    assert _passes(checks["opt_base_learning_rate"], "CHECK", train.optimizer.lr, state)
    assert _passes(checks["opt_learning_rate_decay_steps"], "CHECK", sched.decay_steps - sched.warmup_steps, state)
    assert _passes(checks["eval_samples"], "CHECK", train.val_samples, state)
    assert _passes(checks["init_checkpoint_step"], "CHECK", 0, state)
    assert _passes(checks["eval_accuracy"], "ATLEAST_ONE_CHECK", train.target_val_loss, state)


def test_8b_dry_run_plans_one_8_gpu_node(tmp_path):
    results = tmp_path / "results"
    out = run_main("training=mlperf/llama31_8b", "cluster=bcm", "dry_run=true", f"results_dir={results}")
    assert out.returncode == 0, out.stderr
    assert "1 node x 8" in out.stdout and "TP1 PP1 CP2 DP4" in out.stdout and "GBS 32 = MBS 1 x DP 4" in out.stdout
    assert "training.data.blend: no .bin/.idx" in out.stdout  # a warning in a dry run, an error otherwise
    plan = json.loads((results / "mlperf_llama31_8b_bf16_tp1_cp2_8gpu" / "plan.json").read_text())
    assert (plan["num_gpus"], plan["num_nodes"], plan["global_batch_size"], plan["seq_length"]) == (8, 1, 32, 8192)
    written = yaml.safe_load((results / "mlperf_llama31_8b_bf16_tp1_cp2_8gpu" / "config.yaml").read_text())
    assert written["training"]["optimizer"]["lr"] == 8e-4 and written["mlperf"]["benchmark"] == "llama31_8b"


@pytest.mark.parametrize(
    "extra,layout,gpus,tp",
    [
        ((), "TP8 PP8 CP2 VP8 DP8", 1024, 8),
        (("cluster.gpus_per_node=4", "cluster.gpu_type=gb200"), "TP4 PP8 CP2 VP8 DP8", 512, 4),
    ],
)
def test_405b_dry_run_plans_the_reference_layout_for_the_nodes(tmp_path, extra, layout, gpus, tp):
    results = tmp_path / "results"
    out = run_main("training=mlperf/llama31_405b", "cluster=bcm", "dry_run=true", f"results_dir={results}", *extra)
    assert out.returncode == 0, out.stderr
    assert layout in out.stdout and "asymmetric pipeline" in out.stdout
    assert "per PP stage: 15 16 16 16 16 16 16 15" in out.stdout
    assert "mlperf.allow_random_init=true" in out.stdout  # no initial checkpoint: a warning in a dry run
    run_dir = next(results.iterdir())
    plan = json.loads((run_dir / "plan.json").read_text())
    assert (plan["num_gpus"], plan["tp"], plan["pp"], plan["cp"], plan["vp"], plan["dp"]) == (gpus, tp, 8, 2, 8, 8)
    assert plan["num_microbatches"] == 144 and plan["asymmetric_pipeline"]


def test_4_gpu_h100_nodes_are_refused_by_the_memory_check(tmp_path):
    out = run_main(
        "training=mlperf/llama31_405b",
        "cluster=bcm",
        "dry_run=true",
        "cluster.gpus_per_node=4",
        f"results_dir={tmp_path}",
    )
    assert out.returncode == 2 and "exceeds the 79.6 GiB of cluster.gpu_type=h100" in out.stderr


def mlperf_findings(cfg) -> Findings:
    found = Findings(dry_run=cfg.dry_run)
    mlperf.check(cfg, sizes_of(cfg), found)
    return found


def test_405b_refuses_random_weights_unless_allowed(cfg_for):
    def problems(*overrides):
        cfg = cfg_for("training=mlperf/llama31_405b", "cluster=bcm", "stages=[data_preparation,training]", *overrides)
        return mlperf_findings(cfg).problems

    assert "mlperf.allow_random_init=true" in problems()[0]
    assert problems("mlperf.allow_random_init=true") == []
    assert problems("training.checkpoint.init_from=/ckpt/iter_0000000") == []
    cfg = cfg_for("training=mlperf/llama31_8b", "cluster=bcm", "dry_run=true")
    found = mlperf_findings(cfg)
    assert (found.problems, found.warnings) == ([], [])  # 8B starts from random weights by definition


def test_settings_that_leave_the_rules_are_named_with_the_value_they_need(cfg_for):
    cfg = cfg_for("training=mlperf/llama31_405b", "cluster=bcm", "dry_run=true", "training.global_batch_size=2304")
    named = {key: want for key, _, want, _ in mlperf.deviations(cfg.training, cfg.mlperf.rules, 2304)}
    # LR x 1152 = GBS x 8e-5; warmup ceil(8000 x 1152 / GBS); horizon ceil(1.2M x 1152 / GBS); 46,080 / GBS
    assert named == {
        "training.optimizer.lr": 1.6e-4,
        "training.scheduler.warmup_steps": 4000,
        "training.scheduler.decay_steps": 600_000,
        "training.val_interval": 20,
    }
    cfg = cfg_for(
        "training=mlperf/llama31_8b",
        "cluster=bcm",
        "dry_run=true",
        "training.val_samples=64",
        "training.seq_length=2048",
    )
    notes = mlperf_findings(cfg).warnings
    assert any("training.val_samples=64 differs from the benchmark's 1024" in n for n in notes)
    assert any("training.seq_length=2048 differs from the benchmark's 8192" in n for n in notes)


@pytest.mark.parametrize(
    "overrides,message",
    [
        (
            ["training.val_samples=1000"],
            "training.val_samples=1000 is not a multiple of training.micro_batch_size=1 x data-parallel size 16",
        ),
        (["training.val_samples=0"], "training.val_samples=0 must be positive (or null)"),
        # 5768 / DP 8 = 721 microbatches per rank: 5 calls of 144, then 1, which PP 8 x VP 8 cannot schedule
        (
            ["training.val_samples=5768", "parallelism.num_gpus=1024"],
            "leaves a last evaluation call of 1 microbatch(es)",
        ),
    ],
)
def test_evaluation_sizes_that_cannot_run_are_errors(cfg_for, overrides, message):
    cfg = cfg_for(
        "training=mlperf/llama31_405b", "cluster=bcm", "dry_run=true", "parallelism.num_gpus=2048", *overrides
    )
    with pytest.raises(PlanError) as err:
        planned(cfg)
    assert message in str(err.value)


def _shards(cfg_for, benchmark):
    cfg = cfg_for(f"training=mlperf/{benchmark}", f"data_preparation=mlperf_{benchmark}", "cluster=bcm")
    return cfg, list_shards(cfg.data_preparation)


def test_data_preparation_makes_exactly_the_8b_files(cfg_for):
    cfg, shards = _shards(cfg_for, "llama31_8b")
    data_dir = cfg.mlperf.data_dir
    assert [s.output_prefix for s in shards] == [
        f"{data_dir}/c4-train.en_6_text_document",
        f"{data_dir}/c4-validation-91205-samples.en_text_document",
    ]
    train, valid = shards
    names = [src.file_name for src in train.sources]
    assert names[0] == "c4-train.00768-of-01024.json.gz" and names[-1] == "c4-train.00895-of-01024.json.gz"
    assert len(names) == 128 and train.max_documents is None
    assert [src.file_name for src in valid.sources] == [f"c4-validation.{i:05d}-of-00008.json.gz" for i in range(8)]
    assert valid.max_documents == 91205
    dp = cfg.data_preparation
    assert dp.append_eod is False and dp.tokenizer == cfg.training.tokenizer
    assert [s.output_prefix for s in shards] == [
        *cfg.training.data.blend,
        *cfg.training.data.valid_blend,
    ]


def test_data_preparation_makes_exactly_the_405b_files(cfg_for):
    cfg, shards = _shards(cfg_for, "llama31_405b")
    names = [src.file_name for s in shards[:2] for src in s.sources]
    assert names[0] == "c4-train.00768-of-01024.json.gz" and names[-1] == "c4-train.01023-of-01024.json.gz"
    assert len(names) == 256 and shards[2].max_documents == 91205
    assert [s.output_prefix for s in shards] == [
        *cfg.training.data.blend[1::2],
        *cfg.training.data.valid_blend,
    ]
    assert cfg.data_preparation.tokenizer.path == "mistralai/Mixtral-8x22B-v0.1"


def test_a_sweep_of_seeds_gives_one_run_directory_per_seed(tmp_path):
    results = tmp_path / "results"
    out = run_main(
        "-m", "training=mlperf/llama31_8b", "cluster=bcm", "dry_run=true", f"results_dir={results}", "seed=1,2,3"
    )
    assert out.returncode == 0, out.stderr
    runs = sorted(p for p in results.iterdir() if p.name != "sweeps")
    assert [p.name for p in runs] == [f"mlperf_llama31_8b_bf16_tp1_cp2_8gpu__seed={s}" for s in (1, 2, 3)]
    assert [yaml.safe_load((p / "config.yaml").read_text())["seed"] for p in runs] == [1, 2, 3]


# ----------------------------------------------------------------------------- Llama 2 70B LoRA
LLAMA2_70B_LORA = {
    "seq_length": 8192,
    "micro_batch_size": 1,
    "global_batch_size": 8,
    "train_steps": 1024,
    "optimizer": {"lr": 4e-4, "min_lr": 0.0, "weight_decay": 1e-4, "clip_grad": 0.3},
    "scheduler": {"warmup_steps": 0, "decay_steps": 1024},
    "val_interval": 48,
    "val_skip": 3,
    "val_samples": 173,
    "target_val_loss": 0.925,
    "tokenizer": {"type": "sentencepiece", "path": "meta-llama/Llama-2-70b-hf"},
    "checkpoint": {"init_from_hf": "meta-llama/Llama-2-70b-hf", "interval": 0, "save_at_end": False},
}


def test_llama2_70b_lora_config_holds_the_benchmark_values(cfg_for):
    cfg = cfg_for("training=mlperf/llama2_70b_lora", "cluster=bcm", "dry_run=true")
    train, lora = cfg.training, cfg.peft
    assert _subset(LLAMA2_70B_LORA, to_plain(train)) == LLAMA2_70B_LORA
    model = train.model
    assert (model.num_layers, model.hidden_size, model.ffn_hidden_size) == (80, 8192, 28672)
    assert (model.num_attention_heads, model.num_query_groups, model.vocab_size) == (64, 8, 32000)
    assert isinstance(lora, LoraConfig)
    assert (lora.rank, lora.alpha, lora.dropout) == (16, 32, 0.1)
    assert [str(t) for t in lora.target_modules] == ["linear_qkv", "linear_proj"]
    data_dir = cfg.mlperf.data_dir
    assert train.data.format == "sft" and not train.data.mock and not train.data.packing
    assert train.data.blend == [f"{data_dir}/govreport_train_sft_document"]
    assert train.data.valid_blend == [f"{data_dir}/govreport_validation_sft_document"]
    assert (cfg.mlperf.benchmark, cfg.mlperf.ruleset, cfg.mlperf.result_runs) == ("llama2_70b_lora", "6.1.0", 10)
    # Every 384 samples, the first floor(0.125 x 8 + 2) = 3 evaluations skipped.
    assert train.val_interval * train.global_batch_size == 384 and train.val_skip == math.floor(0.125 * 8 + 2)

    rcp = json.loads(_package_file("rcp_checker", "training_6.1.0", "rcps_llama2_70b_lora.json").read_text())[
        "llama2_70b_lora_ref_8"
    ]
    hp = rcp["Hyperparams"]
    assert rcp["BS"] == train.global_batch_size
    assert (hp["opt_base_learning_rate"], hp["opt_max_grad_norm"]) == (train.optimizer.lr, train.optimizer.clip_grad)
    assert (hp["lora_r"], hp["lora_alpha"], hp["max_steps"]) == (lora.rank, lora.alpha, train.scheduler.decay_steps)
    assert hp["opt_learning_rate_warmup_epochs"] == train.scheduler.warmup_steps == 0

    checks = _rule_checks(cfg.mlperf.ruleset, "llama2_70b_lora")
    assert _passes(checks["lora_rank"], "CHECK", lora.rank, {})
    assert not _passes(checks["lora_rank"], "CHECK", 8, {})
    assert _passes(checks["eval_accuracy"], "ATLEAST_ONE_CHECK", train.target_val_loss, {})
    assert not _passes(checks["eval_accuracy"], "ATLEAST_ONE_CHECK", train.target_val_loss + 0.001, {})

    from mlperf_logging.benchmark_meta import _ALL_RESULT_FILE_COUNTS

    assert _ALL_RESULT_FILE_COUNTS["training"]["llama2_70b_lora"] == cfg.mlperf.result_runs
    found = mlperf_findings(cfg)
    assert (found.problems, found.warnings) == ([], [])


def test_llama2_70b_lora_dry_run_plans_one_8_gpu_node(tmp_path):
    results = tmp_path / "results"
    out = run_main("training=mlperf/llama2_70b_lora", "cluster=bcm", "dry_run=true", f"results_dir={results}")
    assert out.returncode == 0, out.stderr
    assert "1 node x 8" in out.stdout and "TP4 PP1 CP2 DP1" in out.stdout and "GBS 8 = MBS 1 x DP 1" in out.stdout
    assert "LoRA r=16 on linear_qkv,linear_proj" in out.stdout
    run_dir = results / "mlperf_llama2_70b_lora_bf16_tp4_cp2_8gpu"
    plan = json.loads((run_dir / "plan.json").read_text())
    assert (plan["num_gpus"], plan["tp"], plan["cp"], plan["dp"], plan["seq_length"]) == (8, 4, 2, 1, 8192)
    assert plan["est_memory_gib_per_gpu"] < 79.6
    written = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert written["mlperf"]["benchmark"] == "llama2_70b_lora" and written["peft"]["rank"] == 16


@pytest.mark.parametrize("gbs", [8, 16, 32])
def test_llama2_70b_lora_names_the_cadence_and_skip_each_batch_size_needs(cfg_for, gbs):
    cfg = cfg_for("training=mlperf/llama2_70b_lora", "cluster=bcm", "dry_run=true", f"training.global_batch_size={gbs}")
    named = {key: want for key, _, want, _ in mlperf.deviations(cfg.training, cfg.mlperf.rules, gbs)}
    expected = {"training.val_interval": 384 // gbs, "training.val_skip": (gbs // 8) + 2}  # floor(GBS / 8 + 2)
    assert named == {k: v for k, v in expected.items() if v != {"training.val_interval": 48, "training.val_skip": 3}[k]}


@pytest.mark.parametrize(
    "override,key,want",
    [
        ("peft.rank=8", "peft.rank", 16),
        ("peft.alpha=16", "peft.alpha", 32),
        ("peft.dropout=0.0", "peft.dropout", 0.1),
        ("peft.target_modules=[linear_qkv,linear_proj,linear_fc1]", "peft.target_modules", "[linear_qkv,linear_proj]"),
    ],
)
def test_llama2_70b_lora_adapters_that_leave_the_rules_are_named(cfg_for, override, key, want):
    cfg = cfg_for("training=mlperf/llama2_70b_lora", "cluster=bcm", "dry_run=true", override)
    notes = mlperf_findings(cfg).warnings
    assert len(notes) == 1 and f"{key}=" in notes[0] and f"differs from the benchmark's {want}" in notes[0], notes


def test_data_preparation_makes_exactly_the_llama2_70b_lora_files(cfg_for):
    cfg = cfg_for(
        "training=mlperf/llama2_70b_lora", "data_preparation=mlperf_llama2_70b_lora", "cluster=bcm", "dry_run=true"
    )
    data_dir = cfg.mlperf.data_dir
    assert cfg.data_preparation.output_dir == data_dir
    prefixes = sorted(s.output_prefix for s in list_shards(cfg.data_preparation))
    assert prefixes == sorted([*cfg.training.data.blend, *(cfg.training.data.valid_blend or [])])
