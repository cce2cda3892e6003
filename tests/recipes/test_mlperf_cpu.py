"""MLPerf pieces of the training recipe that need no GPU: the MLLOG writer driven through a whole run on CPU and
judged by mlperf-logging's compliance checker, the keys it logs, and the in-order validation sequences."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from common import evaluation
from common.plan import Plan
from common.typed import changed
from launcher.config.compose import compose
from launcher.plan.build import build_plan
from launcher.report.mlperf import compliance_problems
from recipes.observability.mlperf import MLPerfLog, run_keys
from launcher.plan.checks.mlperf import eval_samples_counts as mlperf_eval_samples
from recipes.trainer import data
from recipes.trainer.cadence import EvalPolicy


def mlperf_run(benchmark: str, *overrides: str) -> tuple[dict, Plan]:
    cfg = compose([f"training=mlperf/{benchmark}", "cluster=bcm", "dry_run=true", *overrides])
    return cfg, build_plan(cfg)


class Clock:
    """Seconds that advance by `step` on every reading: the events get distinct, increasing times."""

    def __init__(self, start: float = 1_700_000_000.0, step: float = 0.25):
        self.now, self.step = start, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def drive_run(run_dir: Path, cfg: dict, plan: Plan, accuracies: list[float], *, logs_here: bool = True) -> Path:
    """What the trainer does: open the log, start the run, evaluate every val_interval steps, stop at the target
    (or after the last evaluation, aborted)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    log = MLPerfLog.open(
        str(run_dir), cfg, plan, logs_here, cache_cleared=False, gpu_name="NVIDIA H100 80GB HBM3", clock=Clock()
    )
    every = cfg.training.val_interval * plan.global_batch_size
    target = cfg.training.target_val_loss
    log.run_start(0)
    reached, samples = False, 0
    for k, accuracy in enumerate(accuracies, start=1):
        samples = k * every
        reached = accuracy <= target
        last = reached or k == len(accuracies)
        log.eval_start(samples)
        log.eval_stop(samples, accuracy, run_goes_on=not last)
        if last:
            break
    log.run_stop(reached, samples)
    return run_dir / cfg.mlperf.log_file


def events(path: Path) -> list[dict]:
    return [json.loads(line.split(":::MLLOG ", 1)[1]) for line in path.read_text().splitlines()]


@pytest.mark.parametrize(
    "benchmark,ruleset",
    [
        ("llama31_8b", "5.1.0"),
        ("llama31_8b", "6.0.0"),
        ("llama31_8b", "6.1.0"),
        ("llama31_405b", "5.1.0"),
        ("llama31_405b", "6.0.0"),
        ("llama2_70b_lora", "5.0.0"),
        ("llama2_70b_lora", "5.1.0"),
        ("llama2_70b_lora", "6.0.0"),
        ("llama2_70b_lora", "6.1.0"),
    ],
)
def test_a_converged_run_passes_the_compliance_checker(tmp_path, benchmark, ruleset):
    cfg, plan = mlperf_run(benchmark)
    target = cfg.training.target_val_loss
    log = drive_run(tmp_path / "run", cfg, plan, [target + 3.0, target + 1.0, target + 0.1, target - 0.05])
    assert compliance_problems(log, benchmark, ruleset) == []
    keys = [e["key"] for e in events(log)]
    assert keys[:2] == ["cache_clear", "init_start"]
    assert keys.index("init_stop") < keys.index("run_start") < keys.index("block_start") < keys.index("run_stop")
    assert keys[-2:] == ["run_stop", "train_samples"]
    assert keys.count("eval_accuracy") == 4 and keys.count("block_start") == 4 and keys.count("block_stop") == 4


def test_the_checker_catches_a_run_that_missed_the_target_or_broke_a_rule(tmp_path):
    cfg, plan = mlperf_run("llama31_8b")
    log = drive_run(tmp_path / "aborted", cfg, plan, [5.0, 4.0, 3.6])
    assert [e["metadata"]["status"] for e in events(log) if e["key"] == "run_stop"] == ["aborted"]
    problems = compliance_problems(log, "llama31_8b", "6.1.0")
    assert problems == ["Failed checks for eval_accuracy : (v['value'] <= 3.3) and v['value'] > 0.0"]

    cfg, plan = mlperf_run("llama31_8b", "training.seq_length=4096")
    log = drive_run(tmp_path / "short", cfg, plan, [3.2])
    assert any("max_sequence_length" in p for p in compliance_problems(log, "llama31_8b", "6.1.0"))


def test_logged_values_are_the_ones_training_uses():
    cfg, plan = mlperf_run("llama31_8b", "seed=7", "dtype=fp8")
    keys = dict(run_keys(cfg, plan, "run", "NVIDIA H100 80GB HBM3", 0))
    assert keys["opt_learning_rate_decay_steps"] == 1_200_000 - 128 and keys["max_steps"] == 1_200_000
    assert keys["opt_learning_rate_warmup_steps"] == 128 and keys["opt_base_learning_rate"] == 8e-4
    assert keys["gradient_accumulation_steps"] == 32 // (1 * 4)  # GBS / (MBS x DP4 of TP1 CP2 on 8 GPUs)
    assert keys["eval_samples"] == 1024 and keys["seed"] == 7 and keys["max_sequence_length"] == 8192
    assert keys["submission_platform"] == "1x8xNVIDIA H100 80GB HBM3"
    assert keys["lowest_numerical_precision_in_linear"] == "fp8"
    assert keys["lowest_numerical_precision_in_comm"] == "fp8"  # FP8 param gather
    assert keys["lowest_numerical_precision_in_attn"] == "bfloat16"
    cfg, plan = mlperf_run("llama31_405b", "training.global_batch_size=2304")
    keys = dict(run_keys(cfg, plan, "run", "gpu", 0))
    assert keys["gradient_accumulation_steps"] == 2304 // 8 and keys["eval_samples"] == 5760
    assert keys["opt_learning_rate_decay_steps"] == 1_200_000 - 8000
    assert keys["lowest_numerical_precision_in_linear"] == "bfloat16"


def test_other_ranks_and_other_runs_log_nothing(tmp_path):
    cfg, plan = mlperf_run("llama31_8b")
    drive_run(tmp_path / "rank0", cfg, plan, [3.0], logs_here=False)
    assert not (tmp_path / "rank0" / "mllog.txt").exists()
    plain = compose(["training=llama31/8b", "cluster=bcm"])
    log = MLPerfLog.open(str(tmp_path), plain, plan, True, True, clock=Clock())
    log.run_start(0)
    log.run_stop(True, 10)
    assert not log.enabled and list(tmp_path.iterdir()) == [tmp_path / "rank0"]


# ----------------------------------------------------------------------------- evaluation data
def write_prefix(prefix: Path, documents: list[list[int]]) -> None:
    from data_prep.pipeline import megatron_indexed_dataset

    indexed = megatron_indexed_dataset()
    builder = indexed.IndexedDatasetBuilder(str(prefix) + ".bin", dtype=np.uint16)
    for doc in documents:
        builder.add_document(np.array(doc, dtype=np.uint16), [len(doc)])
    builder.finalize(str(prefix) + ".idx")


def test_validation_sequences_are_the_first_ones_in_document_order(tmp_path):
    first = [list(range(0, 5)), list(range(5, 12)), list(range(12, 15))]  # 15 tokens
    second = [list(range(100, 110))]  # 10 more
    write_prefix(tmp_path / "a", first)
    write_prefix(tmp_path / "b", second)
    stream = list(range(15)) + list(range(100, 110))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = data.InOrderSequences([str(tmp_path / "a"), str(tmp_path / "b")], seq_length=4, num_samples=6)
        assert len(ds) == 6
        for i in range(6):
            sample = ds[i]
            window = stream[4 * i : 4 * i + 5]  # seq + 1 tokens, overlapping the next sample by one
            assert sample["tokens"].tolist() == window[:-1] and sample["labels"].tolist() == window[1:]
            assert sample["loss_mask"].tolist() == [1.0] * 4 and sample["position_ids"].tolist() == [0, 1, 2, 3]
        # 25 tokens hold (25 - 1) // 4 = 6 samples of 4 (+1 label); a seventh does not fit.
        with pytest.raises(SystemExit, match="holds 6 sequences of 4 tokens but an evaluation reads 7"):
            data.InOrderSequences([str(tmp_path / "a"), str(tmp_path / "b")], seq_length=4, num_samples=7)


def test_evaluation_reads_exactly_its_sequences_in_training_sized_calls():
    assert evaluation.eval_microbatches(1024, 1, 4, 8) == [8] * 32  # 8B default: 256 microbatches per rank
    assert evaluation.eval_microbatches(1024, 1, 8, 12) == [12] * 10 + [8]  # GBS 96 on DP 8: the rest in a last call
    assert evaluation.eval_microbatches(5760, 1, 8, 144) == [144] * 5  # 405B
    train = compose(["training.val_steps=4"]).training
    assert evaluation.eval_samples(changed(train, {"val_samples": None}), 32) == 128
    assert evaluation.eval_samples(changed(train, {"val_samples": 1024}), 32) == 1024


@pytest.mark.parametrize("gbs", [8, 16, 32])
def test_the_lora_benchmark_evaluates_every_384_samples_after_skipping_its_first(gbs):
    """The evaluations the trainer's cadence runs with the values the launcher asks for at this GBS, against the
    rule written out: every 384 samples, none of the first floor(0.125 x GBS + 2), and one after the last step."""
    from launcher.plan.checks.mlperf import expected_settings

    cfg, _ = mlperf_run("llama2_70b_lora", f"training.global_batch_size={gbs}")
    want = expected_settings(cfg.mlperf.rules, gbs)
    interval, skip = want["val_interval"][0], want["val_skip"][0]
    last = 40 * 384 // gbs  # 40 x 384 samples
    policy = EvalPolicy(interval=interval, last_step=last, target=0.925, skip=skip)
    evaluated = [step * gbs for step in range(1, last + 1) if policy.due(step)]
    skipped = {8: 3, 16: 4, 32: 6}[gbs]  # floor(1 + 2), floor(2 + 2), floor(4 + 2)
    assert evaluated == [384 * k for k in range(skipped + 1, 41)]
    assert evaluated == mlperf_eval_samples(384, skipped, gbs, last)
    # A cadence one step off, or a skip one too small, is caught.
    assert [s * gbs for s in range(1, last + 1) if EvalPolicy(interval, last, 0.925, skip - 1).due(s)] != evaluated
