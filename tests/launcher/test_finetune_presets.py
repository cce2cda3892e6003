"""The fine-tuning presets (training=finetune/llama31_<size>_<lora|sft>): each one's default layout is on the fewest
8-GPU H100 nodes the plan's memory estimate fits, checked both ways: its own estimate fits an H100, and the next
smaller layout (fewer nodes, or one GPU) with full recomputation does not."""

from __future__ import annotations

import pytest

from common.config import LoraConfig
from launcher.plan.build import build_plan
from launcher.plan.errors import PlanError
from launcher.plan.hardware import gpu_spec

from launcher_helpers import planned

RECOMPUTE = (
    "parallelism.recompute_granularity=full",
    "parallelism.recompute_method=uniform",
    "parallelism.recompute_num_layers=1",
)


def smaller(tp: int, pp: int, gpus: int, cp: int = 1) -> tuple[str, ...]:
    return (
        "parallelism=custom",
        f"parallelism.name=tp{tp}_pp{pp}_cp{cp}",
        f"parallelism.num_gpus={gpus}",
        f"parallelism.tp={tp}",
        f"parallelism.pp={pp}",
        f"parallelism.cp={cp}",
        f"parallelism.sequence_parallel={str(tp > 1).lower()}",
        *RECOMPUTE,
    )


# preset -> (LoRA, GPUs of its default layout, the next smaller layouts, every one of which must not fit)
PRESETS = {
    "llama31_8b_lora_1gpu": (True, 1, []),
    "llama31_8b_lora": (True, 8, []),  # one node; one GPU fits too (the preset above)
    "llama31_8b_sft": (False, 8, [smaller(1, 1, 1)]),
    "llama31_70b_lora": (True, 8, []),
    # 80 layers split evenly over PP 2 or 4 at TP 8 or 4: 2 nodes is the next smaller (3 nodes has no even split)
    "llama31_70b_sft": (False, 32, [smaller(8, 2, 16), smaller(4, 4, 16)]),
    "llama31_405b_lora": (True, 16, [smaller(8, 1, 8)]),
    # 126 layers split evenly over PP 9 or 14 at TP 8: 9 nodes is the next smaller
    "llama31_405b_sft": (False, 112, [smaller(8, 9, 72)]),
}


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_each_preset_takes_the_fewest_h100_nodes_that_fit(cfg_for, preset):
    lora, gpus, next_smaller = PRESETS[preset]
    base = (f"training=finetune/{preset}", "cluster=bcm", "dry_run=true")
    cfg = cfg_for(*base)
    h100 = gpu_spec("h100").memory_gib
    assert isinstance(cfg.peft, LoraConfig) == lora and cfg.training.data.format == "sft"
    plan = build_plan(cfg)
    assert (plan.num_gpus, plan.gpus_per_node) == (gpus, min(gpus, 8))
    assert plan.est_memory_gib_per_gpu <= h100, plan.est_memory_gib_per_gpu
    # FP8 keeps the layout (the base model's own fp8 default would be its pretraining layout).
    assert build_plan(cfg_for(*base, "dtype=fp8")).num_gpus == gpus
    for overrides in next_smaller:
        small = build_plan(cfg_for(*base, "memory_check=false", *overrides))
        assert small.num_nodes < plan.num_nodes or small.num_gpus == 1
        assert small.est_memory_gib_per_gpu > h100, (overrides, small.est_memory_gib_per_gpu)


def test_a_too_small_layout_is_refused_by_the_memory_check(cfg_for):
    with pytest.raises(PlanError, match="exceeds the 79.6 GiB of cluster.gpu_type=h100"):
        planned(cfg_for("training=finetune/llama31_405b_lora", "cluster=bcm", "dry_run=true", *smaller(8, 1, 8)))
    planned(cfg_for("training=finetune/llama31_405b_lora", "cluster=bcm", "dry_run=true"))  # every check passes
