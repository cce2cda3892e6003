"""dtype: FP8 and FP4 settings, the combinations megatron-core refuses, and whether the GPU has the formats."""

from __future__ import annotations

from common.config import Config, Fp8Recipe
from launcher.plan.findings import Findings
from launcher.plan.hardware import GpuSpec, gpu_types_with
from launcher.plan.sizes import Sizes

# Recipes whose scales are per block of elements: Blackwell's tensor cores (compute capability 10.0) only.
BLOCK_SCALED_FP8 = (Fp8Recipe.mxfp8,)


def check(cfg: Config, sizes: Sizes, found: Findings) -> None:
    dtype, par = cfg.dtype, cfg.parallelism
    fp8, fp4, recipe = dtype.fp8, dtype.fp4, dtype.fp8_recipe
    if fp8 and not recipe:
        found.problem("dtype.fp8 is set but dtype.fp8_recipe is null: use delayed, tensorwise, blockwise or mxfp8")
    if (fp8 or fp4) and not dtype.bf16:
        found.problem(f"dtype.bf16=false (fp32 throughout) cannot be combined with dtype.{'fp8' if fp8 else 'fp4'}")
    if par.tp_comm_overlap and not dtype.bf16:
        # Transformer Engine's userbuffers are allocated in bf16 (recipes/trainer/model.py: init_userbuffers).
        found.problem("dtype.bf16=false (fp32 throughout) needs parallelism.tp_comm_overlap=false")
    if fp8 and fp4:
        found.problem(
            f"dtype.fp4={fp4} and dtype.fp8={fp8} cannot be combined (megatron-core runs one low "
            "precision): use dtype=nvfp4, or set dtype.fp8=null"
        )
    fp8_only = {
        "fp8_param_gather": dtype.fp8_param_gather,
        "fp8_dot_product_attention": dtype.fp8_dot_product_attention,
        "fp8_output_layer": dtype.fp8_output_layer,
    }
    for key, on in fp8_only.items():
        if on and not fp8:
            found.problem(f"dtype.{key}=true needs dtype.fp8 (use dtype=fp8)")
    if dtype.fp8_param_gather and not par.use_distributed_optimizer:
        found.problem("dtype.fp8_param_gather=true needs parallelism.use_distributed_optimizer=true")
    _op_fuser_param_gather(cfg, found)
    if fp8 and dtype.fp8_output_layer and recipe not in BLOCK_SCALED_FP8:
        found.problem(
            f"dtype.fp8_output_layer=true needs dtype.fp8_recipe=mxfp8 (megatron-core runs the output layer "
            f"in FP8 only with MXFP8), not {recipe}; set dtype.fp8_output_layer=false"
        )
    if dtype.fp8_amax_compute_algo not in ("max", "most_recent"):
        found.problem(f"dtype.fp8_amax_compute_algo={dtype.fp8_amax_compute_algo!r}: use max or most_recent")
    spec, gpu_type = sizes.spec, sizes.gpu_type
    if spec is None or gpu_type is None:  # a spec comes only from a GPU type
        return
    if fp8 and spec.fp8_peak_flops is None:
        found.problem(
            f"dtype=fp8 needs FP8 tensor cores (Hopper or newer); cluster.gpu_type={gpu_type} has none; use dtype=bf16"
        )
    elif fp8 and recipe in BLOCK_SCALED_FP8 and not spec.block_scaled:
        found.problem(
            f"dtype.fp8_recipe={recipe} needs {_blackwell()}; cluster.gpu_type={gpu_type} has no "
            "MXFP8 tensor cores; use dtype.fp8_recipe=delayed or tensorwise"
        )
    head_size = cfg.training.model.kv_channels
    trained_sizes = fp8_attention_head_sizes(spec, head_size)
    if fp8 and dtype.fp8_dot_product_attention and trained_sizes:
        found.problem(
            f"dtype.fp8_dot_product_attention=true needs attention heads of {trained_sizes} on cluster.gpu_type="
            f"{gpu_type} (cuDNN's FP8 attention), but training.model.kv_channels={head_size}; set "
            "dtype.fp8_dot_product_attention=false"
        )
    if fp4 and not spec.block_scaled:
        found.problem(
            f"dtype.fp4={fp4} needs {_blackwell()}; cluster.gpu_type={gpu_type} has no FP4 tensor cores; use dtype=fp8"
        )


def _op_fuser_param_gather(cfg: Config, found: Findings) -> None:
    # The fused MLP runs Transformer Engine ops on its weights without calling the modules megatron-core hooks to
    # wait for the overlapped parameter all-gather, so a gather is left pending and a later step asserts in
    # start_param_sync. That holds on one rank too: its distributed optimizer still gathers through the same
    # buckets (measured on the 8B proxy in fp8: DP2 on 2 H200, and DP1 on one H200).
    par = cfg.parallelism
    if cfg.dtype.te_op_fuser and par.overlap_param_gather and par.use_distributed_optimizer:
        found.problem(
            "dtype.te_op_fuser=true with parallelism.overlap_param_gather=true and the distributed optimizer: the "
            "fused MLP's weights skip megatron-core's parameter-gather hooks; set "
            "parallelism.overlap_param_gather=false"
        )


def fp8_attention_head_sizes(spec: GpuSpec, head_size: int) -> str | None:
    """None where cuDNN's FP8 attention trains heads of `head_size` on this GPU, else the sizes it trains: exactly 128
    on Hopper, at most 128 and a multiple of 16 on Blackwell (Transformer Engine 2.20's backend rules). With any other
    size no attention backend is left and every rank stops at its first step."""
    if spec.compute_capability < (10, 0):
        return None if head_size == 128 else "exactly 128"
    return None if head_size <= 128 and head_size % 16 == 0 else "at most 128 and a multiple of 16"


def _blackwell() -> str:
    names = gpu_types_with(lambda spec: spec.block_scaled)
    return f"a Blackwell GPU (cluster.gpu_type={' or '.join(names)})"
