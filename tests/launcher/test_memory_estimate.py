"""The plan's memory estimate against the peaks measured on the GPU (conf/perf/measured.yaml), and its two
transient peaks: activations during forward/backward, and the fp32 copy of the gradient shard that megatron's
optimizer makes during the step."""

from __future__ import annotations

import pytest

from launcher.autoconf.perfdata import measured_rows, row_overrides
from launcher.config.compose import compose
from launcher.plan.build import build_plan
from launcher.plan.checks import memory
from launcher.plan.checks.memory import NEAR_LIMIT_SHARE
from launcher.plan.findings import Findings
from launcher.plan.formulas import num_parameters
from launcher.plan.hardware import gpu_spec
from launcher.plan.memory import GIB, estimate_memory_gib, microbatches_in_flight
from launcher.plan.sizes import sizes_of

WITH_PEAK = [row for row in measured_rows() if row.get("peak_memory_gib")]
PROXY_405B = [
    "training=llama31/405b",
    "training.model.num_layers=4",
    "parallelism=custom",
    "parallelism.tp=4",
    "parallelism.num_gpus=4",
    "parallelism.sequence_parallel=true",
    "parallelism.tp_comm_overlap=true",
    "cluster=bcm",
    "cluster.gpu_type=h200",
    "cluster.gpus_per_node=4",
    "training.global_batch_size=32",
]
DP4_8B = [
    "training=llama31/8b",
    "parallelism=tp1",
    "parallelism.num_gpus=4",
    "cluster=bcm",
    "cluster.gpu_type=h200",
    "cluster.gpus_per_node=4",
    "training.global_batch_size=32",
]


def estimate(*overrides: str) -> float:
    return build_plan(compose([*overrides, "memory_check=false"])).est_memory_gib_per_gpu


def test_the_measured_rows_include_the_405b_proxy_and_the_8b_layouts():
    names = " ".join(row["name"] for row in WITH_PEAK)
    assert "405b 4-layer" in names and "8b dp2" in names and len(WITH_PEAK) >= 5


@pytest.mark.parametrize("row", WITH_PEAK, ids=[row["name"] for row in WITH_PEAK])
def test_estimate_is_within_4_percent_of_the_measured_peak(row):
    est = build_plan(compose(row_overrides(row))).est_memory_gib_per_gpu
    assert est == pytest.approx(row["peak_memory_gib"], rel=0.04), (est, row["peak_memory_gib"])


def test_at_dp1_the_optimizer_step_is_the_peak_so_activations_do_not_move_it():
    # The 405B 4-layer proxy: weights, gradients and Adam state of 4.2B parameters per GPU, plus their fp32
    # gradient copy (17 GB) during the step, outweigh 4 layers of activations.
    full = estimate(
        *PROXY_405B,
        "parallelism.recompute_granularity=full",
        "parallelism.recompute_method=uniform",
        "parallelism.recompute_num_layers=1",
    )
    assert estimate(*PROXY_405B) == full
    # 8B on DP4: the gradient copy is a quarter shard, activations are the peak, and recomputation lowers it.
    assert estimate(
        *DP4_8B,
        "parallelism.recompute_granularity=full",
        "parallelism.recompute_method=uniform",
        "parallelism.recompute_num_layers=1",
    ) < estimate(*DP4_8B)


def test_fp32_gradient_buffers_need_no_copy_in_the_step():
    # Reducing in fp32 doubles the gradient buffer but `.float()` of it copies nothing: cheaper where the copy was
    # the peak (DP1), dearer where activations are (DP4).
    assert estimate(*PROXY_405B, "parallelism.grad_reduce_in_fp32=true") < estimate(*PROXY_405B)
    assert estimate(*DP4_8B, "parallelism.grad_reduce_in_fp32=true") > estimate(*DP4_8B)


PP2_70B = [
    "training=llama31/70b",
    "training.model.num_layers=2",
    "parallelism=custom",
    "parallelism.num_gpus=2",
    "parallelism.pp=2",
    "cluster=bcm",
    "cluster.gpu_type=h200",
    "cluster.gpus_per_node=2",
    "training.global_batch_size=8",
    # The kernel the measured PP2 rows ran with; Transformer Engine's smaller logits would leave the optimizer
    # step's gradient copy as the peak, which the deferred operands then partly fill.
    "training.model.cross_entropy_fusion=native",
]


def test_deferred_output_layer_weight_gradients_keep_every_microbatchs_operands_up_to_the_limit():
    # The last stage keeps each microbatch's bf16 output gradient ([8192, 128256]: 1.96 GiB) and input ([8192,
    # 8192]: 0.125 GiB) until the drain: 8 microbatches (GBS 8, DP1), or wgrad_deferral_limit of them.
    defer = ["parallelism.defer_embedding_wgrad_compute=true"]
    plain = estimate(*PP2_70B)
    assert estimate(*PP2_70B, *defer, "parallelism.wgrad_deferral_limit=22") - plain == pytest.approx(8 * 2.08, abs=0.2)
    assert estimate(*PP2_70B, *defer, "parallelism.wgrad_deferral_limit=2") - plain == pytest.approx(2 * 2.08, abs=0.2)


@pytest.mark.parametrize(
    "fp32, grad_fp32, bytes_per_parameter",
    [
        # bf16: bf16 weight, fp32 gradient buffer, fp32 main weight and Adam's m and v.
        (False, True, 2 + 4 + 12),
        # bf16 gradients: the buffer is half, but the step copies this rank's shard to fp32 (transient, 4).
        (False, False, 2 + 2 + 12 + 4),
        # fp32 throughout: fp32 weight and gradient, and Adam's m and v; the optimizer steps the weight itself.
        (True, False, 4 + 4 + 8),
    ],
)
def test_the_estimate_counts_each_weights_state_in_its_dtype(fp32, grad_fp32, bytes_per_parameter):
    """One GPU, one token a step: activations and logits vanish beside the weights' state, which is then the
    plain count of bytes per parameter, plus the fixed allowance of 3 GiB."""
    model = compose(["training=llama31/8b"]).training.model
    vocab = model.vocab_size  # a multiple of 128: no padding
    gib = estimate_memory_gib(
        model, tp=1, pp=1, cp=1, dp=1, vp=None, stage_layers=[model.num_layers], padded_vocab=vocab, seq_length=1,
        micro_batch_size=1, distributed_optimizer=True, grad_fp32=grad_fp32, fp8_params=False, recompute=None,
        num_microbatches=1,
        fp32=fp32,
    )  # fmt: skip
    assert gib == pytest.approx(num_parameters(model) * bytes_per_parameter / GIB + 3, abs=0.11)


def test_the_plan_of_an_fp32_run_counts_fp32():
    bf16 = build_plan(compose(["training=llama31/tiny", "cluster=bcm"]))
    fp32 = build_plan(compose(["training=llama31/tiny", "cluster=bcm", "dtype=fp32"]))
    assert fp32.est_memory_gib_per_gpu > bf16.est_memory_gib_per_gpu


@pytest.mark.parametrize(
    "pp,vp,num_microbatches", [(2, None, 8), (4, None, 2), (2, 2, 8), (2, 5, 4), (4, 5, 8), (4, 2, 4)]
)
def test_microbatches_in_flight_follow_megatrons_1f1b_warmup(pp, vp, num_microbatches):
    """Every stage's count against megatron-core's own warmup (get_pp_rank_microbatches), asked for each rank: the
    peak is the warmup forwards plus the one the first 1F1B step adds, or every chunk where all are warmup."""
    from types import SimpleNamespace

    schedules = pytest.importorskip("megatron.core.pipeline_parallel.schedules")
    for stage in range(pp):
        group = SimpleNamespace(size=lambda: pp, rank=lambda stage=stage: stage)
        communicator = SimpleNamespace(pp_group=group, virtual_pipeline_model_parallel_size=vp)
        total, all_warmup, warmup, _ = schedules.get_pp_rank_microbatches(
            num_microbatches, vp or 1, pp, p2p_communicator=communicator
        )
        chunks_alive = total if all_warmup else warmup + 1
        assert microbatches_in_flight(pp, stage, vp, num_microbatches) == pytest.approx(chunks_alive / (vp or 1))


# The one-layer 405B proxy on one H200: bf16 is estimated over the GPU, fp8 just under it (and ran out of memory).
ONE_LAYER_405B = [
    "training=llama31/405b",
    "training.model.num_layers=1",
    "parallelism=tp1",
    "parallelism.num_gpus=1",
    "cluster=bcm",
    "cluster.gpu_type=h200",
    "cluster.gpus_per_node=1",
    "training.global_batch_size=8",
]


def _memory_findings(*overrides: str) -> tuple[list[str], list[str], float]:
    cfg = compose([*ONE_LAYER_405B, *overrides])
    plan, found = build_plan(cfg), Findings()
    memory.check(cfg, sizes_of(cfg, None), plan, found)
    return found.problems, found.warnings, plan.est_memory_gib_per_gpu


def test_an_estimate_within_the_near_limit_share_of_the_gpu_is_warned_of_and_one_over_it_refused():
    h200 = gpu_spec("h200").memory_gib
    problems, warnings, fp8 = _memory_findings("dtype=fp8")
    assert (1 - NEAR_LIMIT_SHARE) * h200 < fp8 <= h200 and not problems
    assert len(warnings) == 1 and f"estimated {fp8} GiB per GPU is within 5% of the {h200} GiB" in warnings[0]
    problems, warnings, bf16 = _memory_findings("dtype=bf16")
    assert bf16 > h200 and len(problems) == 1 and "exceeds" in problems[0] and not warnings
    # Well under the GPU (a quarter of the FFN width): nothing; memory_check=false: nothing either.
    problems, warnings, small = _memory_findings("dtype=fp8", "training.model.ffn_hidden_size=13312")
    assert small <= (1 - NEAR_LIMIT_SHARE) * h200 and not problems and not warnings
    assert _memory_findings("dtype=fp8", "memory_check=false")[:2] == ([], [])
