"""The plan: defaults per model and dtype, every training x dtype x parallelism x cluster combination (valid
ones checked for consistency, the others must fail), and the one-line errors for bad inputs."""

from __future__ import annotations

import itertools
import pytest

from launcher.plan.build import build_plan
from launcher.plan.errors import PlanError
from launcher.plan.hardware import LocalGpus, gpu_spec

from launcher_helpers import EIGHT_H100, NO_GPU, REPO, planned

MODELS = ("tiny", "8b", "70b", "405b")
DTYPES = ("bf16", "fp8")
CLUSTERS = ("local", "bcm")
DEFAULT = "default"  # no parallelism override: the layout training.default_layout names for the dtype
LAYOUTS = tuple(
    sorted(p.stem for p in (REPO / "conf" / "parallelism").glob("*.yaml") if p.stem[0] != "_" and p.stem != DEFAULT)
)

# What is meant to work, on H100 nodes of 8 (cluster=bcm) and on one machine with 8 H100s (cluster=local).
# Everything else must fail validation: layouts that do not split the model's heads or layers, need more GPUs
# than one machine has, or would not fit in 80 GB (the 8B at TP2 alone: 83.7 GiB estimated in bf16, 80.5 in fp8 with
# FP8 weights and their transpose).
BOTH = {"bf16", "fp8"}
VALID: dict[tuple[str, str], tuple[set[str], set[str]]] = {  # (model, layout) -> (dtypes, clusters)
    ("tiny", DEFAULT): (BOTH, {"local", "bcm"}),
    ("tiny", "tp1"): (BOTH, {"local", "bcm"}),
    ("tiny", "tp1_cp2"): (BOTH, {"local", "bcm"}),
    ("tiny", "tp2_sp"): (BOTH, {"local", "bcm"}),
    ("tiny", "pp2_vp2_asym"): (BOTH, {"local", "bcm"}),  # (6 + 2) / 2 = 4 slots per stage, 2 per chunk
    ("tiny", "custom"): (BOTH, {"local", "bcm"}),  # key-by-key layouts start from TP1 on one GPU
    ("tiny", "tp4_cp2"): (BOTH, {"local", "bcm"}),
    ("8b", DEFAULT): (BOTH, {"local", "bcm"}),
    ("8b", "tp1_cp2"): (BOTH, {"local", "bcm"}),
    # The fine-tuning presets' layouts (conf/training/finetune, mlperf/llama2_70b_lora) also pretrain the models whose
    # heads and layers they split, where the full Adam state still fits: a 70B base on one node (tp4_cp2) or two
    # (tp8_pp2_recompute) is for a frozen base only, and 32 layers do not split into 14 stages or 4 x 5 chunks.
    ("8b", "tp4_cp2"): (BOTH, {"local", "bcm"}),
    ("8b", "tp8_pp2_recompute"): (BOTH, {"bcm"}),
    ("70b", "tp8_pp4_vp5"): (BOTH, {"bcm"}),
    ("405b", "tp8_pp14_recompute"): (BOTH, {"bcm"}),
    ("70b", DEFAULT): (BOTH, {"bcm"}),
    ("70b", "tp4_pp4_cp2_vp5"): (BOTH, {"bcm"}),
    ("70b", "tp4_pp8_vp5"): (BOTH, {"bcm"}),
    ("405b", DEFAULT): (BOTH, {"bcm"}),
    ("405b", "tp8_pp8_cp2_vp8_asym"): (BOTH, {"bcm"}),
    ("405b", "mlperf_llama31_405b"): (BOTH, {"bcm"}),  # MLPerf's layout for 8-GPU nodes: the 405B default's
}


def test_every_layout_is_covered():
    # A new layout needs a decision here on which models it is meant for.
    # parallelism=auto is a search main.py resolves first: planned as it is, it must fail for every model.
    assert set(LAYOUTS) == {
        "auto",
        "custom",
        "mlperf_llama31_405b",
        "pp2_vp2_asym",
        "tp1",
        "tp1_cp2",
        "tp2_sp",
        "tp4_cp2",
        "tp4_pp4_cp2_vp5",
        "tp4_pp8_cp2_vp8_asym",
        "tp4_pp8_vp5",
        "tp8_pp14_recompute",
        "tp8_pp2_recompute",
        "tp8_pp4_vp5",
        "tp8_pp8_cp2_vp8_asym",
    }


def _overrides(model, dtype, layout, cluster):
    out = [f"training=llama31/{model}", f"dtype={dtype}", f"cluster={cluster}"]
    return out + ([] if layout == DEFAULT else [f"parallelism={layout}"])


def _check_consistent(plan, cfg):
    model = cfg.training.model
    assert plan.tp * plan.pp * plan.cp * plan.dp == plan.num_gpus
    assert plan.num_nodes * plan.gpus_per_node == plan.num_gpus
    assert plan.micro_batch_size * plan.dp * plan.num_microbatches == plan.global_batch_size
    assert len(plan.layers_per_pipeline_stage) == plan.pp
    assert sum(plan.layers_per_pipeline_stage) == model.num_layers
    if plan.vp:
        slots = (model.num_layers + 2 * plan.asymmetric_pipeline) // plan.pp  # layer slots per stage
        assert slots % plan.vp == 0
    if plan.asymmetric_pipeline:
        first, *middle, last = plan.layers_per_pipeline_stage
        assert first + 1 == last + 1 == (model.num_layers + 2) // plan.pp
        assert all(m == first + 1 for m in middle)
    assert plan.est_memory_gib_per_gpu <= gpu_spec("h100").memory_gib
    assert ("CUDA_DEVICE_MAX_CONNECTIONS" in plan.env) == (plan.tp > 1 or plan.cp > 1)
    assert ("NCCL_P2P_NET_CHUNKSIZE" in plan.env) == (plan.pp > 1)
    assert plan.fp8 == ("hybrid" if cfg.dtype.name == "fp8" else None)


@pytest.mark.parametrize(
    "model,dtype,layout,cluster", list(itertools.product(MODELS, DTYPES, (DEFAULT, *LAYOUTS), CLUSTERS))
)
def test_combination(cfg_for, model, dtype, layout, cluster):
    cfg = cfg_for(*_overrides(model, dtype, layout, cluster), "dry_run=true")  # no image needed here
    dtypes, clusters = VALID.get((model, layout), (set(), set()))
    if dtype in dtypes and cluster in clusters:
        plan = planned(cfg, EIGHT_H100)
        _check_consistent(plan, cfg)
        assert plan.cannot_train_reason is None
    else:
        with pytest.raises(PlanError) as err:
            planned(cfg, EIGHT_H100)
        assert all("parallelism." in p or "cluster." in p or "training." in p for p in err.value.problems), (
            err.value.problems
        )


@pytest.mark.parametrize(
    "model,dtype,expect",
    [
        (
            "405b",
            "bf16",
            dict(
                tp=8,
                pp=8,
                cp=2,
                vp=8,
                asymmetric_pipeline=True,
                layers_per_pipeline_stage=[15, 16, 16, 16, 16, 16, 16, 15],
            ),
        ),
        ("405b", "fp8", dict(tp=8, pp=8, cp=2, vp=8, asymmetric_pipeline=True)),
        ("70b", "bf16", dict(tp=4, pp=4, cp=2, vp=5, num_gpus=64, dp=2, layers_per_pipeline_stage=[20] * 4)),
        ("70b", "fp8", dict(tp=4, pp=8, cp=1, vp=5, num_gpus=64, dp=2, layers_per_pipeline_stage=[10] * 8)),
        ("8b", "bf16", dict(tp=1, pp=1, cp=2, vp=None, num_gpus=8, dp=4)),
        ("8b", "fp8", dict(tp=1, pp=1, cp=2, vp=None, num_gpus=8, dp=4)),
        ("tiny", "bf16", dict(tp=1, pp=1, cp=1, num_gpus=1)),
    ],
)
def test_default_layouts(cfg_for, model, dtype, expect):
    plan = build_plan(cfg_for(f"training=llama31/{model}", f"dtype={dtype}", "cluster=bcm"))
    assert {k: getattr(plan, k) for k in expect} == expect


def test_405b_on_gb200_nodes_of_four(cfg_for):
    cfg = cfg_for(
        "training=llama31/405b",
        "dtype=fp8",
        "parallelism=tp4_pp8_cp2_vp8_asym",
        "cluster=bcm",
        "cluster.gpu_type=gb200",
        "cluster.gpus_per_node=4",
        "training.global_batch_size=896",
    )
    plan = build_plan(cfg)
    assert (plan.num_nodes, plan.gpus_per_node, plan.dp, plan.num_microbatches) == (128, 4, 8, 112)
    assert plan.peak_flops_per_gpu == gpu_spec("gb200").fp8_peak_flops


def test_model_flops_match_the_public_tables(cfg_for):
    assert build_plan(cfg_for("training=llama31/8b", "cluster=bcm")).model_flops_per_sample == pytest.approx(
        4.74e14, rel=2e-3
    )
    assert build_plan(cfg_for("training=llama31/70b", "cluster=bcm")).model_flops_per_sample == pytest.approx(
        3.94e15, rel=2e-3
    )


# --------------------------------------------------------------------------- bad inputs
@pytest.mark.parametrize(
    "overrides,keys",
    [
        (
            ["training=llama31/8b", "parallelism.tp=3"],
            ["parallelism.tp=3", "num_attention_heads=32", "use tp in [1, 2, 4, 8]"],
        ),
        (
            ["training=llama31/405b", "parallelism.vp=3"],
            ["parallelism.vp=3", "parallelism.pp", "use vp in [1, 2, 4, 8, 16]"],
        ),
        (["training=llama31/405b", "parallelism.pp=5"], ["parallelism.pp=5", "num_layers + 2 = 128"]),
        (
            ["training=llama31/8b", "training.global_batch_size=130"],
            ["training.global_batch_size=130", "training.micro_batch_size=1", "use a multiple of 4"],
        ),
        (
            ["training=llama31/8b", "cluster.ntasks_per_node=16"],
            ["cluster.ntasks_per_node=16", "cluster.gpus_per_node=8"],
        ),
        (["training=llama31/8b", "parallelism.num_gpus=12"], ["parallelism.num_gpus=12", "whole number of nodes"]),
        (
            ["training=llama31/70b", "parallelism.sequence_parallel=false"],
            ["parallelism.tp_comm_overlap=true", "parallelism.sequence_parallel=true"],
        ),
        (["training=llama31/8b", "cluster.gpu_type=a100", "dtype=fp8"], ["dtype=fp8", "cluster.gpu_type=a100"]),
        (["training=llama31/70b", "parallelism=tp2_sp"], ["estimated", "cluster.gpu_type=h100", "memory_check=false"]),
        (["training=llama31/8b", "training.data.mock=false"], ["training.data.blend"]),
    ],
)
def test_bad_inputs_name_their_keys(cfg_for, overrides, keys):
    with pytest.raises(PlanError) as err:
        planned(cfg_for(*overrides, "cluster=bcm", "dry_run=true"))
    text = str(err.value)
    for key in keys:
        assert key in text, text
    assert all("\n" not in p for p in err.value.problems)


def test_local_machine_fit(cfg_for):
    two = LocalGpus(2, "h100", ("H100",) * 2)
    with pytest.raises(PlanError, match=r"parallelism.num_gpus=8 but this machine has 2 GPUs"):
        planned(cfg_for("training=llama31/8b"), two)
    with pytest.raises(PlanError, match=r"cluster.gpus_per_node=4 but this machine has 2 GPUs"):
        planned(cfg_for("cluster.gpus_per_node=4"), two)


def test_no_gpu_here_is_a_reason_not_an_error(cfg_for):
    plan = build_plan(cfg_for(), NO_GPU)
    assert "no NVIDIA GPU" in plan.cannot_train_reason
    assert plan.gpu_type is None and plan.peak_flops_per_gpu is None


def test_memory_check_can_be_waived(cfg_for):
    plan = build_plan(cfg_for("training=llama31/70b", "parallelism=tp2_sp", "cluster=bcm", "memory_check=false"))
    assert plan.est_memory_gib_per_gpu > gpu_spec("h100").memory_gib


def test_userbuffers_without_multicast_skip_it(cfg_for):
    local = build_plan(cfg_for("parallelism=tp2_sp"), EIGHT_H100)
    assert local.env["UB_SKIPMC"] == "1" and local.env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    nvswitch = build_plan(cfg_for("parallelism=tp2_sp", "cluster=bcm"))
    assert "UB_SKIPMC" not in nvswitch.env
    assert "UB_SKIPMC" not in build_plan(cfg_for(), EIGHT_H100).env  # no TP overlap, nothing to skip


def test_cluster_env_cannot_pick_the_attention_backend(cfg_for):
    with pytest.raises(PlanError, match="training.model.attention_backend"):
        planned(cfg_for("cluster=bcm", "+cluster.env.NVTE_FLASH_ATTN=1", "dry_run=true"))


def test_plan_json_has_the_contract_keys(cfg_for):
    keys = {
        "model",
        "dtype",
        "num_gpus",
        "num_nodes",
        "gpus_per_node",
        "tp",
        "pp",
        "cp",
        "vp",
        "dp",
        "sequence_parallel",
        "micro_batch_size",
        "global_batch_size",
        "num_microbatches",
        "seq_length",
        "layers_per_pipeline_stage",
        "asymmetric_pipeline",
        "fp8",
        "fp8_param_gather",
        "tp_comm_overlap",
        "model_flops_per_sample",
        "est_memory_gib_per_gpu",
        "env",
        "command",
    }
    assert keys <= set(build_plan(cfg_for("cluster=bcm")).to_json_dict())
