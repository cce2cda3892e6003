"""Every bad value a user can type, run through main.py as written: exit status 2, one line per problem naming the
key (and how to write it), nothing written. Each row is an input that once passed silently, ended in a
traceback, or said something misleading; the data inputs (prepared files, data preparation settings) are in
tests/data_prep/test_dataprep_plan_inputs.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

from common import hf_config
from common.checkpoints import TrainState, finalize_checkpoint, partial_path
from launcher.config.compose import compose
from launcher_helpers import REPO, run_main

BASE = ("training=llama31/8b", "cluster=bcm", "dry_run=true")
DATA_PREP = ("stages=[data_preparation]", "data_preparation=files", "data_preparation.inputs=[/tmp/in.jsonl]")
LORA = ("peft=lora", "training.checkpoint.init_from=/checkpoints/base")
SFT = ("training.data.format=sft", "training.data.mock=false", "training.data.blend=[/tmp/nothing_sft_document]")

# (overrides after BASE, a text every problem line together must contain)
CASES = [
    # Wrong types: refused while composing, with what the key takes.
    (["training.seq_length=abc"], "training.seq_length=abc: training.seq_length must be an integer"),
    (
        ["training.global_batch_size=abc"],
        "training.global_batch_size=abc: training.global_batch_size must be an integer",
    ),
    (
        ["training.global_batch_size=[64,128]"],
        "training.global_batch_size=[64,128]: training.global_batch_size must be an integer",
    ),
    (["training.train_steps=abc"], "training.train_steps=abc: training.train_steps must be an integer"),
    (["training.optimizer.lr=abc"], "training.optimizer.lr=abc: training.optimizer.lr must be a number"),
    (["parallelism.tp=true"], "parallelism.tp=true: parallelism.tp must be an integer"),
    (
        ["training.train_steps=1e3"],
        "training.train_steps must be an integer (optimizer steps to train); write training.train_steps=1000",
    ),
    (["seed=abc"], "seed=abc: seed must be an integer"),
    (["seed=1.5"], "seed=1.5: seed must be an integer"),
    (["training.micro_batch_size=1.5"], "training.micro_batch_size=1.5: training.micro_batch_size must be an integer"),
    (["profile.tool=vtune"], "profile.tool=vtune: profile.tool must be one of torch, nsys"),
    (["logging.wandb.mode=cloud"], "logging.wandb.mode=cloud: logging.wandb.mode must be one of auto, online, offline"),
    (["cluster.container_runtime=docker"], "cluster.container_runtime must be one of pyxis, apptainer, none"),
    (["stages=[trianing]"], "stages=[trianing]: 'trianing' is not a stage; use one of container"),
    # A string where a list belongs is never split into characters.
    (["cluster.sbatch_args=--foo"], "cluster.sbatch_args=--foo: cluster.sbatch_args must be a list of strings"),
    (["cluster=sge", "cluster.modules=openmpi"], "cluster.modules=openmpi: cluster.modules must be a list of strings"),
    (["stages=training"], "stages=training: stages must be a list"),
    # Keys and options that do not exist.
    (["cluster.qsub_args=[x]"], "cluster.qsub_args is not a key of cluster on platform slurm"),
    (["training.model.num_layer=3"], "did you mean training.model.num_layers?"),
    (["+foo=1"], "foo is not a config key"),
    (
        ["training=llama31/9b"],
        "training=llama31/9b: no such option; choose one of finetune/llama31_405b_lora, finetune/llama31_405b_sft",
    ),
    # Values of the right type out of range.
    (["training.seq_length=0"], "training.seq_length=0 must be positive"),
    (["training.optimizer.lr=-1", "training.optimizer.min_lr=-2"], "training.optimizer.lr=-1.0 must be positive"),
    (["training.optimizer.lr=-1"], "training.optimizer.lr=-1.0 must be positive"),
    (["seed=-3"], "seed=-3 must be from 0 to 4294967295"),
    (["cluster.gpus_per_node=-8"], "cluster.gpus_per_node=-8 must be positive (or null)"),
    (["cluster.gpus_per_node=0"], "cluster.gpus_per_node=0 must be positive (or null)"),
    (
        ["training.data.mock=false", "training.data.blend=[-1,/data/a,2,/data/b]"],
        "training.data.blend weights [-1, 2] must be 0 or more with at least one above 0",
    ),
    (
        ["training.data.mock=false", "training.data.blend=[0,/data/a,0,/data/b]"],
        "training.data.blend weights [0, 0] must be 0 or more with at least one above 0",
    ),
    (["training.data.blend=[/data/a]"], "training.data.mock=true ignores training.data.blend"),
    (["stages=[training,training]"], "stages names training more than once"),
    (
        ["training=mlperf/llama31_8b", "mlperf.ruleset=9.9.9"],
        "mlperf.ruleset=9.9.9 has no compliance rules for llama31_8b: use one of 5.1.0, 6.0.0, 6.1.0",
    ),
    # The MLPerf Llama 2 70B LoRA benchmark's keys.
    (
        ["training=mlperf/llama2_70b_lora", "mlperf.ruleset=4.1.0"],
        "mlperf.ruleset=4.1.0 has no compliance rules for llama2_70b_lora: use one of 5.0.0, 5.1.0, 6.0.0, 6.1.0",
    ),
    (["training=mlperf/llama2_70b_lora", "training.val_skip=-1"], "training.val_skip=-1 must be at least 0"),
    (["training=mlperf/llama2_70b_lora", "training.val_skip=abc"], "training.val_skip must be an integer"),
    (
        ["training.val_skip=3"],
        "training.val_skip=3 skips evaluations of a run that never evaluates (training.val_interval=0)",
    ),
    (["training=mlperf/llama2_70b_lora", "mlperf.rules.lora_rank=0"], "mlperf.rules.lora_rank=0 must be positive"),
    (
        ["training=mlperf/llama2_70b_lora", "mlperf.rules.eval_skip_per_gbs=-0.125"],
        "mlperf.rules.eval_skip_per_gbs=-0.125 must be at least 0",
    ),
    (
        ["training=mlperf/llama2_70b_lora", "parallelism=tp8_pp8_cp2_vp8_asym", "parallelism.num_gpus=256"],
        "training.val_samples=173 is not a multiple of training.micro_batch_size=1 x data-parallel size 2",
    ),
    (
        ["cluster.container_runtime=apptainer", "cluster.container=null"],
        "cluster.container=null gives cluster.container_runtime=apptainer no image",
    ),
    # Values that passed the plan and failed after the queue wait, or did something else than asked.
    (["training.checkpoint.interval=-5"], "training.checkpoint.interval=-5 must be at least 0: save every N steps"),
    (["+cluster.env.BAD-NAME=1"], "cluster.env.BAD-NAME is not an environment variable name"),
    (["training.optimizer.lr=nan"], "training.optimizer.lr=nan must be positive"),
    (["training.optimizer.lr=inf"], "training.optimizer.lr=inf must be positive"),
    (["telemetry.flag_utilization_below=1.5"], "telemetry.flag_utilization_below=1.5 must be from 0 to 1"),
    (["resilience.inject_fault.rank=-1"], "resilience.inject_fault.rank=-1 must be at least 0"),
    (["training.checkpoint.keep_last=-1"], "training.checkpoint.keep_last=-1 must be at least 0"),
    (["cluster.signal_before_timeout_s=0"], "cluster.signal_before_timeout_s=0 must be positive (or null)"),
    (["profile.ranks=[-1]"], "profile.ranks[0]=-1 must be at least 0"),
    (["data_preparation.download.timeout_s=0"], "data_preparation.download.timeout_s=0.0 must be positive"),
    # Names that become paths and job names.
    (["run_name=../../escaped"], "run_name='../../escaped': use letters, digits and . _ = + - only"),
    (["run_name=my run"], "run_name='my run': use letters, digits and . _ = + - only"),
    ([f"run_name={'x' * 300}"], "run_name is 300 characters long; keep it to 200"),
    (["results_dir=/proc/nope"], "results_dir=/proc/nope cannot be created"),
    # LoRA: its keys, and what it needs of the rest.
    (["peft=lora"], "peft=lora trains adapters on a frozen base, and no base is given: set training.checkpoint"),
    ([*LORA, "peft.rank=0"], "peft.rank=0 must be positive"),
    # A projection's bound, as PEFT has one adapter per projection: linear_qkv's k and v have 8 x 128 rows.
    ([*LORA, "peft.rank=2000"], "peft.rank=2000 is larger than linear_qkv's smallest dimension (1024)"),
    (
        [*LORA, "peft.target_modules=[linear_proj,linear_fc2]", "peft.rank=4097"],
        "peft.rank=4097 is larger than linear_fc2's smallest dimension (4096)",
    ),
    ([*LORA, "peft.target_modules=[q_proj]"], "peft.target_modules must be one of linear_qkv, linear_proj"),
    ([*LORA, "peft.target_modules=[]"], "peft.target_modules=[] adapts nothing"),
    ([*LORA, "peft.target_modules=[linear_qkv,linear_qkv]"], "names a layer twice"),
    ([*LORA, "peft.a_init=zero"], "peft.a_init=zero with peft.b_init=zero never trains"),
    ([*LORA, "peft.dropout=1"], "peft.dropout=1.0 must be in [0, 1)"),
    (["peft=qlora"], "peft=qlora: no such option; choose one of lora, none"),
    (
        ["dtype=fp32", "dtype.fp8=hybrid", "dtype.fp8_recipe=delayed"],
        "dtype.bf16=false (fp32 throughout) cannot be combined with dtype.fp8",
    ),
    (
        ["dtype=fp32", "parallelism=tp2_sp", "parallelism.num_gpus=8"],
        "dtype.bf16=false (fp32 throughout) needs parallelism.tp_comm_overlap=false",
    ),
    (
        ["dtype=fp8", "dtype.te_op_fuser=true"],
        "the distributed optimizer: the fused MLP's weights skip megatron-core's parameter-gather hooks; set "
        "parallelism.overlap_param_gather=false",
    ),
    (  # one rank too: its distributed optimizer gathers through the same hooks (measured on one H200)
        ["dtype=fp8", "dtype.te_op_fuser=true", "parallelism=tp1", "parallelism.num_gpus=1", "cluster.gpus_per_node=1"],
        "dtype.te_op_fuser=true with parallelism.overlap_param_gather=true and the distributed optimizer",
    ),
    ([*LORA, "dtype=fp8", "dtype.te_op_fuser=true"], "linear_fc1 and linear_fc2 needs dtype.te_op_fuser=false"),
    # Data preparation settings, checked when the run is planned (not inside the job).
    (
        [*DATA_PREP, "data_preparation.chunk_bytes=-5"],
        "data_preparation.chunk_bytes=-5 must be from 4096 to 1073741824",
    ),
    ([*DATA_PREP, "data_preparation.chunk_bytes=0"], "data_preparation.chunk_bytes=0 must be from 4096 to 1073741824"),
    ([*DATA_PREP, "data_preparation.workers=0"], "data_preparation.workers=0: expected a positive integer"),
    ([*DATA_PREP, "data_preparation.workers=abc"], "data_preparation.workers='abc': expected a positive integer"),
    ([*DATA_PREP, "data_preparation.tokenizer.type=tiktoken"], "data_preparation.tokenizer.type=tiktoken"),
    # Fine-tuning data: what the trainer cannot do is refused by the plan, not after the queue wait.
    (["training.data.format=sft"], "training.data.format=sft needs prepared samples: set training.data.mock=false"),
    (
        [*SFT, "parallelism.cp=2"],
        "parallelism.cp=2 with training.data.packing=true: context parallelism over packed sequences needs every "
        "sample padded to a multiple of 2 x cp",
    ),
    (
        [*SFT, "parallelism.cp=1", "training.cuda_graphs=per_layer"],
        "training.cuda_graphs=per_layer with training.data.packing=true",
    ),
    (
        [*SFT, "parallelism.cp=1", "dtype=fp8", "dtype.fp8_dot_product_attention=true"],
        "dtype.fp8_dot_product_attention=true with training.data.packing=true: FP8 attention has no kernel",
    ),
    (
        [*SFT, "parallelism.cp=1", "training.model.attention_backend=unfused"],
        "training.model.attention_backend=unfused with training.data.packing=true",
    ),
    (
        ["training.data.format=sft", "training.data.mock=false", "training.data.blend=[1,/tmp/a,1,/tmp/b]"],
        "training.data.blend weights are not used for training.data.format=sft",
    ),
]


@pytest.mark.parametrize("overrides,expected", CASES, ids=lambda v: " ".join(v)[:60] if isinstance(v, list) else "")
def test_each_bad_input_is_one_line_and_nothing_is_written(tmp_path, overrides, expected):
    results = tmp_path / "results"
    out = run_main(*BASE, f"results_dir={results}", *overrides)  # an override of results_dir comes last
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert lines and all(line.startswith("error: ") for line in lines), out.stderr
    assert expected in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    assert not results.exists()


def test_a_results_dir_that_is_a_file(tmp_path):
    regular = tmp_path / "a-file"
    regular.write_text("x")
    out = run_main(*BASE, f"results_dir={regular}")
    assert out.returncode == 2
    assert out.stderr.strip() == f"error: results_dir={regular} is a file, not a directory: choose a directory"
    assert regular.read_text() == "x"


def test_every_bad_value_of_one_command_at_once(tmp_path):
    out = run_main(
        *BASE,
        "cluster.sbatch_args=--foo",
        "training.train_steps=1e3",
        "seed=abc",
        "dtype=fp16",
        f"results_dir={tmp_path}",
    )
    assert out.returncode == 2
    keys = [line.split(":", 2)[1].strip() for line in out.stderr.strip().splitlines()]
    assert keys == ["dtype=fp16", "cluster.sbatch_args=--foo", "training.train_steps=1e3", "seed=abc"], out.stderr


def test_paths_in_job_scripts_are_quoted_or_refused(tmp_path):
    # On this machine a results_dir with a space works: the command to run the job again is quoted.
    results = tmp_path / "my results"
    out = run_main("dry_run=true", f"results_dir={results}")
    assert out.returncode == 0, out.stderr
    script = results / "llama31_tiny_bf16_tp1_1gpu" / "launch.sh"
    assert f"run it again with: bash '{script}'" in script.read_text()
    # #SBATCH --output cannot carry one: refused before anything is written.
    out = run_main(*BASE, f"results_dir={tmp_path / 'other results'}")
    assert out.returncode == 2 and "has a space, quote or other character that #SBATCH" in out.stderr, out.stderr
    assert not (tmp_path / "other results").exists()


# --------------------------------------------------------------------------- files the plan can inspect
# Each makes its files under the test's directory and returns (the command's arguments after `python`, a text its
# one error line must contain). Nothing may be written: every file under that directory is compared afterwards.
def corrupt_safetensors(tmp: Path) -> tuple[list[str], str]:
    weights = tmp / "Llama-3.1-8B"
    weights.mkdir()
    config = hf_config.llama_config(
        compose(["training=llama31/8b"]).training.model, torch_dtype="bfloat16", bos_token_id=1, eos_token_id=2
    )
    (weights / "config.json").write_text(json.dumps(config))
    (weights / "model.safetensors").write_bytes(os.urandom(4096))  # a download cut off and overwritten
    return (
        ["main.py", *BASE, f"results_dir={tmp / 'results'}", f"training.checkpoint.init_from_hf={weights}"],
        f"training.checkpoint.init_from_hf={weights}: {weights / 'model.safetensors'} is not a safetensors file",
    )


def tokenizer_larger_than_the_model(tmp: Path) -> tuple[list[str], str]:
    tokenizer = tmp / "tok"
    tokenizer.mkdir()
    vocab = {f"t{i}": i for i in range(8000)}
    (tokenizer / "tokenizer.json").write_text(
        json.dumps({"version": "1.0", "added_tokens": [], "model": {"type": "BPE", "vocab": vocab, "merges": []}})
    )
    return (
        [
            "main.py",
            *BASE,
            f"results_dir={tmp / 'results'}",
            "training.data.mock=false",
            f"training.data.blend=[{tmp / 'data' / 'corpus_text_document'}]",
            "training.tokenizer.type=huggingface",
            f"training.tokenizer.path={tokenizer}",
            "training.model.vocab_size=4096",
        ],
        f"training.tokenizer.path={tokenizer} has 8,000 token ids but training.model.vocab_size=4096",
    )


def _run_with_a_truncated_newest_checkpoint(tmp: Path, *stages: str) -> tuple[list[str], str]:
    args = [*BASE, "cluster.container_runtime=none", f"results_dir={tmp / 'results'}"]
    assert run_main(*args).returncode == 0
    run_dir = tmp / "results" / "llama31_8b_bf16_tp1_cp2_8gpu"
    root = str(run_dir / "checkpoints")
    for step in (100, 200):
        os.makedirs(partial_path(root, step))
        finalize_checkpoint(root, TrainState(step=step, consumed_samples=8 * step))
    state = run_dir / "checkpoints" / "iter_0000200" / "train_state.json"
    state.write_text(state.read_text()[:10])  # the disk filled up while it was copied
    return (
        ["main.py", *args, *stages],
        f"{state.parent} is not a complete checkpoint: its train_state.json is damaged",
    )


def truncated_state_resume(tmp: Path) -> tuple[list[str], str]:
    return _run_with_a_truncated_newest_checkpoint(tmp)


def truncated_state_export(tmp: Path) -> tuple[list[str], str]:
    return _run_with_a_truncated_newest_checkpoint(tmp, "stages=[export]")


def malformed_site_yaml(tmp: Path) -> tuple[list[str], str]:
    (tmp / "site" / "cluster").mkdir(parents=True)
    (tmp / "site" / "cluster" / "mysite.yaml").write_text(
        "defaults:\n  - bcm\n  - _self_\npartition: [batch\naccount: a\n"
    )
    return (
        ["main.py", "--config-dir", str(tmp / "site"), "cluster=mysite", "dry_run=true", f"results_dir={tmp / 'r'}"],
        f"{tmp / 'site' / 'cluster' / 'mysite.yaml'}, line 5, column 8: not valid YAML",
    )


def misspelt_key_in_site_yaml(tmp: Path) -> tuple[list[str], str]:
    (tmp / "site" / "cluster").mkdir(parents=True)
    (tmp / "site" / "cluster" / "mysite.yaml").write_text("defaults:\n  - bcm\n  - _self_\npartiton: batch\n")
    return (
        ["main.py", "--config-dir", str(tmp / "site"), "cluster=mysite", "dry_run=true", f"results_dir={tmp / 'r'}"],
        f"{tmp / 'site' / 'cluster' / 'mysite.yaml'}: cluster.partiton is not a key of cluster on platform slurm; "
        "did you mean cluster.partition?",
    )


def half_written_plan(tmp: Path) -> tuple[list[str], str]:
    run_dir = tmp / "run"
    run_dir.mkdir()
    plan = (REPO / "tests" / "launcher" / "fixtures" / "telemetry_run" / "plan.json").read_text()
    (run_dir / "plan.json").write_text(plan[: len(plan) // 2])
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 1, "step_time_s": 1.0, "loss": 5.0}) + "\n")
    return ["-m", "launcher.report", str(run_dir)], f"{run_dir / 'plan.json'} is not valid JSON"


def config_of_another_version(tmp: Path) -> tuple[list[str], str]:
    run_dir = tmp / "run"
    run_dir.mkdir()
    plan = REPO / "tests" / "launcher" / "fixtures" / "telemetry_run" / "plan.json"
    (run_dir / "plan.json").write_text(plan.read_text())
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 1, "step_time_s": 1.0, "loss": 5.0}) + "\n")
    (run_dir / "config.yaml").write_text("renamed_key: 1\n")
    return ["-m", "launcher.report", str(run_dir)], (
        f"{run_dir / 'config.yaml'}: renamed_key is not a config key: remove it (written by another version?"
    )


def _sft_samples(tmp: Path, *lines: dict) -> tuple[list[str], Path]:
    samples = tmp / "train.jsonl"
    samples.write_text("".join(json.dumps(line) + "\n" for line in lines))
    args = [
        "main.py",
        *BASE,
        f"results_dir={tmp / 'results'}",
        "stages=[data_preparation]",
        "data_preparation=sft_jsonl",
    ]
    return [*args, f"data_preparation.inputs=[{samples}]", f"data_preparation.output_dir={tmp / 'out'}"], samples


def sft_sample_without_its_response(tmp: Path) -> tuple[list[str], str]:
    argv, samples = _sft_samples(tmp, {"prompt": "p", "response": "r"}, {"prompt": "p", "answer": "a"})
    return argv, f"data_preparation.response_key=response: {samples}:2: sample 1 has no 'response' field"


def sft_sample_with_an_empty_response(tmp: Path) -> tuple[list[str], str]:
    argv, samples = _sft_samples(tmp, {"prompt": "p", "response": " "})
    return argv, f"data_preparation.inputs: {samples}:1: sample 0 has an empty response ('response')"


def sft_sample_longer_than_a_sequence(tmp: Path) -> tuple[list[str], str]:
    import numpy as np

    from data_prep.indexed import IndexWriter
    from data_prep.shards import LOSS_MASK

    prefix = str(tmp / "data" / "train_sft_document")
    (tmp / "data").mkdir()
    lengths = np.array([5, 9000], np.int64)
    for path, dtype in ((prefix, np.int32), (prefix + LOSS_MASK, np.uint8)):
        writer = IndexWriter(path + ".bin", dtype)
        writer.add_documents(np.ones(int(lengths.sum()), dtype), lengths)
        writer.finalize(path + ".idx")
    args = ["training.data.format=sft", "training.data.mock=false", f"training.data.blend=[{prefix}]"]
    return (
        ["main.py", *BASE, f"results_dir={tmp / 'results'}", *args, "training.data.packing=false"],
        f"training.data.blend: sample 1 of {prefix} has 9,000 tokens, more than training.seq_length=8192, and "
        "training.data.truncate=false",
    )


FILE_CASES: list[Callable[[Path], tuple[list[str], str]]] = [
    corrupt_safetensors,
    tokenizer_larger_than_the_model,
    truncated_state_resume,
    truncated_state_export,
    malformed_site_yaml,
    misspelt_key_in_site_yaml,
    half_written_plan,
    config_of_another_version,
    sft_sample_without_its_response,
    sft_sample_with_an_empty_response,
    sft_sample_longer_than_a_sequence,
]


def files_under(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("make", FILE_CASES, ids=lambda f: f.__name__)
def test_each_bad_file_is_one_line_naming_it_and_nothing_is_written(tmp_path, make):
    argv, expected = make(tmp_path)
    before = files_under(tmp_path)
    out = subprocess.run(
        [sys.executable, *argv],
        cwd=REPO,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2, (out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr
    assert expected in lines[0], lines[0]
    assert files_under(tmp_path) == before
