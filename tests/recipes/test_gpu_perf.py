"""The single-GPU performance settings on one GPU, with the tiny model on real text (Python's standard library
sources, tokenized by the data-preparation stage; test_gpu_training's corpus):

- CUDA graphs (per-layer and full-iteration) in a run that evaluates mid-run, checkpoints, is stopped by SIGTERM
  after capturing, and resumes: it must finish (no hang at evaluation, at the stop or at teardown) with the losses
  of the same run without graphs, bitwise where the graphs replay the same kernels in deterministic mode;
- the FP8 defaults, which include FP8 attention where the plan turns it on (as here: delayed scaling, heads of
  128), reach a validation loss within 0.05 of bf16 after 300 steps, and within 0.05 of FP8 with bf16 attention;
- Transformer Engine's loss kernel (the default with one tensor-parallel rank) reaches a validation loss within
  0.05 of the native kernel's after 300 steps, in FP8.

About 11 minutes on one H200, the corpus included."""

from __future__ import annotations

import json
import signal

import pytest

import test_gpu_training
from test_gpu_training import interrupt_at_step, main_py, read_metrics, tiny

corpus = test_gpu_training.corpus  # the module-scoped fixture, here for this module's tests

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(2400)]

# Deterministic kernels: eager and graphed runs may then differ only through what the graphs change. Evaluation at
# steps 10, 20, 30 and checkpoints at 10, 20, 30 (graphs are captured after step 3 of each process).
GRAPH_RUN = [
    "training.train_steps=30",
    "training.val_interval=10",
    "training.val_steps=2",
    "training.checkpoint.interval=10",
    "training.deterministic=true",
    "training.cuda_graph_warmup_steps=3",
]
# One step that only saves the initial weights (no learning-rate warmup: it must end before the decay horizon).
INIT_RUN = [
    "training.train_steps=1",
    "training.scheduler.warmup_steps=0",
    "training.val_interval=0",
    "training.checkpoint.save_initial=true",
    "training.checkpoint.save_at_end=false",
]
# The FP8 accuracy runs: 300 steps, validated every 100. Heads of 128 (the tiny model's are 64) because cuDNN's FP8
# attention trains only those on Hopper; bf16 and FP8 runs share the shape.
ACCURACY_RUN = [
    "training.train_steps=300",
    "training.val_interval=100",
    "training.checkpoint.interval=0",
    "training.checkpoint.save_at_end=false",
    "training.model.kv_channels=128",
]


@pytest.fixture(scope="module")
def eager(corpus, tmp_path_factory):
    """Initial weights every run starts from, and the run without graphs."""
    results = tmp_path_factory.mktemp("graphs")
    main_py(*tiny(corpus, results, "init", *INIT_RUN))
    init = results / "init" / "checkpoints" / "iter_0000000"
    assert init.is_dir()
    start = f"training.checkpoint.init_from={init}"
    main_py(*tiny(corpus, results, "eager", *GRAPH_RUN, start))
    return results, start, read_metrics(results / "eager")


@pytest.mark.parametrize("mode", ["per_layer", "full_iteration"])
def test_cuda_graphs_evaluate_save_stop_and_resume_with_the_eager_losses(mode, corpus, eager):
    results, start, reference = eager
    run = tiny(corpus, results, mode, *GRAPH_RUN, start, f"training.cuda_graphs={mode}")
    # Stopped after the step-10 evaluation and checkpoint, with graphs replaying since step 4.
    output = interrupt_at_step(run, results / mode, 14, signal.SIGTERM)
    assert "CUDA graphs:" in output and "captured after 3 eager steps" in output, output[-3000:]
    assert "stopped by signal" in output, output[-3000:]
    resumed = main_py(*run)  # main_py's timeout fails the test if the run hangs anywhere, teardown included
    assert "resumed at step" in resumed.stdout + resumed.stderr
    graphed = read_metrics(results / mode)
    assert sorted(graphed) == list(range(1, 31))
    for step in (10, 20, 30):
        assert graphed[step].get("val_loss") is not None and reference[step].get("val_loss") is not None
    loss_diff = max(abs(graphed[s]["loss"] - reference[s]["loss"]) for s in range(1, 31))
    val_diff = max(abs(graphed[s]["val_loss"] - reference[s]["val_loss"]) for s in (10, 20, 30))
    print(
        f"\n{mode}: max |loss difference| vs eager over 30 steps {loss_diff:.2e}, validation {val_diff:.2e}"
        f" ({'bitwise' if loss_diff == 0 and val_diff == 0 else 'not bitwise'})"
    )
    # Before the first capture the run is eager: same weights, data and kernels, the same losses bit for bit.
    assert [graphed[s]["loss"] for s in (1, 2, 3)] == [reference[s]["loss"] for s in (1, 2, 3)]
    # Graph replays launch the kernels the eager steps launched; bf16 tolerance covers a kernel chosen differently
    # under capture (a workspace-dependent GEMM algorithm).
    assert loss_diff < 0.02 and val_diff < 0.02


@pytest.fixture(scope="module")
def bf16_300(corpus, tmp_path_factory):
    results = tmp_path_factory.mktemp("fp8_accuracy")
    steps = ACCURACY_RUN
    main_py(*tiny(corpus, results, "bf16", *steps))
    return results, steps, read_metrics(results / "bf16")


@pytest.fixture(scope="module")
def fp8_300(corpus, bf16_300):
    """The FP8 defaults; their plan turns FP8 attention on (the accuracy checked here is what that rests on)."""
    results, steps, _ = bf16_300
    main_py(*tiny(corpus, results, "fp8", *steps, "dtype=fp8"))
    assert json.loads((results / "fp8" / "plan.json").read_text())["fp8_dot_product_attention"] is True
    return read_metrics(results / "fp8")


def validation_differences(run: dict, against: dict) -> dict[int, float]:
    return {s: run[s]["val_loss"] - against[s]["val_loss"] for s in (100, 200, 300)}


def test_fp8_defaults_reach_the_bf16_validation_loss(bf16_300, fp8_300):
    _, _, bf16 = bf16_300
    diffs = validation_differences(fp8_300, bf16)
    print(
        f"\nfp8: validation loss bf16 {bf16[300]['val_loss']:.4f}, fp8 {fp8_300[300]['val_loss']:.4f}; "
        "difference at steps 100/200/300: " + " / ".join(f"{d:+.4f}" for d in diffs.values())
    )
    assert abs(diffs[300]) < 0.05


def test_fp8_attention_reaches_the_validation_loss_of_bf16_attention(corpus, bf16_300, fp8_300):
    """FP8 attention's default rests on this: the FP8 defaults' validation loss after 300 steps within 0.05 of the
    same FP8 run with bf16 attention."""
    results, steps, bf16 = bf16_300
    main_py(*tiny(corpus, results, "fp8_bf16_attention", *steps, "dtype=fp8", "dtype.fp8_dot_product_attention=false"))
    bf16_attention = read_metrics(results / "fp8_bf16_attention")
    diffs = validation_differences(fp8_300, bf16_attention)
    print(
        f"\nfp8 attention: validation loss {fp8_300[300]['val_loss']:.4f}, with bf16 attention "
        f"{bf16_attention[300]['val_loss']:.4f}, bf16 {bf16[300]['val_loss']:.4f}; difference from bf16 attention at "
        "steps 100/200/300: " + " / ".join(f"{d:+.4f}" for d in diffs.values())
    )
    assert abs(diffs[300]) < 0.05


def test_the_te_loss_default_reaches_the_validation_loss_of_the_native_loss(corpus, bf16_300, fp8_300):
    """The default of Transformer Engine's loss kernel with one tensor-parallel rank rests on this (it was 2.2-3.4%
    faster on the 8B proxy on one H200, conf/training/_common.yaml): the FP8 defaults' run, which takes it, within
    0.05 of the same 300 steps with megatron-core's native kernel."""
    results, steps, _ = bf16_300
    plan = json.loads((results / "fp8" / "plan.json").read_text())
    assert plan["tp"] == 1 and plan["cross_entropy_fusion"] == "te"
    native_loss = "training.model.cross_entropy_fusion=native"
    main_py(*tiny(corpus, results, "fp8_native_loss", *steps, "dtype=fp8", native_loss))
    native = read_metrics(results / "fp8_native_loss")
    diffs = validation_differences(fp8_300, native)
    print(
        f"\nTE loss: validation loss {fp8_300[300]['val_loss']:.4f}, native {native[300]['val_loss']:.4f}; "
        "difference at steps 100/200/300: " + " / ".join(f"{d:+.4f}" for d in diffs.values())
    )
    assert abs(diffs[300]) < 0.05
