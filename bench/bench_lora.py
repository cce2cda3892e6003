"""MLPerf Llama 2 70B LoRA throughput on 2 GPUs, beside Hugging Face PEFT + transformers on one, and the time to
train that the measured rate gives on 8 GPUs.

The shape: Llama 2 70B (hidden 8192, FFN 28672, 64 heads, 8 KV groups, vocabulary 32000) cut to a layer proxy of
--layers decoder layers (default 20: the 80 layers do not fit 2 H100s at seq 8192 even recomputed, a frozen bf16 base
alone being 138 GB), LoRA r=16 alpha=32 dropout 0.1 on linear_qkv and linear_proj, seq 8192, GBS 8, random weights
(peft.random_base=true), synthetic samples (training.data.mock=true). Ours runs the proxy with context parallelism 2 on
2 GPUs: each GPU then computes the FLOPs a GPU of the benchmark's 8-GPU layout (80 layers, TP4 CP2) computes, without
its TP communication. Cases: bf16, and FP8 with the benchmark's settings (NVIDIA's submission: delayed scaling, amax
history 4, FP8 attention). The Hugging Face case: the same proxy (LlamaForCausalLM, bf16, sdpa attention), PEFT LoRA
with the same r, alpha and dropout on q_proj, k_proj, v_proj (transformers keeps them apart) and o_proj, GBS 8 as 8
accumulated microbatches of one sequence, AdamW on the adapters, gradient checkpointing as the MLPerf reference (off
with --hf-no-checkpointing), on one GPU.

tokens/s/GPU = GBS x seq / step time / GPUs. MFU = model FLOPs per sample (the plan's LoRA count: the frozen base
without weight gradients, 4 FLOPs per weight per token; attention's products; the adapters in full; recomputation not
counted) x GBS / step time / GPUs / the H100 and H200 dense bf16 peak 989 TFLOP/s, for every row (FP8 rows too).

Time to train on 8 GPUs (time_to_train_minutes): the measured tokens/s/GPU x 8 with no scaling credit; the
samples to target from the RCP file (mlperf-logging's rcp_checker/training_<ruleset>/rcps_llama2_70b_lora.json, the
same as mlcommons/training's): the mean of the reference runs at the GBS without the fastest and the slowest, as the
RCP checker computes it; evaluations at the 384-sample cadence after the first floor(0.125 x GBS + 2), each of 173
samples of seq tokens, as forward passes (a forward pass costs a third of full training's FLOPs per sample, over the
LoRA step's per-sample FLOPs), up to the one that reaches the target. The measured rate is the proxy's, so the
estimate assumes the 8-GPU layout runs at the proxy's per-GPU rate.

    python bench/bench_lora.py                       # ours bf16 + fp8 on 2 GPUs, Hugging Face on 1, the table
    python bench/bench_lora.py --only hf             # one part: ours-bf16, ours-fp8, hf
    python bench/bench_lora.py --only ours-bf16 --merge RESULTS/bench_lora.json   # with an earlier part's rows
    python bench/bench_lora.py --print-commands      # the main.py commands, without running them
    python bench/bench_lora.py --only ours-bf16 --ours-extra "parallelism=tp1" --tag dp2 --merge R/bench_lora.json

--profile traces step 4 of our runs with the torch profiler (before the timing window of the last 6 of 12 steps;
the cases are named ours-bf16-profiled, ...), and prints the bench/bench_kernels.py commands that put each kernel class
of that step beside its ceiling on this GPU (the frozen base without weight-gradient GEMMs):

    python bench/bench_lora.py --only ours-bf16 --only ours-fp8 --profile --results R

`variants` measures ours in FP8 with NVIDIA's settings beside each setting changed alone (FP8_VARIANTS: amax history
1024, FP8 attention off, the op fuser, CUDA graphs per layer, the frozen base's weights in FP8) and beside the two
that were faster alone together (FP8 weights with FP8 attention off), every case 3 times
interleaved, through bench_train.py, whose arguments pass on (--only NAME to split the list over two GPU pairs,
--budget-s, --previous, --timeout-s, --results, --json):

    python bench/bench_lora.py variants --timeout-s 300 --results R --json R/variants.json

--ours-extra adds overrides to our runs (another layout of the proxy on the 2 GPUs, CUDA graphs, ...), --tag names
those cases (ours-bf16-dp2); the table's stack column says each run's layout. Their time to train still assumes the
8-GPU layout runs at the proxy's per-GPU rate, which a layout other than CP2 represents less closely.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import tempfile
import time
from typing import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from bench_train import OP_FUSER, PROFILE, PROFILED_STEP, print_join_commands  # noqa: E402

SEQ, GBS, RANK, ALPHA, DROPOUT = 8192, 8, 16, 32, 0.1
MODEL_LAYERS = 80  # Llama 2 70B
BF16_PEAK = 989e12
FP8 = [
    "dtype=fp8",
    "dtype.fp8_recipe=delayed",
    "dtype.fp8_amax_history_len=4",
    "dtype.fp8_dot_product_attention=true",
]


# Each of NVIDIA's FP8 settings for this benchmark, and the others a LoRA step might gain from, against all of them
# (`variants`): the first case is what the others are compared with.
FP8_VARIANTS: dict[str, list[str]] = {
    "fp8": [],
    "fp8-amax-history-1024": ["dtype.fp8_amax_history_len=1024"],
    "fp8-attention-off": ["dtype.fp8_dot_product_attention=false"],
    # With LoRA only the small adapters are gathered, so gathering after the step (OP_FUSER) costs nothing here.
    "fp8-op-fuser": OP_FUSER,
    "fp8-graphs-per-layer": ["training.cuda_graphs=per_layer"],
    # The frozen base's weights stored in FP8: no cast of them in any step, and half their memory.
    "fp8-params": ["dtype.fp8_param_gather=true"],
    # The two measured faster alone (FP8 weights +2.9%, FP8 attention off +1.0%), together.
    "fp8-params-attention-off": ["dtype.fp8_param_gather=true", "dtype.fp8_dot_product_attention=false"],
}


def lora_shape(layers: int) -> list[str]:
    """The benchmark's LoRA on the 70B-shaped proxy with CP2: what a run of it sets beyond the model, GPUs and
    steps."""
    return [
        "peft=lora",
        "peft.random_base=true",
        f"peft.rank={RANK}",
        f"peft.alpha={ALPHA}",
        f"peft.dropout={DROPOUT}",
        "peft.target_modules=[linear_qkv,linear_proj]",
        f"training.model.num_layers={layers}",
        f"training.seq_length={SEQ}",
        "training.micro_batch_size=1",
        "parallelism=tp1_cp2",
    ]


def variants_argv(layers: int, steps: int, window: int, rest: list[str]) -> list[str]:
    """bench_train.py's arguments for the FP8 variants: each case interleaved 3 times (a --repeat in `rest` wins)."""
    argv = ["--model", "llama2/70b", "--gpus", "2", "--gbs", str(GBS), "--steps", str(steps), "--window", str(window)]
    argv += ["--repeat", "3"]
    for name, extra in FP8_VARIANTS.items():
        argv += ["--case", name, " ".join([*lora_shape(layers), *FP8, *extra])]
    return argv + rest


def our_overrides(layers: int, steps: int, results: Path, name: str, fp8: bool, extra: Sequence[str] = ()) -> list[str]:
    return [
        "training=llama2/70b",
        *lora_shape(layers),
        f"training.global_batch_size={GBS}",
        f"training.train_steps={steps}",
        "training.val_interval=0",
        "training.data.mock=true",
        "training.checkpoint.interval=0",
        "training.checkpoint.save_at_end=false",
        "parallelism.num_gpus=2",
        "cluster=local",
        f"results_dir={results}",
        f"run_name={name}",
        *(FP8 if fp8 else ["dtype=bf16"]),
        *extra,  # --ours-extra: another layout or setting tried against the proxy (last, so it wins)
    ]


def main_command(overrides: list[str]) -> list[str]:
    return [sys.executable, str(REPO / "main.py"), *overrides]


def run_ours(
    name: str, layers: int, steps: int, window: int, results: Path, fp8: bool, extra: Sequence[str] = ()
) -> dict:
    cmd = main_command(our_overrides(layers, steps, results, name, fp8, extra))
    print("$", shlex.join(cmd), flush=True)
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    (results / f"{name}.out").write_text(proc.stdout + proc.stderr)
    metrics = results / name / "metrics.jsonl"
    if proc.returncode != 0 or not metrics.exists():
        print((proc.stdout + proc.stderr)[-3000:], flush=True)
        return {"case": name, "error": f"exit {proc.returncode}"}
    plan = json.loads((results / name / "plan.json").read_text())
    times = [json.loads(line)["step_time_s"] for line in metrics.read_text().splitlines() if line.strip()]
    step = sum(times[-window:]) / len(times[-window:])
    return row(name, f"ours (megatron-core + TE), {layout_of(plan)}", "fp8" if fp8 else "bf16", plan["num_gpus"],
               step, plan["model_flops_per_sample"])  # fmt: skip


def layout_of(plan: dict) -> str:
    """The plan's layout in a row's words: the sizes above 1 (CP2, TP2 PP2, DP2, ...)."""
    sizes = [f"{key.upper()}{plan[key]}" for key in ("tp", "pp", "vp", "cp", "dp") if (plan.get(key) or 1) > 1]
    return " ".join(sizes) or "1 GPU"


def row(name: str, stack: str, dtype: str, gpus: int, step_s: float, flops_per_sample: float) -> dict:
    tokens = GBS * SEQ / step_s / gpus
    mfu = flops_per_sample * GBS / step_s / gpus / BF16_PEAK
    return {"case": name, "stack": stack, "dtype": dtype, "gpus": gpus, "step_time_s": step_s,
            "tokens_per_s_per_gpu": tokens, "mfu_bf16_peak": mfu}  # fmt: skip


def lora_flops(layers: int) -> tuple[float, float]:
    """(the LoRA step's model FLOPs per sample, full training's) of the proxy, from the plan's formulas."""
    from launcher.config.compose import compose
    from launcher.plan.build import build_plan

    overrides = our_overrides(layers, 10, Path(tempfile.gettempdir()), "flops", False)
    overrides += ["cluster.gpu_type=h100", "memory_check=false"]
    lora = build_plan(compose(overrides)).model_flops_per_sample
    full = [o for o in overrides if not o.startswith("peft")] + ["peft=none"]
    return lora, build_plan(compose(full)).model_flops_per_sample


# --------------------------------------------------------------------------- Hugging Face PEFT on one GPU
def run_hf(layers: int, steps: int, window: int, checkpointing: bool) -> dict:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=8192, intermediate_size=28672, num_hidden_layers=layers, num_attention_heads=64,
        num_key_value_heads=8, vocab_size=32000, max_position_embeddings=4096, rms_norm_eps=1e-5,
        rope_theta=10000.0, tie_word_embeddings=False, torch_dtype="bfloat16",
    )  # fmt: skip
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM._from_config(config, attn_implementation="sdpa", torch_dtype=torch.bfloat16)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    model = get_peft_model(
        model,
        LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=DROPOUT,
                   target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], task_type="CAUSAL_LM"),
    )  # fmt: skip
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=4e-4, weight_decay=1e-4)
    generator = torch.Generator(device="cuda").manual_seed(0)
    times = []
    for _ in range(steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(GBS):  # GBS 8 = 8 accumulated microbatches of one sequence
            ids = torch.randint(0, 32000, (1, SEQ), device="cuda", generator=generator)
            loss = model(input_ids=ids, labels=ids).loss / GBS
            loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 0.3)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        print(f"hf step {len(times)}: {times[-1]:.3f} s", flush=True)
    step = sum(times[-window:]) / len(times[-window:])
    lora, _ = lora_flops(layers)
    stack = "HF transformers + PEFT, sdpa" + (", grad. checkpointing" if checkpointing else "")
    return row("hf-bf16", stack, "bf16", 1, step, lora)


def run_hf_subprocess(args, results: Path) -> dict:
    """In its own process on GPU 0 (ours holds the GPUs in their own processes), so memory starts empty."""
    cmd = [sys.executable, __file__, "--hf-worker", "--layers", str(args.layers), "--steps", str(args.steps),
           "--window", str(args.window), *(["--hf-no-checkpointing"] if args.hf_no_checkpointing else [])]  # fmt: skip
    print("$", shlex.join(cmd), flush=True)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]}
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env)
    (results / "hf-bf16.out").write_text(proc.stdout + proc.stderr)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("ROW ")]
    if proc.returncode != 0 or not lines:
        print((proc.stdout + proc.stderr)[-3000:], flush=True)
        return {"case": "hf-bf16", "error": f"exit {proc.returncode}"}
    return json.loads(lines[-1][4:])


# --------------------------------------------------------------------------- time to train
def rcp_samples_to_target(gbs: int, ruleset: str = "6.1.0") -> float:
    """The RCP mean of the reference runs at `gbs` (the fastest and the slowest left out, as the RCP checker does)."""
    import mlperf_logging

    path = Path(mlperf_logging.__file__).parent / "rcp_checker" / f"training_{ruleset}" / "rcps_llama2_70b_lora.json"
    for record in json.loads(path.read_text()).values():
        if record["BS"] == gbs:
            samples = sorted(record["samples to converge"])[1:-1]
            return sum(samples) / len(samples)
    raise SystemExit(f"{path.name} has no reference runs at GBS {gbs}")


def time_to_train_minutes(
    tokens_per_s_per_gpu: float,
    samples_to_target: float,
    *,
    gbs: int = GBS,
    gpus: int = 8,
    seq: int = SEQ,
    eval_every: int = 384,
    eval_samples: int = 173,
    eval_cost: float = 1.0,
) -> dict:
    """Training time at the rate x gpus (no scaling credit) for samples_to_target samples, plus every evaluation
    that runs up to the one reaching the target: every eval_every samples after the first floor(0.125 x gbs + 2),
    each eval_samples x seq tokens at eval_cost times a training token's cost."""
    rate = tokens_per_s_per_gpu * gpus  # tokens/s of the whole run
    train_s = samples_to_target * seq / rate
    reached_at = math.ceil(samples_to_target / eval_every)  # the evaluation that sees the target
    skipped = math.floor(0.125 * gbs + 2)
    evaluations = max(0, reached_at - skipped)
    eval_s = evaluations * eval_samples * seq * eval_cost / rate
    return {"train_min": train_s / 60, "evaluations": evaluations, "eval_min": eval_s / 60,
            "total_min": (train_s + eval_s) / 60}  # fmt: skip


# --------------------------------------------------------------------------- the table
def print_table(rows: list[dict]) -> None:
    header = f"{'case':<10} {'stack':<44} {'dtype':<5} {'GPUs':>4} {'step s':>8} {'tok/s/GPU':>10} {'MFU(bf16)':>9}"
    print(header)
    print("-" * len(header))
    for r in rows:
        if "error" in r:
            print(f"{r['case']:<10} {r['error']}")
            continue
        print(f"{r['case']:<10} {r['stack']:<44} {r['dtype']:<5} {r['gpus']:>4} {r['step_time_s']:>8.3f} "
              f"{r['tokens_per_s_per_gpu']:>10,.0f} {r['mfu_bf16_peak'] * 100:>8.1f}%")  # fmt: skip


def add_shape_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--layers", type=int, default=20, help="decoder layers of the 70B-shaped proxy")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--window", type=int, default=6, help="average the step time over the last N steps")


def run_variants(argv: list[str]) -> int:
    """`variants`: bench_train.py over FP8_VARIANTS; its own arguments (--only, --repeat, --budget-s, ...) pass on."""
    import bench_train

    parser = argparse.ArgumentParser(prog="bench_lora.py variants")
    add_shape_arguments(parser)
    args, rest = parser.parse_known_args(argv)
    bench_train.main(variants_argv(args.layers, args.steps, args.window, rest))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["variants"]:
        return run_variants(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_shape_arguments(parser)
    parser.add_argument("--only", action="append", choices=["ours-bf16", "ours-fp8", "hf"])
    parser.add_argument("--hf-no-checkpointing", action="store_true")
    parser.add_argument(
        "--ours-extra",
        default="",
        help="space-separated overrides added to our runs (another layout or setting); give it a --tag",
    )
    parser.add_argument("--profile", action="store_true", help="trace step 4 of our runs (cases tagged profiled)")
    parser.add_argument("--tag", default="", help="suffix of our cases' names (ours-bf16-TAG), to merge beside others")
    parser.add_argument(
        "--merge", action="append", default=[], help="rows of an earlier run's bench_lora.json to add (parts run apart)"
    )
    parser.add_argument("--results", default=None)
    parser.add_argument("--print-commands", action="store_true", help="print our main.py commands and stop")
    parser.add_argument("--hf-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.hf_worker:
        print("ROW " + json.dumps(run_hf(args.layers, args.steps, args.window, not args.hf_no_checkpointing)))
        return 0
    results = Path(args.results or tempfile.mkdtemp(prefix="bench_lora_"))
    results.mkdir(parents=True, exist_ok=True)
    if args.profile and args.window > args.steps - PROFILED_STEP:
        raise SystemExit(f"--profile traces step {PROFILED_STEP}: --window {args.window} would time it")
    tag = args.tag or ("profiled" if args.profile else "")
    extra, suffix = args.ours_extra.split() + (PROFILE if args.profile else []), f"-{tag}" if tag else ""
    if args.print_commands:
        for name, fp8 in (("ours-bf16", False), ("ours-fp8", True)):
            print(shlex.join(main_command(our_overrides(args.layers, args.steps, results, name + suffix, fp8, extra))))
        return 0
    parts = args.only or ["ours-bf16", "ours-fp8", "hf"]
    rows = []
    for name, fp8 in (("ours-bf16", False), ("ours-fp8", True)):
        if name in parts:
            rows.append(run_ours(name + suffix, args.layers, args.steps, args.window, results, fp8, extra))
    if "hf" in parts:
        rows.append(run_hf_subprocess(args, results))
    if args.profile:
        print_join_commands([r for r in rows if r["case"].startswith("ours-")], results)
    (results / "bench_lora.json").write_text(json.dumps(rows, indent=1))
    for earlier in args.merge:
        rows += [r for r in json.loads(Path(earlier).read_text()) if r["case"] not in {x["case"] for x in rows}]
    print()
    peak = f"{BF16_PEAK / 1e12:.0f} TFLOP/s"
    print(f"Llama 2 70B shape, {args.layers}-layer proxy, LoRA r={RANK} on qkv + proj, seq {SEQ}, GBS {GBS}, "
          f"random weights, synthetic samples; MFU against the dense bf16 peak {peak}")  # fmt: skip
    print_table(rows)
    ok = {r["case"]: r for r in rows if "error" not in r}
    ours = [name for name in ok if name.startswith("ours-")]  # ours-bf16, ours-fp8, and tagged variants
    for name in ours:
        if ok[name]["dtype"] == "bf16" and "hf-bf16" in ok:
            ratio = ok[name]["tokens_per_s_per_gpu"] / ok["hf-bf16"]["tokens_per_s_per_gpu"]
            print(f"{name} / HF PEFT bf16 tokens/s/GPU: {ratio:.2f}x (goal: 2x)")
    try:
        samples = rcp_samples_to_target(GBS)
    except ModuleNotFoundError:
        print(f"time to train: not computed, it needs mlperf-logging's RCP file (pip install mlperf-logging); the rows "
              f"are in {results / 'bench_lora.json'}")  # fmt: skip
        return 0
    lora, full = lora_flops(args.layers)
    eval_cost = (full / 3) / lora  # a forward pass per sample over the LoRA step's FLOPs per sample
    # The benchmark trains all 80 layers: the proxy's rate at the same MFU, scaled by the FLOPs per sample.
    whole_model = lora / lora_flops(MODEL_LAYERS)[0]
    for name in ours:
        rate = ok[name]["tokens_per_s_per_gpu"] * whole_model
        t = time_to_train_minutes(rate, samples, eval_cost=eval_cost)
        print(f"time to train on 8 GPUs, {name}: {t['total_min']:.1f} min = {t['train_min']:.1f} training "
              f"({samples:,.0f} samples, the RCP mean at GBS {GBS}) + {t['eval_min']:.1f} for "
              f"{t['evaluations']} evaluations (each at {eval_cost:.2f}x a training token's cost), the "
              f"{MODEL_LAYERS}-layer model at the proxy's MFU ({rate:,.0f} tokens/s/GPU); "
              "NVIDIA on 8 H200: 23.1 min")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
