"""The two-GPU FP8 measurements of the 8B shape with 16 layers (seq 8192, DP2, GBS 16, MBS 1, mock data), each a
bench/bench_train.py run:

    python bench/two_gpu_fp8.py variants --results OUTDIR/variants --json OUTDIR/variants.json
    python bench/two_gpu_fp8.py profiled --results OUTDIR/profiled --json OUTDIR/profiled.json

`variants`: the FP8 defaults beside each variant they rest on (FP8 param gather on, FP8 attention off, CUDA graphs
per layer and full iteration, the op fuser on, the tensorwise recipe, Transformer Engine's loss and SwiGLU), every
case --repeat times interleaved (3 by default) with a table of medians against the defaults. At DP2 the plan leaves
FP8 param gather off (bf16 weights fit) and turns FP8 attention on (delayed scaling, heads of 128), so the defaults
are the "off" side of the one and the "on" side of the other, as they are graphs off, the delayed recipe, the op
fuser off and megatron-core's native loss and SwiGLU.
`profiled`: one bf16 and one FP8 run with the torch profiler on step 4, before the timing window, for
bench/bench_kernels.py --trace (RUN/profile/rank0_steps4-4.pt.trace.json.gz). bench_train.py's `--only NAME`
(repeatable) keeps the defaults and the named variants, so that two GPU pairs of one host can each measure half of
them beside the defaults:

    CUDA_VISIBLE_DEVICES=0,1 python bench/two_gpu_fp8.py variants --only fp8-param-gather-on --only fp8-tensorwise
    CUDA_VISIBLE_DEVICES=2,3 python bench/two_gpu_fp8.py variants --only fp8-graphs-per-layer --only fp8-op-fuser ...

Other arguments after the subcommand go to bench_train.py (--only, --budget-s, --timeout-s, --previous, --repeat).
"""

from __future__ import annotations

import argparse
from pathlib import Path
import sys

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_train  # noqa: E402

MODEL, GPUS, GBS, STEPS, WINDOW = "llama31/8b", 2, 16, 8, 3
PROXY = "training.model.num_layers=16 parallelism=tp1"
FP8 = f"{PROXY} dtype=fp8"
# The first case is what the others are compared with.
VARIANTS: dict[str, str] = {
    "fp8": FP8,
    "fp8-param-gather-on": f"{FP8} dtype.fp8_param_gather=true",
    "fp8-attention-off": f"{FP8} dtype.fp8_dot_product_attention=false",
    "fp8-graphs-per-layer": f"{FP8} training.cuda_graphs=per_layer",
    "fp8-graphs-full": f"{FP8} training.cuda_graphs=full_iteration",
    "fp8-op-fuser": " ".join([FP8, *bench_train.OP_FUSER]),
    "fp8-tensorwise": f"{FP8} dtype.fp8_recipe=tensorwise",
    # The kernel changes measured on one H200 (docs/performance.md): the defaults take Transformer Engine's loss at
    # TP1 (the variant is megatron-core's native one) and megatron-core's SwiGLU (the variant is Transformer Engine's).
    "fp8-native-loss": f"{FP8} training.model.cross_entropy_fusion=native",
    "fp8-te-activation": f"{FP8} dtype.te_activation_func=true",
}
# Step 4 profiled: after warm-up, before the window (steps 6-8), so the profiler's overhead stays out of it.
PROFILE = " ".join(bench_train.PROFILE)
PROFILED: dict[str, str] = {
    "bf16-profiled": f"{PROXY} dtype=bf16 {PROFILE}",
    "fp8-profiled": f"{FP8} {PROFILE}",
}
REPEAT = {"variants": 3, "profiled": 1}


def bench_argv(which: str, rest: list[str]) -> list[str]:
    """bench_train.py's arguments: the shape, the cases, the default repeat (a --repeat in `rest` wins)."""
    cases = VARIANTS if which == "variants" else PROFILED
    argv = ["--model", MODEL, "--gpus", str(GPUS), "--gbs", str(GBS), "--steps", str(STEPS), "--window", str(WINDOW)]
    argv += ["--repeat", str(REPEAT[which])]
    for name, overrides in cases.items():
        argv += ["--case", name, overrides]
    return argv + rest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("which", choices=["variants", "profiled"])
    args, rest = parser.parse_known_args(argv)
    bench_train.main(bench_argv(args.which, rest))
    return 0


if __name__ == "__main__":
    sys.exit(main())
