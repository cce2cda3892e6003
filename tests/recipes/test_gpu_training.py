"""End-to-end training through `python main.py ... cluster=local` on this machine's GPUs: the tiny model on
real tokenized text (data preparation over a local corpus), checkpoint/resume, and the parallel layouts on two
and four GPUs against the single-GPU loss curve. The four-GPU tests (TP4 with sequence parallelism, DP4, TP2 x PP2;
FP8 at DP4 and with TP4 userbuffers; a hard kill and resume at DP4 and TP2 x PP2) skip where fewer than 4 GPUs are
visible; on a 4-GPU machine `python -m pytest -m gpu -s tests/recipes/test_gpu_training.py -k four_gpu` runs them
alone: 13 tiny runs of 40-80 steps after the corpus. On 4 H200 the eight tests took 16 minutes: 71-84 s a run of
40 steps, of which the steps took under 10 s and the training processes' start-up 15-24 s."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from corpora import train_sentencepiece, write_stdlib_corpus

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.gpu, pytest.mark.timeout(3600)]


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


def main_py(*overrides: str, cwd: Path = REPO, check: bool = True, timeout: int = 1200) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(REPO / "main.py"), *overrides]
    result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stdout[-6000:]}\n{result.stderr[-6000:]}"
        )
    return result


def interrupt_at_step(overrides: list[str], run_dir: Path, step: int, sig: int) -> str:
    """Start main.py, send `sig` to its whole process group once it logged `step` steps; return its output."""
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "main.py"), *overrides],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    metrics_file = run_dir / "metrics.jsonl"
    deadline = time.time() + 900
    while time.time() < deadline and proc.poll() is None:
        if metrics_file.exists() and len(metrics_file.read_text().splitlines()) >= step:
            break
        time.sleep(0.5)
    if proc.poll() is not None:  # it ended by itself before the step: say why, rather than fail to signal it
        output, _ = proc.communicate()
        raise AssertionError(f"main.py ended (exit {proc.returncode}) before step {step}:\n{output[-6000:]}")
    os.killpg(proc.pid, sig)
    output, _ = proc.communicate(timeout=300)
    return output


def read_metrics(run_dir: Path) -> dict[int, dict]:
    records = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        records[record["step"]] = record
    return records


def max_loss_diff(a: dict[int, dict], b: dict[int, dict], steps) -> float:
    return max(abs(a[s]["loss"] - b[s]["loss"]) for s in steps)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict:
    """Python's standard library sources as a text corpus: real, local, a few MB. Tokenized with a
    sentencepiece model trained on it, through the data-preparation stage."""
    root = tmp_path_factory.mktemp("corpus")
    docs = write_stdlib_corpus(root / "stdlib.jsonl", max_chars=12_000_000)
    train_sentencepiece(root / "sp", [docs], vocab_size=8000, max_documents=2000)
    tokenizer = ["training.tokenizer.type=sentencepiece", f"training.tokenizer.path={root / 'sp.model'}"]
    main_py(
        "stages=[data_preparation]",
        "data_preparation=files",
        f"data_preparation.inputs=[{docs}]",
        f"data_preparation.output_dir={root / 'data'}",
        f"results_dir={root / 'runs'}",
        *tokenizer,
    )
    prefix = root / "data" / "stdlib_text_document"
    assert prefix.with_suffix(".bin").exists() and prefix.with_suffix(".idx").exists()
    return {
        "root": root,
        "overrides": tokenizer
        + ["training.data.mock=false", f"training.data.blend=[{prefix}]", "training.model.vocab_size=8192"],
    }


def tiny(corpus, results: Path, name: str, *extra: str) -> list[str]:
    return [
        "training=llama31/tiny",
        "cluster=local",
        f"results_dir={results}",
        f"run_name={name}",
        *corpus["overrides"],
        *extra,
    ]


def test_sigterm_saves_and_the_rerun_continues(corpus, tmp_path):
    steps = [
        "training.train_steps=120",
        "training.checkpoint.interval=30",
        "training.checkpoint.async_save=true",
        "training.val_interval=0",
    ]
    output = interrupt_at_step(tiny(corpus, tmp_path, "signalled", *steps), tmp_path / "signalled", 40, signal.SIGTERM)
    assert "stopped by signal" in output, output[-3000:]
    saved = sorted(int(p.name[5:]) for p in (tmp_path / "signalled" / "checkpoints").glob("iter_*"))
    assert saved[0] == 30 and 40 <= saved[-1] < 120 and saved[-1] % 30 != 0, saved  # periodic, then the signal
    main_py(*tiny(corpus, tmp_path, "signalled", *steps))
    assert sorted(read_metrics(tmp_path / "signalled")) == list(range(1, 121))


def test_diverging_run_stops_with_a_pointer_to_the_last_checkpoint(corpus, tmp_path):
    # The first step runs at warmup's LR 0 and is checkpointed; then LR 5e3 blows the weights up.
    result = main_py(
        *tiny(
            corpus,
            tmp_path,
            "diverging",
            "training.train_steps=200",
            "training.val_interval=0",
            "training.checkpoint.interval=1",
            "training.optimizer.lr=1e4",
            "training.optimizer.min_lr=1e3",
            "training.scheduler.warmup_steps=2",
            "training.optimizer.clip_grad=1e9",
        ),
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "training stopped. Last good checkpoint:" in output, output[-3000:]
    assert "iter_" in output.split("Last good checkpoint:")[1].splitlines()[0]


DETERMINISTIC = [
    "training.train_steps=200",
    "training.checkpoint.interval=50",
    "training.val_interval=50",
    "training.deterministic=true",
]


def first_difference(a: dict[int, dict], b: dict[int, dict], keys=("loss", "grad_norm", "val_loss")) -> str | None:
    """The first step (and what) at which two runs' records differ at all, or None: bit for bit equal."""
    for step in sorted(set(a) | set(b)):
        for key in keys:
            if a.get(step, {}).get(key) != b.get(step, {}).get(key):
                return f"step {step} {key}: {a.get(step, {}).get(key)!r} against {b.get(step, {}).get(key)!r}"
    return None


def test_one_deterministic_step_computes_the_same_tensors_in_fresh_processes(corpus, tmp_path):
    # Every forward activation, every gradient flowing back and every weight gradient of one step, in 4 processes
    # started one after another: a kernel whose result depends on the process (the native loss fusion's did)
    # shows as the first entry that differs.
    main_py(*tiny(corpus, tmp_path, "digests", "training.deterministic=true", "dry_run=true"))
    runs = []
    for i in range(4):
        out = tmp_path / f"digests{i}.json"
        env = {**os.environ, "MASTER_PORT": str(29700 + i)}
        subprocess.run(
            [sys.executable, str(REPO / "tests/recipes/step_digests.py"), str(tmp_path / "digests"), str(out)],
            cwd=REPO,
            env=env,
            check=True,
            capture_output=True,
            timeout=900,
        )
        runs.append(json.loads(out.read_text()))
    first = runs[0]
    print(f"\n{len(first['forward'])} forward, {len(first['backward'])} backward tensors, {len(first['grads'])} grads")
    for other in runs[1:]:
        for part in ("forward", "backward", "grads"):
            differing = [a[0] for a, b in zip(first[part], other[part]) if a != b]
            assert len(first[part]) == len(other[part]) and not differing, (part, differing[:3])


def test_a_deterministic_run_repeats_itself_bit_for_bit(corpus, tmp_path):
    main_py(*tiny(corpus, tmp_path, "first", *DETERMINISTIC))
    main_py(*tiny(corpus, tmp_path, "second", *DETERMINISTIC))
    first, second = read_metrics(tmp_path / "first"), read_metrics(tmp_path / "second")
    assert sorted(first) == list(range(1, 201))
    assert first_difference(first, second) is None, first_difference(first, second)


LAYOUTS = {
    "tp2_sp": ["parallelism=tp2_sp", "parallelism.tp_comm_overlap=false"],
    "pp2_vp2_asym": ["parallelism=pp2_vp2_asym"],
    "cp2": ["parallelism=tp1_cp2", "parallelism.num_gpus=2"],
    "dp2": ["parallelism=tp1", "parallelism.num_gpus=2"],
}


# Four GPUs: TP4 and TP2 x PP2 with sequence parallelism (no userbuffers: the comparison is of
# the layout's arithmetic, as tp2_sp above; FOUR_GPU_FP8 has them), and DP4. The tiny model's 8 heads and 4 KV groups
# split over TP4, its 6 layers over PP2, and its GBS 8 of MBS 2 over DP4.
FOUR_GPU_LAYOUTS = {
    "tp4_sp": [
        "parallelism=custom",
        "parallelism.num_gpus=4",
        "parallelism.tp=4",
        "parallelism.sequence_parallel=true",
    ],
    "dp4": ["parallelism=tp1", "parallelism.num_gpus=4"],
    "tp2_pp2": [
        "parallelism=custom",
        "parallelism.num_gpus=4",
        "parallelism.tp=2",
        "parallelism.pp=2",
        "parallelism.sequence_parallel=true",
    ],
}


@pytest.fixture(scope="module")
def four_gpus() -> None:
    """Skips a test unless 4 GPUs are visible; first among a test's fixtures, so before the corpus is built."""
    if gpu_count() < 4:
        pytest.skip(f"needs 4 GPUs, {gpu_count()} visible")


@pytest.fixture(scope="module")
def single_gpu_reference(corpus, tmp_path_factory):
    results = tmp_path_factory.mktemp("layouts")
    main_py(
        *tiny(
            corpus,
            results,
            "reference",
            "training.train_steps=40",
            "training.val_interval=0",
            "training.checkpoint.save_initial=true",
            "training.checkpoint.interval=0",
            "training.deterministic=true",
        )
    )
    init = results / "reference" / "checkpoints" / "iter_0000000"
    assert init.is_dir()
    return results, read_metrics(results / "reference"), init


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_two_gpu_layouts_match_single_gpu(layout, corpus, single_gpu_reference):
    if gpu_count() < 2:
        pytest.skip("needs 2 GPUs")
    layout_matches_single_gpu(layout, LAYOUTS[layout], corpus, single_gpu_reference)


@pytest.mark.parametrize("layout", list(FOUR_GPU_LAYOUTS))
def test_four_gpu_layouts_match_single_gpu(layout, four_gpus, corpus, single_gpu_reference):
    layout_matches_single_gpu(layout, FOUR_GPU_LAYOUTS[layout], corpus, single_gpu_reference)


def layout_matches_single_gpu(layout: str, overrides: list[str], corpus, single_gpu_reference) -> None:
    results, reference, init = single_gpu_reference
    main_py(
        *tiny(
            corpus,
            results,
            layout,
            "training.train_steps=40",
            "training.val_interval=0",
            f"training.checkpoint.init_from={init}",
            "training.deterministic=true",
            *overrides,
        )
    )
    ours = read_metrics(results / layout)
    first = max_loss_diff(reference, ours, [1])
    early = max_loss_diff(reference, ours, range(1, 11))
    diff = max_loss_diff(reference, ours, range(1, 41))
    print(
        f"\n{layout}: max |loss difference| vs 1 GPU: step 1 {first:.2e}, steps 1-10 {early:.2e}, "
        f"steps 1-40 {diff:.2e} (loss {reference[1]['loss']:.3f} -> {reference[40]['loss']:.3f})"
    )
    # Same weights and tokens: step 1 differs only by reduction order; later steps drift apart slowly.
    assert first < 5e-3 and early < 0.03 and diff < 0.25


FP8_AND_OVERLAP = {
    "fp8": ["dtype=fp8"],
    "fp8_dp2": ["dtype=fp8", "parallelism=tp1", "parallelism.num_gpus=2"],
    "fp8_tensorwise": ["dtype=fp8", "dtype.fp8_recipe=tensorwise", "parallelism=tp1", "parallelism.num_gpus=2"],
    "tp2_userbuffers": ["parallelism=tp2_sp"],
    "fp8_tp2_userbuffers": ["dtype=fp8", "parallelism=tp2_sp"],
}


# Four GPUs: FP8 at DP4 with FP8 param gather (the plan's choice from 8 optimizer shards, or where bf16 weights would
# not fit: set here, as 4 shards of the tiny model leave it off), and TP4 with userbuffer overlap in bf16 and in FP8.
TP4_USERBUFFERS = [
    "parallelism=custom",
    "parallelism.num_gpus=4",
    "parallelism.tp=4",
    "parallelism.sequence_parallel=true",
]
FOUR_GPU_FP8 = {
    "fp8_dp4": ["dtype=fp8", "dtype.fp8_param_gather=true", "parallelism=tp1", "parallelism.num_gpus=4"],
    "tp4_userbuffers": [*TP4_USERBUFFERS, "parallelism.tp_comm_overlap=true"],
    "fp8_tp4_userbuffers": ["dtype=fp8", *TP4_USERBUFFERS, "parallelism.tp_comm_overlap=true"],
}


@pytest.mark.parametrize("variant", list(FP8_AND_OVERLAP))
def test_fp8_and_tp_overlap_stay_close_to_bf16(variant, corpus, single_gpu_reference):
    if variant != "fp8" and gpu_count() < 2:
        pytest.skip("needs 2 GPUs")
    stays_close_to_bf16(variant, FP8_AND_OVERLAP[variant], corpus, single_gpu_reference)


@pytest.mark.parametrize("variant", list(FOUR_GPU_FP8))
def test_four_gpu_fp8_and_tp_overlap_stay_close_to_bf16(variant, four_gpus, corpus, single_gpu_reference):
    stays_close_to_bf16(variant, FOUR_GPU_FP8[variant], corpus, single_gpu_reference)


def stays_close_to_bf16(variant: str, extra: list[str], corpus, single_gpu_reference) -> None:
    results, reference, init = single_gpu_reference
    run = main_py(
        *tiny(
            corpus,
            results,
            variant,
            "training.train_steps=40",
            "training.val_interval=0",
            f"training.checkpoint.init_from={init}",
            *extra,
        )
    )
    if "userbuffers" in variant:  # Transformer Engine announces the communicator it built
        assert "Create Userbuffers Communicator" in run.stdout + run.stderr
    ours = read_metrics(results / variant)
    diff = max_loss_diff(reference, ours, range(1, 41))
    late = max_loss_diff(reference, ours, range(31, 41))
    print(f"\n{variant}: max |loss difference| vs bf16 1 GPU: {diff:.3f} over 40 steps, {late:.3f} over steps 31-40")
    assert late < 0.05 * reference[40]["loss"]  # within 5% of the loss


# A hard kill and resume on 4 GPUs: the distributed optimizer's state sharded over DP4, and the weights over TP2 x
# PP2. Deterministic kernels and ring all-reduces (training.deterministic), so the resumed run must equal the
# uninterrupted one bit for bit, as on one GPU; 80 steps, a checkpoint every 20, killed after step 45.
FOUR_GPU_RESUMED = ("dp4", "tp2_pp2")
RESUME_STEPS = [
    "training.train_steps=80",
    "training.checkpoint.interval=20",
    "training.val_interval=20",
    "training.deterministic=true",
    "training.checkpoint.async_save=false",
]


@pytest.mark.parametrize("layout", FOUR_GPU_RESUMED)
def test_a_four_gpu_run_killed_hard_resumes_bit_for_bit(layout, four_gpus, corpus, tmp_path):
    overrides = [*RESUME_STEPS, *FOUR_GPU_LAYOUTS[layout]]
    main_py(*tiny(corpus, tmp_path, "straight", *overrides))
    straight = read_metrics(tmp_path / "straight")
    assert sorted(straight) == list(range(1, 81))
    interrupt_at_step(tiny(corpus, tmp_path, "crashed", *overrides), tmp_path / "crashed", 45, signal.SIGKILL)
    killed_at = len((tmp_path / "crashed" / "metrics.jsonl").read_text().splitlines())
    assert 45 <= killed_at < 80, killed_at
    assert (tmp_path / "crashed" / "checkpoints" / "iter_0000040").is_dir()
    out = main_py(*tiny(corpus, tmp_path, "crashed", *overrides))
    assert "resum" in out.stdout + out.stderr
    resumed = read_metrics(tmp_path / "crashed")
    assert sorted(resumed) == list(range(1, 81))
    print(
        f"\n{layout}: killed after step {killed_at}, resumed from 40; max |loss difference| vs the uninterrupted "
        f"run over steps 41-80: {max_loss_diff(straight, resumed, range(41, 81)):.2e}"
    )
    assert first_difference(straight, resumed) is None, first_difference(straight, resumed)


def test_tiny_trains_and_resumes_after_a_crash(corpus, tmp_path):
    # Deterministic kernels, so the two runs may only differ through what the crash and resume changed: every
    # step's loss, gradient norm and validation loss must be equal. Last in this file, so that it runs after the
    # other GPU tests of a call, with whatever caches they left.
    # Synchronous saves: the crash falls between complete checkpoints here; a kill while an asynchronous save is
    # being written is test_gpu_resilience.py's.
    steps = [*DETERMINISTIC, "training.checkpoint.async_save=false"]
    run = main_py(*tiny(corpus, tmp_path, "straight", *steps))
    # Rank 0's start-up line: where the time before the first step went, by phase.
    startup = r"\[recipes\] start-up on rank 0: [\d.]+ s \(stack check and imports [\d.]+, "
    assert re.search(startup, run.stdout + run.stderr)
    # And where the time after the last step went.
    assert re.search(r"\[recipes\] end of the run on rank 0: [\d.]+ s \(", run.stdout + run.stderr)
    straight = read_metrics(tmp_path / "straight")
    assert sorted(straight) == list(range(1, 201))
    first = sum(straight[s]["loss"] for s in range(1, 11)) / 10
    last = sum(straight[s]["loss"] for s in range(191, 201)) / 10
    print(
        f"\nloss: first 10 steps {first:.3f}, last 10 steps {last:.3f}; "
        f"val_loss at 200: {straight[200].get('val_loss')}"
    )
    assert last < first - 2.0, (first, last)
    assert all(v["val_loss"] is not None for s, v in straight.items() if s % 50 == 0)
    ckpts = sorted(p.name for p in (tmp_path / "straight" / "checkpoints").glob("iter_*"))
    assert ckpts == ["iter_0000150", "iter_0000200"]  # keep_last 2

    # Same run, killed hard after the step-100 checkpoint, then started again with the same command.
    interrupt_at_step(tiny(corpus, tmp_path, "crashed", *steps), tmp_path / "crashed", 130, signal.SIGKILL)
    killed_at = len((tmp_path / "crashed" / "metrics.jsonl").read_text().splitlines())
    assert 130 <= killed_at < 200, killed_at
    assert (tmp_path / "crashed" / "checkpoints" / "iter_0000100").is_dir()
    out = main_py(*tiny(corpus, tmp_path, "crashed", *steps))
    assert "resum" in out.stdout + out.stderr
    resumed = read_metrics(tmp_path / "crashed")
    assert sorted(resumed) == list(range(1, 201))
    before = max_loss_diff(straight, resumed, range(1, 101))
    after = max_loss_diff(straight, resumed, range(101, 201))
    print(
        f"max |loss difference| vs the uninterrupted run: steps 1-100 {before:.2e}, steps 101-200 "
        f"(after the resume) {after:.2e}"
    )
    assert first_difference(straight, resumed) is None, first_difference(straight, resumed)
