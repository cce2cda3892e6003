"""The plan's memory estimate against the peak PyTorch allocation measured on this machine's GPUs, for the 70B and
405B layer proxies on TP only (data parallel 1), where the optimizer step's fp32 copy of the gradients is the peak
(docs/memory.md). Prints both numbers."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.gpu, pytest.mark.timeout(1800)]
# The layer-shape proxies measured on 4 GPUs (70B with 10 layers, 405B with 4), fewer layers where they would not fit.
PROXY_LAYERS = {"70b": 10, "405b": 4}


def _gpus() -> int:
    import torch

    return torch.cuda.device_count()


def _overrides(model: str, layers: int, tp: int, results: Path) -> list[str]:
    preset = ["+userbuffers@parallelism.tp_comm_overlap_cfg=h8192_tp4"] if (model, tp) == ("70b", 4) else []
    return [
        f"training=llama31/{model}",
        f"training.model.num_layers={layers}",
        "parallelism=custom",
        f"parallelism.name=tp{tp}_{layers}layers",
        f"parallelism.tp={tp}",
        f"parallelism.num_gpus={tp}",
        "parallelism.sequence_parallel=true",
        "parallelism.tp_comm_overlap=true",
        *preset,
        "training.global_batch_size=2",
        "training.train_steps=3",
        "training.scheduler.warmup_steps=1",
        "training.val_interval=0",
        "training.checkpoint.interval=0",
        "training.checkpoint.save_at_end=false",
        "training.data.mock=true",
        "cluster=local",
        f"cluster.gpus_per_node={tp}",
        f"results_dir={results}",
    ]


def _fitting_layers(model: str, tp: int, results: Path) -> int:
    """The proxy's layer count, lowered until the plan's estimate fits this GPU with 10% to spare."""
    from launcher.config.compose import compose
    from launcher.plan.build import build_plan
    from launcher.plan.hardware import detect_local_gpus, gpu_spec

    local = detect_local_gpus()
    for layers in range(PROXY_LAYERS[model], 0, -1):
        plan = build_plan(compose([*_overrides(model, layers, tp, results), "memory_check=false"]), local)
        if plan.est_memory_gib_per_gpu <= 0.9 * gpu_spec(plan.gpu_type).memory_gib:
            return layers
    pytest.skip(f"no {model} proxy fits {tp} {local.gpu_type} GPUs")


@pytest.mark.parametrize("model", ["70b", "405b"])
def test_the_estimate_is_within_6_percent_of_the_measured_peak(model, tmp_path):
    gpus = _gpus()
    if gpus < 2:
        pytest.skip("needs 2 GPUs (TP2) or 4 (TP4, the measured proxies)")
    tp = 4 if gpus >= 4 else 2
    layers = _fitting_layers(model, tp, tmp_path)
    cmd = [sys.executable, str(REPO / "main.py"), *_overrides(model, layers, tp, tmp_path)]
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1500)
    assert result.returncode == 0, f"{result.stdout[-6000:]}\n{result.stderr[-6000:]}"
    run_dir = tmp_path / f"llama31_{model}_bf16_tp{tp}_{layers}layers_{tp}gpu"
    plan = json.loads((run_dir / "plan.json").read_text())
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    peak = max(r["peak_memory_gib"] for r in records if r.get("peak_memory_gib"))
    estimate = plan["est_memory_gib_per_gpu"]
    print(
        f"\n{model} {layers} layers TP{tp} on {plan['gpu_type']}: estimated {estimate:.1f} GiB, measured peak "
        f"{peak:.1f} GiB (largest rank's torch.cuda.max_memory_allocated), {estimate / peak - 1:+.1%}"
    )
    assert abs(estimate / peak - 1) < 0.06
