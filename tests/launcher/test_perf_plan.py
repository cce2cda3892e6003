"""The single-GPU performance keys in the plan: FP8 param gather decided per layout (and recorded), the block-scaled
recipes only on GPUs that have them, the CUDA-graph and rank-order rules megatron-core imposes, each refused in
one line naming the keys; the environment and plan.json fields they produce."""

from __future__ import annotations

import dataclasses
import json

import pytest

from common.config import DataFormat

from common.stack import precision_of, problems
from launcher.plan.build import build_plan, resolve_fp8_attention
from launcher.plan.errors import PlanError
from launcher.plan.hardware import GPUS, gpu_spec
from launcher.plan.sizes import sizes_of

from launcher_helpers import planned

FULL_RECOMPUTE = [
    "parallelism.recompute_granularity=full",
    "parallelism.recompute_method=uniform",
    "parallelism.recompute_num_layers=1",
]


@pytest.fixture
def cfg_for(cfg_for):
    """Dry runs: a batch cluster's container need not exist here."""
    return lambda *overrides: cfg_for(*overrides, "dry_run=true")


def problems_of(cfg) -> list[str]:
    with pytest.raises(PlanError) as err:
        planned(cfg)
    return err.value.problems


def test_every_gpu_type_says_whether_it_has_block_scaled_tensor_cores():
    assert {name for name, spec in GPUS.items() if spec.block_scaled} == {"b200", "gb200"}
    assert gpu_spec("b200").fp4_peak_flops == 2 * gpu_spec("b200").fp8_peak_flops


# ----------------------------------------------------------------------------- FP8 param gather
@pytest.mark.parametrize(
    "overrides,expected",
    [
        # One GPU: no all-gather to shrink, so off (measured faster on one H200).
        (["dtype=fp8"], False),
        (
            [
                "training=llama31/8b",
                "training.model.num_layers=16",
                "parallelism=tp1",
                "parallelism.num_gpus=1",
                "dtype=fp8",
                "cluster.gpu_type=h200",
            ],
            False,
        ),
        # 8 or more data-parallel x context-parallel shards (8B default: CP2 DP4): NVIDIA's reference, on.
        (["training=llama31/8b", "dtype=fp8"], True),
        # 4 shards where bf16 weights fit (8B with 16 layers at DP4 on 4 H200s): off, measured faster.
        (
            [
                "training=llama31/8b",
                "training.model.num_layers=16",
                "parallelism=tp1",
                "parallelism.num_gpus=4",
                "dtype=fp8",
                "cluster.gpu_type=h200",
            ],
            False,
        ),
        # 2 shards where bf16 weights fit (70B fp8 default: TP4 PP8 DP2; 8B CP2 on 2 H200s): off, measured faster.
        (["training=llama31/70b", "dtype=fp8"], False),
        (
            [
                "training=llama31/8b",
                "parallelism=tp1_cp2",
                "parallelism.num_gpus=2",
                "dtype=fp8",
                "cluster.gpu_type=h200",
            ],
            False,
        ),
        # One shard where bf16 weights would not fit but FP8 ones do: on (8B TP2 at seq 4096 on 80 GB H100s: 84.3 GiB
        # with bf16 weights, 77.3 with FP8 ones).
        (["training=llama31/8b", "parallelism=tp2_sp", "dtype=fp8", "training.seq_length=4096"], True),
        # What the user sets always wins.
        (["dtype=fp8", "dtype.fp8_param_gather=true"], True),
        (["training=llama31/8b", "dtype=fp8", "dtype.fp8_param_gather=false"], False),
        # bf16 has no FP8 weights.
        (["training=llama31/8b"], False),
    ],
)
def test_fp8_param_gather_is_decided_per_layout_and_recorded(cfg_for, overrides, expected):
    plan = planned(cfg_for("cluster=bcm", *overrides))
    assert plan.fp8_param_gather is expected
    assert json.loads(json.dumps(plan.to_json_dict()))["fp8_param_gather"] is expected


def test_the_memory_estimate_follows_the_decision(cfg_for):
    one_gpu = [
        "training=llama31/8b",
        "training.model.num_layers=16",
        "parallelism=tp1",
        "parallelism.num_gpus=1",
        "dtype=fp8",
        "cluster=bcm",
        "cluster.gpu_type=h200",
    ]
    off = build_plan(cfg_for(*one_gpu))
    on = build_plan(cfg_for(*one_gpu, "dtype.fp8_param_gather=true"))
    assert not off.fp8_param_gather and on.fp8_param_gather
    # FP8 weights are half the bytes of bf16 ones (4.5B parameters: 4.2 GiB less), and Transformer Engine then
    # caches no FP8 copy and transpose of the linear layers' 3.5B bf16 weights (6.5 GiB); the FP8 weights get a
    # transpose of their own (3.3 GiB).
    assert off.est_memory_gib_per_gpu - on.est_memory_gib_per_gpu == pytest.approx(4.2 + 6.5 - 3.3, abs=0.3)


def test_fp8_param_gather_needs_fp8_and_the_distributed_optimizer(cfg_for):
    assert problems_of(
        cfg_for(
            "dtype.fp8_param_gather=true",
            "parallelism.use_distributed_optimizer=false",
            "parallelism.overlap_param_gather=false",
        )
    ) == [
        "dtype.fp8_param_gather=true needs dtype.fp8 (use dtype=fp8)",
        "dtype.fp8_param_gather=true needs parallelism.use_distributed_optimizer=true",
    ]
    # Left to the plan (null), it is simply off without the distributed optimizer.
    plan = planned(
        cfg_for(
            "training=llama31/8b",
            "dtype=fp8",
            "parallelism.use_distributed_optimizer=false",
            "parallelism.overlap_param_gather=false",
            "cluster=bcm",
            "memory_check=false",
        )
    )
    assert not plan.fp8_param_gather


# ----------------------------------------------------------------------------- Blackwell recipes
@pytest.mark.parametrize("gpu", ["h100", "h200"])
def test_mxfp8_and_nvfp4_are_refused_on_hopper_in_one_line(cfg_for, gpu):
    assert problems_of(cfg_for("cluster=bcm", f"cluster.gpu_type={gpu}", "dtype=fp8", "dtype.fp8_recipe=mxfp8")) == [
        f"dtype.fp8_recipe=mxfp8 needs a Blackwell GPU (cluster.gpu_type=b200 or gb200); cluster.gpu_type={gpu} "
        "has no MXFP8 tensor cores; use dtype.fp8_recipe=delayed or tensorwise"
    ]
    assert problems_of(cfg_for("cluster=bcm", f"cluster.gpu_type={gpu}", "dtype=nvfp4")) == [
        f"dtype.fp4=nvfp4 needs a Blackwell GPU (cluster.gpu_type=b200 or gb200); cluster.gpu_type={gpu} has no "
        "FP4 tensor cores; use dtype=fp8"
    ]


@pytest.mark.parametrize("gpu", ["b200", "gb200"])
def test_mxfp8_and_nvfp4_are_accepted_on_blackwell(cfg_for, gpu):
    mxfp8 = planned(
        cfg_for(
            "cluster=bcm",
            f"cluster.gpu_type={gpu}",
            "dtype=fp8",
            "dtype.fp8_recipe=mxfp8",
            "dtype.fp8_output_layer=true",
        )
    )
    assert mxfp8.fp8 == "hybrid" and mxfp8.peak_flops_kind == "fp8"
    nvfp4 = planned(cfg_for("cluster=bcm", f"cluster.gpu_type={gpu}", "dtype=nvfp4"))
    assert nvfp4.dtype == "nvfp4" and nvfp4.fp8 is None and not nvfp4.fp8_param_gather
    assert (nvfp4.peak_flops_kind, nvfp4.peak_flops_per_gpu) == ("fp4", gpu_spec(gpu).fp4_peak_flops)


def test_nvfp4_composes_for_every_model_with_the_fp8_layout(cfg_for):
    for training in ("llama31/tiny", "llama31/8b", "llama31/70b", "llama31/405b", "mlperf/llama31_8b"):
        fp8, fp4 = (cfg_for(f"training={training}", f"dtype={d}").parallelism for d in ("fp8", "nvfp4"))
        # The same layout; only the userbuffers' FP8 output buffers follow the dtype.
        assert dataclasses.replace(fp4, tp_comm_overlap_cfg=None) == dataclasses.replace(fp8, tp_comm_overlap_cfg=None)


def test_precision_combinations_megatron_refuses_are_one_line_each(cfg_for):
    assert problems_of(
        cfg_for("cluster=bcm", "cluster.gpu_type=b200", "dtype=nvfp4", "dtype.fp8=hybrid", "dtype.fp8_recipe=delayed")
    ) == [
        "dtype.fp4=nvfp4 and dtype.fp8=hybrid cannot be combined (megatron-core runs one low precision): use "
        "dtype=nvfp4, or set dtype.fp8=null"
    ]
    assert problems_of(cfg_for("cluster=bcm", "dtype=fp8", "dtype.fp8_output_layer=true")) == [
        "dtype.fp8_output_layer=true needs dtype.fp8_recipe=mxfp8 (megatron-core runs the output layer in FP8 only "
        "with MXFP8), not delayed; set dtype.fp8_output_layer=false"
    ]
    assert problems_of(cfg_for("dtype.fp8_output_layer=true")) == [
        "dtype.fp8_output_layer=true needs dtype.fp8 (use dtype=fp8)"
    ]
    assert problems_of(cfg_for("dtype=fp8", "dtype.fp8_recipe=null")) == [
        "dtype.fp8 is set but dtype.fp8_recipe is null: use delayed, tensorwise, blockwise or mxfp8"
    ]


def test_the_stack_check_asks_blackwell_for_the_block_scaled_formats(cfg_for):
    from common.stack import GpuFound, load_declared

    cases = {
        ("dtype=fp8",): "fp8",
        ("dtype=fp8", "dtype.fp8_recipe=mxfp8", "cluster.gpu_type=b200"): "mxfp8",
        ("dtype=nvfp4", "cluster.gpu_type=b200"): "nvfp4",
        (): "bf16",
    }
    for overrides, precision in cases.items():
        cfg = cfg_for("cluster=bcm", *overrides)
        assert precision_of(cfg, build_plan(cfg)) == precision
    declared = load_declared(cfg_for())
    h200 = GpuFound("NVIDIA H200", (9, 0), "2.27")
    (line,) = problems(declared, {}, h200, "nvfp4")
    assert line == "nvfp4 needs compute capability 10.0 or newer, NVIDIA H200 has 9.0; use dtype=fp8"
    assert problems(declared, {}, GpuFound("NVIDIA B200", (10, 0), "2.27"), "mxfp8") == []


# ----------------------------------------------------------------------------- CUDA graphs
def test_cuda_graph_rules_are_one_line_each(cfg_for):
    assert problems_of(cfg_for("training.cuda_graphs=per_layer", *FULL_RECOMPUTE)) == [
        "training.cuda_graphs=per_layer with parallelism.recompute_granularity=full: megatron-core graphs full "
        "recomputation only inside a full-iteration graph; use training.cuda_graphs=full_iteration or "
        "parallelism.recompute_granularity=selective"
    ]
    assert problems_of(cfg_for("training.cuda_graphs=full_iteration", "training.cuda_graph_warmup_steps=0")) == [
        "training.cuda_graph_warmup_steps=0 with training.cuda_graphs=full_iteration: the first step runs without "
        "the parameter all-gather hooks, which a graph captured in it would lack; set "
        "training.cuda_graph_warmup_steps=1 or more"
    ]
    assert problems_of(cfg_for("training.cuda_graphs=per_layer", "+cluster.env.NCCL_GRAPH_REGISTER=1")) == [
        "cluster.env.NCCL_GRAPH_REGISTER=1 with training.cuda_graphs=per_layer: graphs with the expandable-segments "
        "allocator need NCCL_GRAPH_REGISTER=0 (megatron-core refuses them otherwise), which the plan sets; remove "
        "it from cluster.env"
    ]
    assert problems_of(cfg_for("training.cuda_graph_warmup_steps=-1")) == [
        "training.cuda_graph_warmup_steps=-1 must be at least 0: training steps run eagerly in each process before "
        "the graphs are captured"
    ]
    # What megatron-core accepts is accepted: full recomputation inside a full-iteration graph, selective per layer.
    planned(cfg_for("training.cuda_graphs=full_iteration", *FULL_RECOMPUTE))
    planned(cfg_for("training.cuda_graphs=per_layer", "parallelism.recompute_granularity=selective"))
    planned(cfg_for("training.cuda_graphs=none", "training.cuda_graph_warmup_steps=0"))


@pytest.mark.parametrize("mode", ["none", "per_layer", "full_iteration"])
def test_cuda_graphs_reach_the_plan_and_the_environment(cfg_for, mode):
    plan = planned(cfg_for(f"training.cuda_graphs={mode}"))
    assert plan.cuda_graphs == mode
    assert ("NCCL_GRAPH_REGISTER" in plan.env) == (mode != "none")
    if mode != "none":
        assert plan.env["NCCL_GRAPH_REGISTER"] == "0"
        assert plan.env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"


# ----------------------------------------------------------------------------- rank order
def test_rank_order_reaches_the_plan(cfg_for):
    assert planned(cfg_for("cluster=bcm")).rank_order == "tp-cp-ep-dp-pp"
    plan = planned(cfg_for("cluster=bcm", "training=llama31/70b", "dtype=fp8", "parallelism.rank_order=dp_last"))
    assert plan.rank_order == "tp-cp-ep-pp-dp" and plan.pp == 8 and plan.cp == 1


def test_dp_last_with_pipeline_and_context_parallelism_is_refused_in_one_line(cfg_for):
    assert problems_of(cfg_for("cluster=bcm", "training=llama31/70b", "parallelism.rank_order=dp_last")) == [
        "parallelism.rank_order=dp_last with parallelism.pp=4 and parallelism.cp=2: megatron-core accepts the "
        "data-parallel-last order only with pp=1 or cp=1; use rank_order=pp_last"
    ]


# ----------------------------------------------------------------------------- the loss
def test_the_loss_kernel_is_left_to_the_plan_everywhere(cfg_for):
    for model in ("tiny", "8b", "70b", "405b"):
        assert cfg_for(f"training=llama31/{model}").training.model.cross_entropy_fusion is None
    assert cfg_for("training=mlperf/llama31_8b").training.model.cross_entropy_fusion is None


@pytest.mark.parametrize(
    "overrides, expected",
    [
        # One tensor-parallel rank: Transformer Engine's kernel, measured faster with the same validation loss.
        (["parallelism=tp1", "parallelism.num_gpus=2"], "te"),
        (["parallelism=tp1_cp2", "parallelism.num_gpus=2"], "te"),
        # Several: the native kernel until Transformer Engine's reduction over the group is measured.
        (["parallelism=tp2_sp"], "native"),
        # The user's value wins either way.
        (["parallelism=tp1", "parallelism.num_gpus=2", "training.model.cross_entropy_fusion=native"], "native"),
        (["parallelism=tp2_sp", "training.model.cross_entropy_fusion=te"], "te"),
        (["parallelism=tp1", "parallelism.num_gpus=2", "training.model.cross_entropy_fusion=none"], "none"),
        # Deterministic runs never take the native fusion (its compiled kernels round per process).
        (["parallelism=tp2_sp", "training.deterministic=true"], "te"),
        (
            [
                "parallelism=tp1",
                "parallelism.num_gpus=2",
                "training.deterministic=true",
                "training.model.cross_entropy_fusion=native",
            ],
            "te",
        ),
        (
            [
                "parallelism=tp1",
                "parallelism.num_gpus=2",
                "training.deterministic=true",
                "training.model.cross_entropy_fusion=none",
            ],
            "none",
        ),
    ],
)
def test_the_loss_kernel_is_decided_per_layout_and_recorded(cfg_for, overrides, expected):
    plan = planned(cfg_for("cluster=bcm", "cluster.gpu_type=h200", "training=llama31/8b", *overrides))
    assert plan.cross_entropy_fusion == expected
    assert json.loads(json.dumps(plan.to_json_dict()))["cross_entropy_fusion"] == expected


def test_the_memory_estimate_follows_the_loss_kernel(cfg_for):
    one_gpu = ["training=llama31/8b", "training.model.num_layers=16", "parallelism=tp1", "parallelism.num_gpus=1"]
    one_gpu += ["cluster=bcm", "cluster.gpu_type=h200"]
    native = build_plan(cfg_for(*one_gpu, "training.model.cross_entropy_fusion=native"))
    te = build_plan(cfg_for(*one_gpu))
    assert te.cross_entropy_fusion == "te"
    # 6 bytes a logit less: 8192 tokens x 128,256 vocabulary x 6 bytes is 5.9 GiB, what the 8B proxy's peak on one
    # H200 dropped by with Transformer Engine's loss (96.1 to 90.2 GiB in bf16).
    assert native.est_memory_gib_per_gpu - te.est_memory_gib_per_gpu == pytest.approx(
        8192 * 128256 * 6 / 2**30, abs=0.1
    )


TWO_H200_DP2 = ("training=llama31/8b", "parallelism=tp1", "parallelism.num_gpus=2", "cluster.gpu_type=h200")


@pytest.mark.parametrize(
    "overrides, expected",
    [
        # Delayed scaling, heads of 128 on Hopper, one context-parallel rank: on (measured as accurate and faster).
        ([*TWO_H200_DP2, "dtype=fp8"], True),
        (["training=llama31/70b", "dtype=fp8"], True),
        # Each condition that was not measured or has no kernel turns it off.
        ([*TWO_H200_DP2, "dtype=fp8", "dtype.fp8_recipe=tensorwise"], False),
        (["training=llama31/tiny", "dtype=fp8", "cluster.gpu_type=h200"], False),  # heads of 64 on Hopper
        (["training=llama31/8b", "dtype=fp8"], False),  # the 8B's default layout: CP2
        ([*TWO_H200_DP2, "dtype=fp8", "training.model.attention_backend=flash"], False),
        # What the user sets always wins; bf16 has no FP8 attention.
        ([*TWO_H200_DP2, "dtype=fp8", "dtype.fp8_dot_product_attention=false"], False),
        (["training=llama31/8b", "dtype=fp8", "dtype.fp8_dot_product_attention=true"], True),
        (list(TWO_H200_DP2), False),
    ],
)
def test_fp8_attention_is_decided_per_run_and_recorded(cfg_for, overrides, expected):
    plan = planned(cfg_for("cluster=bcm", *overrides))
    assert plan.fp8_dot_product_attention is expected
    assert json.loads(json.dumps(plan.to_json_dict()))["fp8_dot_product_attention"] is expected


def test_packed_fine_tuning_sequences_leave_fp8_attention_off(cfg_for):
    cfg = cfg_for("cluster=bcm", *TWO_H200_DP2, "dtype=fp8", "training.data.packing=true")
    assert resolve_fp8_attention(cfg, sizes_of(cfg)) is True  # pretraining data: packing does not apply
    cfg.training.data.format = DataFormat.sft
    assert resolve_fp8_attention(cfg, sizes_of(cfg)) is False
    cfg.training.data.packing = False
    assert resolve_fp8_attention(cfg, sizes_of(cfg)) is True


def test_fp8_attention_is_refused_for_head_sizes_cudnn_cannot_train(cfg_for):
    # The 8B's heads are 128 wide: FP8 attention trains on Hopper and Blackwell alike.
    for gpu in ("h100", "h200", "b200"):
        eight_b = ("training=llama31/8b", "cluster=bcm", f"cluster.gpu_type={gpu}", "cluster.gpus_per_node=8")
        planned(cfg_for(*eight_b, "dtype=fp8", "dtype.fp8_dot_product_attention=true"))
    tiny = ("training=llama31/tiny", "cluster=bcm", "dtype=fp8", "dtype.fp8_dot_product_attention=true")
    assert problems_of(cfg_for(*tiny, "cluster.gpu_type=h200")) == [
        "dtype.fp8_dot_product_attention=true needs attention heads of exactly 128 on cluster.gpu_type=h200 "
        "(cuDNN's FP8 attention), but training.model.kv_channels=64; set dtype.fp8_dot_product_attention=false"
    ]
    planned(cfg_for(*tiny, "cluster.gpu_type=b200"))  # Blackwell trains 64-wide heads
    assert "multiple of 16" in problems_of(cfg_for(*tiny, "cluster.gpu_type=b200", "training.model.kv_channels=72"))[0]
