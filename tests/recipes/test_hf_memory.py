"""Host memory of the Hugging Face import and export at Llama 3.1 8B widths (hidden 4096, FFN 14336, vocabulary
128256, 32 heads, 8 KV groups). HF_MEMORY_LAYERS sets the number of layers (default 4, a 3.9 GB model, so the
test fits this machine's disk and time; 32 is the whole 8B model, 16 GB).

- Import into TP2: each rank builds its chunks on the meta device (megatron's own sharded layout, no memory) and
  runs the real import, which reads every slice the rank holds; its peak RSS must stay below half the model.
- Export of a TP2 checkpoint of the same model (saved by CPU ranks with dist_checkpointing) in its own process:
  peak RSS below twice the largest tensor plus one shard."""

import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")
pytest.importorskip("safetensors")

import cpu_megatron  # noqa: E402
from common.typed import to_plain  # noqa: E402
from common.plan import Plan  # noqa: E402
from launcher.config.compose import compose  # noqa: E402
from launcher.plan.build import build_plan  # noqa: E402
from launcher.plan.hardware import LocalGpus  # noqa: E402
from common import safetensors_io  # noqa: E402
from recipes.hf import checkpoint_to_hf, importer, mapping  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
LAYERS = int(os.environ.get("HF_MEMORY_LAYERS", "4"))
SHARD_BYTES = 2 * 10**9
pytestmark = pytest.mark.timeout(3600)


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def require_free_disk(directory: Path, needed: int) -> None:
    free = shutil.disk_usage(directory).free
    if free < needed:
        pytest.fail(
            f"needs {gib(needed)} free in {directory} (the model, its checkpoint and its export), "
            f"has {gib(free)}; set HF_MEMORY_LAYERS lower or free the disk",
            pytrace=False,
        )


def peak_rss_bytes() -> int:
    """This process's peak resident set (VmHWM). ru_maxrss would include what the parent used before the fork."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/self/status")


def reset_peak_rss() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # Linux: the peak restarts from the current RSS


def configured() -> tuple[dict, Plan]:
    cfg = compose(
        [
            "training=llama31/8b",
            f"training.model.num_layers={LAYERS}",
            "parallelism=tp2_sp",
            "parallelism.sequence_parallel=false",
            "parallelism.tp_comm_overlap=false",
            "cluster.gpus_per_node=2",
            "memory_check=false",
            "training.tokenizer.path=/nonexistent",
        ]
    )
    return cfg, build_plan(cfg, LocalGpus(2, "h100", ("gpu",)))


def write_random_model(directory: Path, shapes: dict, total: int) -> None:
    """Random bf16 weights of these shapes as Hugging Face shards (safetensors' own writer) and index."""
    from safetensors.torch import save_file

    shards = checkpoint_to_hf.shard_plan(shapes, 2, SHARD_BYTES)
    weight_map = {}
    generator = torch.Generator().manual_seed(0)
    for index, names in enumerate(shards):
        file = f"model-{index + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(
            {n: torch.randn(shapes[n], generator=generator).to(torch.bfloat16) for n in names},
            str(directory / file),
            metadata={"format": "pt"},
        )
        weight_map.update({n: file for n in names})
    (directory / safetensors_io.INDEX_FILE).write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map})
    )


def import_on_meta(rank: int, cfg: dict, plan: Plan, hf_dir: str) -> tuple[int, int, int]:
    """(RSS before the import, peak RSS after it, bytes this rank read) with the model on the meta device."""
    with torch.device("meta"):
        chunks = cpu_megatron.build_chunks(cfg, plan, dtype=torch.bfloat16)
    reset_peak_rss()
    before = peak_rss_bytes()
    local = sum(p.numel() * p.element_size() for c in chunks for p in c.parameters())
    importer.load_hf_weights(
        hf_dir, chunks, cfg.training.model, plan.padded_vocab_size, lambda m: None, show_progress=False
    )
    return before, peak_rss_bytes(), local


def import_and_save(rank: int, cfg: dict, plan: Plan, hf_dir: str, run_dir: str) -> str:
    chunks = cpu_megatron.build_chunks(cfg, plan, dtype=torch.bfloat16)
    importer.load_hf_weights(
        hf_dir, chunks, cfg.training.model, plan.padded_vocab_size, lambda m: None, show_progress=False
    )
    return cpu_megatron.save_checkpoint(rank, chunks, run_dir)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """The random model, removed after the module: pytest keeps the last three runs' temporary directories, and
    three copies of these gigabytes would fill a CI disk."""
    cfg, plan = configured()
    model = cfg.training.model
    directory = tmp_path_factory.mktemp("source")
    shapes = mapping.hf_shapes(model)
    tensor_bytes = [2 * math.prod(s) for s in shapes.values()]
    total, largest = sum(tensor_bytes), max(tensor_bytes)
    require_free_disk(directory, 3 * total + 2**30)
    start = time.time()
    try:
        write_random_model(directory, shapes, total)
        print(
            f"\nmodel: 8B widths, {LAYERS} layers, {gib(total)} of bf16 weights (largest tensor {gib(largest)}), "
            f"written in {time.time() - start:.0f} s"
        )
        yield {"dir": directory, "cfg": cfg, "plan": plan, "total": total, "largest": largest}
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def scratch(tmp_path):
    """tmp_path, emptied after the test for the same reason as the source model."""
    yield tmp_path
    shutil.rmtree(tmp_path, ignore_errors=True)


@pytest.mark.slow
def test_import_into_tp2_keeps_each_rank_below_half_the_model(source):
    results = cpu_megatron.run_ranks(import_on_meta, 2, source["cfg"], source["plan"], str(source["dir"]))
    total = source["total"]
    for rank, (before, peak, local) in enumerate(results):
        print(
            f"\nimport into TP2, rank {rank}: reads {gib(local)}; peak RSS {gib(peak)} (process before the import "
            f"{gib(before)}); limit half the model = {gib(total / 2)}"
        )
        assert local > 0.45 * total  # the rank really read its half of the model
        assert peak < total / 2


@pytest.mark.slow
def test_export_stays_below_twice_the_largest_tensor_plus_a_shard(source, scratch):
    """Needs the model twice in memory to make the checkpoint (CPU ranks): meant for the default 4 layers."""
    import yaml

    cfg, plan = source["cfg"], source["plan"]
    run_dir = scratch / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(yaml.safe_dump(to_plain(cfg)))
    checkpoint = cpu_megatron.run_ranks(import_and_save, 2, cfg, plan, str(source["dir"]), str(run_dir))[0]
    out = scratch / "export"
    probe = (
        "import sys\nfrom recipes.hf import exporter\nfrom test_hf_memory import peak_rss_bytes\n"
        "code = exporter.main(sys.argv[1:])\nprint('PEAK_RSS', peak_rss_bytes())\nsys.exit(code)"
    )
    start = time.time()
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            probe,
            "--checkpoint",
            checkpoint,
            "--out",
            str(out),
            "--max-shard-size",
            str(SHARD_BYTES),
            "--no-tokenizer",
            "--no-progress",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=3000,
        env=dict(os.environ, PYTHONPATH=f"{REPO}:{Path(__file__).parent}"),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    peak = int(result.stdout.split("PEAK_RSS")[1].split()[0])
    limit = 2 * source["largest"] + SHARD_BYTES
    print(
        f"\nexport of the TP2 checkpoint ({time.time() - start:.0f} s): peak RSS {gib(peak)}; limit 2 x largest "
        f"tensor + one shard = {gib(limit)}"
    )
    assert peak < limit

    from safetensors import safe_open

    index = json.loads((source["dir"] / safetensors_io.INDEX_FILE).read_text())["weight_map"]
    exported = json.loads((out / safetensors_io.INDEX_FILE).read_text())["weight_map"]
    assert set(index) == set(exported)
    for name in index:
        with safe_open(str(source["dir"] / index[name]), "pt") as a, safe_open(str(out / exported[name]), "pt") as b:
            assert torch.equal(a.get_tensor(name), b.get_tensor(name)), name
