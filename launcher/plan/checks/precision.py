"""dtype: FP8 settings, and whether the GPU has FP8."""
from __future__ import annotations

from typing import Any, Mapping

from launcher.plan.findings import Findings
from launcher.plan.sizes import Sizes


def check(cfg: Mapping[str, Any], sizes: Sizes, found: Findings) -> None:
    dtype, par = cfg["dtype"], cfg["parallelism"]
    fp8 = dtype.get("fp8")
    if fp8 and not dtype.get("fp8_recipe"):
        found.problem("dtype.fp8 is set but dtype.fp8_recipe is null: use delayed or tensorwise")
    for key in ("fp8_param_gather", "fp8_dot_product_attention"):
        if dtype.get(key) and not fp8:
            found.problem(f"dtype.{key}=true needs dtype.fp8 (use dtype=fp8)")
    if dtype.get("fp8_param_gather") and not par["use_distributed_optimizer"]:
        found.problem("dtype.fp8_param_gather=true needs parallelism.use_distributed_optimizer=true")
    found.at_least("dtype.fp8_amax_history_len", dtype["fp8_amax_history_len"], 1)
    found.at_least("dtype.fp8_margin", dtype["fp8_margin"], 0)
    if dtype["fp8_amax_compute_algo"] not in ("max", "most_recent"):
        found.problem(f"dtype.fp8_amax_compute_algo={dtype['fp8_amax_compute_algo']!r}: use max or most_recent")
    if fp8 and sizes.spec is not None and sizes.spec.fp8_peak_flops is None:
        found.problem(f"dtype=fp8 needs FP8 tensor cores (Hopper or newer); cluster.gpu_type={sizes.gpu_type} has "
                      "none; use dtype=bf16")
