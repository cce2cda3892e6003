"""What each kernel class of a training step can reach on this GPU, and how far a profiled step is from it.

Measure (one GPU with torch and Transformer Engine): the GEMMs of one decoder layer (qkv, proj, fc1 and fc2 of the
gated MLP, each forward, input gradient and weight gradient) and of the output layer at the model's shapes, through
Transformer Engine's GEMM at the layouts its Linear runs (bf16, or FP8 tensors: E4M3 x E4M3 forward and E5M2
gradients backward; the weight gradient accumulated in fp32 as megatron-core's main_grad; the output layer in bf16
as megatron-core runs it); attention forward and backward through Transformer Engine's DotProductAttention
(causal, the model's heads and key/value groups, in FP8 where the run trains FP8 attention, which --dtype fp8 does
by default as the plan does, bf16 otherwise; the backend Transformer Engine picked is printed); and a large copy,
the bandwidth memory-bound kernels can reach. Each is timed alone (single calls after a spin kernel), and the GEMMs
and the copy also back to back for --sustained-s seconds, at the clock the GPU holds under that load; the SM clock
and power of both (NVML) are in the table:

    python bench/bench_kernels.py --model llama31/8b --tp 1 --seq 8192 --mbs 1 --dtype fp8 --json OUT/kernels.json

Join (CPU is enough with --ceilings): a torch-profiler trace of a run (profile.enabled=true, profile.tool=torch)
grouped by bench/profile_breakdown.py, per class of one step against what the class's kernels would take at the
measured ceilings, from the run's own shapes (its config.yaml and plan.json; a LoRA run's frozen base computes
no weight gradients, so its step has no wgrad GEMMs, and the adapters' own small GEMMs are left out):

    python bench/bench_kernels.py --trace RUN/profile/rank0_steps6-6.pt.trace.json.gz --ceilings OUT/kernels.json

Without --ceilings the join measures the run's shapes first (needs the GPU); --ceilings peak takes the datasheet
peaks and the HBM bandwidth instead; --sustained joins against the back-to-back times where they were measured.
FLOPs: a GEMM 2mnk; attention the causal half of the score and value products, the backward twice the forward (no
recomputation), so the GEMMs plus twice attention give the MFU formula's FLOPs.
Bytes of the memory-bound classes (norm/RoPE/SwiGLU, FP8 casts, loss) are the step-time model's
(launcher/autoconf/steptime.py, parallelism.auto.step_time): an estimate, not a count of the kernels' traffic.
"""

from __future__ import annotations

import argparse
import contextlib
from dataclasses import asdict, dataclass, field, replace
import json
import math
from pathlib import Path
import re
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import profile_breakdown  # noqa: E402
from common.config import ModelConfig, PeftMethod, StepTimeConstants  # noqa: E402
from common.plan import Plan  # noqa: E402
from launcher.autoconf.steptime import default_constants, elementwise_bytes, linear_shapes, loss_bytes  # noqa: E402
from launcher.plan.formulas import padded_vocab_size  # noqa: E402
from launcher.plan.hardware import GpuSpec, gpu_spec, gpu_type_from_name  # noqa: E402

GB = 1e9
PASSES = ("fwd", "dgrad", "wgrad")
GEMM = "GEMM"
ATTN_FWD, ATTN_BWD, ATTN = "attention fwd", "attention bwd", "attention"
ELEMENTWISE, CASTS, LOSS, OTHER = "norm/RoPE/SwiGLU", "FP8 cast/transpose/amax", "loss", profile_breakdown.OTHER
COPY = "copy"
# The order of the join's rows: profile_breakdown's groups, attention split in two where the trace tells them apart.
CLASS_ORDER = (ATTN, ATTN_FWD, ATTN_BWD, GEMM, ELEMENTWISE, LOSS, CASTS, OTHER)
# Attention backward kernels by name (flash-attn's flash_bwd_*, cuDNN's dgrad/bprop, the dQ/dK/dV kernels).
ATTN_BWD_NAME = re.compile(r"bwd|bprop|backward|dgrad|dq_dk|dkdv|_dq_|dot_do_o", re.I)
TRACE_NAME = re.compile(r"rank(\d+)_steps(\d+)-(\d+)")


# --------------------------------------------------------------------------- shapes and work (pure, CPU)
@dataclass(frozen=True)
class Gemm:
    """One GEMM of training: out[m, n] = A[m, k] B[k, n], named by its linear layer and pass."""

    layer: str  # qkv, proj, fc1, fc2, output
    pass_: str  # fwd, dgrad (input gradient), wgrad (weight gradient)
    m: int
    n: int
    k: int
    fp8: bool

    @property
    def name(self) -> str:
        return f"{self.layer} {self.pass_}"

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k

    @property
    def shape(self) -> str:
        return f"{self.m}x{self.n}x{self.k} {'fp8' if self.fp8 else 'bf16'}"


def linear_gemms(layer: str, tokens: int, outputs: int, inputs: int, fp8: bool) -> list[Gemm]:
    """A linear layer's three GEMMs: Y = X W^T (tokens x outputs x inputs), dX = dY W (tokens x inputs x outputs),
    dW = dY^T X (outputs x inputs x tokens)."""
    return [
        Gemm(layer, "fwd", tokens, outputs, inputs, fp8),
        Gemm(layer, "dgrad", tokens, inputs, outputs, fp8),
        Gemm(layer, "wgrad", outputs, inputs, tokens, fp8),
    ]


def _whole(value: float, what: str) -> int:
    if value != int(value):
        raise SystemExit(f"{what} is {value}: the tensor-parallel size must divide it")
    return int(value)


def layer_gemms(model: ModelConfig, tp: int, tokens: int, fp8: bool) -> list[Gemm]:
    """The decoder layer's twelve GEMMs on one GPU, at the step-time model's shapes."""
    out = []
    for layer, (m, n, k) in linear_shapes(model, tp, tokens).items():
        out += linear_gemms(
            layer, int(m), _whole(n, f"{layer}'s outputs / tp"), _whole(k, f"{layer}'s inputs / tp"), fp8
        )
    return out


def output_gemms(model: ModelConfig, tp: int, tokens: int, padded_vocab: int) -> list[Gemm]:
    """The output layer's GEMMs: bf16 whatever the dtype (megatron-core keeps its own output layer out of FP8)."""
    return linear_gemms(
        "output", tokens, _whole(padded_vocab / tp, "the padded vocabulary / tp"), model.hidden_size, False
    )


@dataclass(frozen=True)
class Attention:
    """The attention core of one decoder layer on one GPU, causal, at the full sequence."""

    batch: int
    heads: int
    groups: int  # key/value heads
    head_dim: int
    seq: int
    fp8: bool = False  # Transformer Engine's FP8 attention (dtype.fp8_dot_product_attention)

    @property
    def fwd_flops(self) -> float:
        """Scores QK^T and the weighted values PV, 2 x 2 x seq^2 x head_dim per head, halved by the causal mask."""
        return 2.0 * 2.0 * self.batch * self.heads * self.head_dim * self.seq * self.seq / 2

    @property
    def bwd_flops(self) -> float:
        return 2 * self.fwd_flops

    @property
    def shape(self) -> str:
        precision = "fp8" if self.fp8 else "bf16"
        return f"b{self.batch} s{self.seq} heads {self.heads}/{self.groups} d{self.head_dim} causal {precision}"


def layer_attention(model: ModelConfig, tp: int, mbs: int, seq: int, fp8: bool = False) -> Attention:
    heads = _whole(model.num_attention_heads / tp, "the attention heads / tp")
    groups = _whole(model.num_query_groups / tp, "the key/value groups / tp")
    return Attention(mbs, heads, groups, model.kv_channels, seq, fp8)


@dataclass(frozen=True)
class StepShape:
    """What one GPU's kernels of a step depend on."""

    tp: int
    cp: int
    mbs: int
    seq: int
    microbatches: int
    layers: int  # decoder layers on this GPU's pipeline stage
    last_stage: bool  # holds the output layer and the loss
    fp8: bool
    sequence_parallel: bool
    padded_vocab: int
    # LoRA: the base's weights (the decoder layers' and the output layer's) are frozen and get no weight gradients.
    frozen_base: bool = False
    fp8_attention: bool = False  # the plan's fp8_dot_product_attention

    @property
    def tokens(self) -> int:
        """Tokens of one microbatch on one GPU: context parallelism splits the sequence."""
        return _whole(self.mbs * self.seq / self.cp, "micro batch x seq / cp")


def shape_of_run(plan: Plan, rank: int, frozen_base: bool = False) -> StepShape:
    """The shape of `rank`'s step; megatron-core's rank order puts pipeline parallelism outermost. `frozen_base`:
    a LoRA run (the adapters' own GEMMs are left out: at r=16 under 0.5% of the FLOPs)."""
    if plan.pp > 1 and not plan.rank_order.endswith("pp"):
        raise SystemExit(f"rank order {plan.rank_order}: only orders with pp outermost are known here")
    stage = rank // (plan.num_gpus // plan.pp)
    return StepShape(
        tp=plan.tp,
        cp=plan.cp,
        mbs=plan.micro_batch_size,
        seq=plan.seq_length,
        microbatches=plan.num_microbatches,
        layers=plan.layers_per_pipeline_stage[stage],
        last_stage=stage == plan.pp - 1,
        fp8=bool(plan.fp8),
        sequence_parallel=plan.sequence_parallel,
        padded_vocab=plan.padded_vocab_size,
        frozen_base=frozen_base,
        fp8_attention=bool(plan.fp8_dot_product_attention),
    )


def trained(gemms: list[Gemm], shape: StepShape) -> list[Gemm]:
    """The GEMMs the step runs: a frozen base computes no weight gradients."""
    return [g for g in gemms if not (shape.frozen_base and g.pass_ == "wgrad")]


@dataclass
class Work:
    """What one kernel class must do in one step on one GPU: FLOPs or bytes, and for FLOP classes the standalone
    kernels it is made of (kernel name -> calls per step), whose measured times give the class's ceiling."""

    cls: str
    flops: float = 0.0
    bytes: float = 0.0
    calls: dict[str, float] = field(default_factory=dict)


def step_work(model: ModelConfig, shape: StepShape, c: StepTimeConstants) -> dict[str, Work]:
    """Per class, one step of one GPU: every microbatch's decoder layers (and the output layer and loss on the last
    pipeline stage). Context parallelism leaves each rank 1/cp of the causal attention."""
    per = shape.layers * shape.microbatches
    gemms = trained(layer_gemms(model, shape.tp, shape.tokens, shape.fp8), shape)
    calls = {g.name: float(per) for g in gemms}
    flops = per * sum(g.flops for g in gemms)
    if shape.last_stage:
        for g in trained(output_gemms(model, shape.tp, shape.tokens, shape.padded_vocab), shape):
            calls[g.name] = float(shape.microbatches)
            flops += shape.microbatches * g.flops
    attention = layer_attention(model, shape.tp, shape.mbs, shape.seq)
    share = per / shape.cp
    elementwise = per * elementwise_bytes(c, model, shape.tp, shape.sequence_parallel, shape.tokens)
    work = {
        GEMM: Work(GEMM, flops=flops, calls=calls),
        ATTN_FWD: Work(ATTN_FWD, flops=share * attention.fwd_flops, calls={ATTN_FWD: share}),
        ATTN_BWD: Work(ATTN_BWD, flops=share * attention.bwd_flops, calls={ATTN_BWD: share}),
        ELEMENTWISE: Work(ELEMENTWISE, bytes=elementwise),
    }
    if shape.fp8:  # the step-time model's FP8 factor on the elementwise work: the casts, transposes and amaxes
        work[CASTS] = Work(CASTS, bytes=(c.fp8_elementwise_factor - 1) * elementwise)
    if shape.last_stage:
        work[LOSS] = Work(LOSS, bytes=shape.microbatches * loss_bytes(c, shape.tokens, shape.padded_vocab, shape.tp))
    return work


def merged_attention(work: dict[str, Work]) -> dict[str, Work]:
    """Forward and backward attention as one class, for a trace whose kernel names do not tell them apart."""
    fwd, bwd = work[ATTN_FWD], work[ATTN_BWD]
    out = {k: v for k, v in work.items() if k not in (ATTN_FWD, ATTN_BWD)}
    out[ATTN] = Work(ATTN, flops=fwd.flops + bwd.flops, calls={**fwd.calls, **bwd.calls})
    return out


# --------------------------------------------------------------------------- measurements and ceilings
@dataclass
class Measured:
    """One kernel timed alone: FLOPs or bytes per call, the median time per call."""

    cls: str
    name: str
    time_ms: float
    flops: float = 0.0
    bytes: float = 0.0
    shape: str = ""
    backend: str = ""
    # The GPU's median SM clock and power while the calls were timed (NVML; None where it could not say).
    sm_mhz: float | None = None
    power_w: float | None = None
    # The same kernel called back to back for --sustained-s seconds: its time per call at the clock the GPU holds
    # under that load, and that clock and power (GEMMs and the copy; None where not measured).
    sustained_ms: float | None = None
    sustained_sm_mhz: float | None = None
    sustained_power_w: float | None = None

    @property
    def rate(self) -> float:
        """TFLOP/s for a FLOP kernel, GB/s for a copy."""
        return self.rate_at(self.time_ms)

    def rate_at(self, ms: float) -> float:
        return (self.flops / 1e12 if self.flops else self.bytes / GB) / (ms / 1e3)


@dataclass
class Ceilings:
    """A measurement: what every kernel of the shapes took alone, for one GPU and one set of shapes."""

    gpu: str
    kernels: list[Measured]
    notes: list[str] = field(default_factory=list)

    def by_name(self) -> dict[str, Measured]:
        return {m.name: m for m in self.kernels}

    @property
    def copy_gb_s(self) -> float:
        return next(m.rate for m in self.kernels if m.cls == COPY)

    def sustained(self) -> "Ceilings":
        """The ceilings of kernels run back to back, at the clock the GPU holds under a step's load: each kernel's
        sustained time where it was measured (GEMMs, the copy), its time alone otherwise (attention)."""
        if not any(m.sustained_ms for m in self.kernels):
            raise SystemExit("these ceilings hold no sustained times: measure them again with bench_kernels.py")
        kernels = [replace(m, time_ms=m.sustained_ms) if m.sustained_ms else m for m in self.kernels]
        note = "ceilings: sustained (back-to-back calls) where measured, attention's alone"
        return Ceilings(self.gpu, kernels, [*self.notes, note])


def wanted_kernels(model: ModelConfig, shape: StepShape) -> tuple[list[Gemm], Attention]:
    """The standalone kernels a step of this shape is made of."""
    gemms = layer_gemms(model, shape.tp, shape.tokens, shape.fp8)
    if shape.last_stage:
        gemms += output_gemms(model, shape.tp, shape.tokens, shape.padded_vocab)
    return trained(gemms, shape), layer_attention(model, shape.tp, shape.mbs, shape.seq, shape.fp8_attention)


def peak_ceilings(gemms: list[Gemm], attention: Attention, spec: GpuSpec, hbm_gb_s: float) -> Ceilings:
    """The datasheet instead of a measurement: every kernel at the dtype's peak, a copy at the HBM bandwidth."""
    fp8_peak = spec.fp8_peak_flops or spec.bf16_peak_flops
    kernels = [
        Measured(
            GEMM, g.name, g.flops / (fp8_peak if g.fp8 else spec.bf16_peak_flops) * 1e3, flops=g.flops, shape=g.shape
        )
        for g in gemms
    ]
    attention_peak = fp8_peak if attention.fp8 else spec.bf16_peak_flops
    for cls, flops in ((ATTN_FWD, attention.fwd_flops), (ATTN_BWD, attention.bwd_flops)):
        kernels.append(Measured(cls, cls, flops / attention_peak * 1e3, flops=flops, shape=attention.shape))
    kernels.append(Measured(COPY, COPY, 1e3, bytes=hbm_gb_s * GB))
    return Ceilings(f"{spec.name} (datasheet)", kernels, ["ceilings: datasheet peaks and HBM bandwidth, not measured"])


def check_shapes(ceilings: Ceilings, gemms: list[Gemm], attention: Attention, source: str) -> None:
    """A measurement of other shapes would give another step's ceilings: refuse it in one line."""
    measured = ceilings.by_name()
    for name, shape in [(g.name, g.shape) for g in gemms] + [(ATTN_FWD, attention.shape), (ATTN_BWD, attention.shape)]:
        got = measured.get(name)
        if got is None or got.shape != shape:
            there = "nothing" if got is None else got.shape
            raise SystemExit(
                f"{source} holds {there} for {name}, this run needs {shape}: measure this run's shapes "
                "(bench_kernels.py --trace without --ceilings, or --tp/--seq/--mbs/--dtype/--attention as the run)"
            )
    if not any(m.cls == COPY for m in ceilings.kernels):
        raise SystemExit(f"{source} has no copy bandwidth: measure again with bench_kernels.py")


def read_ceilings(path: Path) -> Ceilings:
    try:
        data = json.loads(path.read_text())
        return Ceilings(data["gpu"], [Measured(**m) for m in data["kernels"]], data.get("notes", []))
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise SystemExit(f"{path}: not a bench_kernels.py --json file ({err})") from None


# --------------------------------------------------------------------------- the join (pure, CPU)
@dataclass
class ClassGap:
    """One kernel class of one step: its time in the trace against its time at the ceiling."""

    cls: str
    trace_ms: float
    flops: float = 0.0
    bytes: float = 0.0
    ceiling_ms: float | None = None  # None: no ceiling (other)

    @property
    def gap_ms(self) -> float | None:
        return None if self.ceiling_ms is None else self.trace_ms - self.ceiling_ms

    def rate(self, ms: float | None) -> float | None:
        """TFLOP/s or GB/s of this class's work done in `ms`."""
        if not ms or not (self.flops or self.bytes):
            return None
        return (self.flops / 1e12 if self.flops else self.bytes / GB) / (ms / 1e3)


def trace_class_ms(b: profile_breakdown.Breakdown, steps: int) -> dict[str, float]:
    """Milliseconds per step of each class; attention split into forward and backward where kernel names tell."""
    out = {group: ms / steps for group, ms in b.ms.items()}
    attention = b.kernels.get(ATTN, {})
    bwd = sum(ms for name, ms in attention.items() if ATTN_BWD_NAME.search(name))
    if bwd:
        out.pop(ATTN, None)
        out[ATTN_BWD] = bwd / steps
        out[ATTN_FWD] = sum(attention.values()) / steps - out[ATTN_BWD]
    return out


def join(work: dict[str, Work], trace_ms: dict[str, float], ceilings: Ceilings) -> list[ClassGap]:
    """Every class the trace or the work has: its trace time, its FLOPs or bytes and its time at the ceiling (the
    calls of each standalone kernel times its measured time; bytes at the copy bandwidth)."""
    if ATTN in trace_ms:
        work = merged_attention(work)
    measured = ceilings.by_name()
    rows = []
    for cls in CLASS_ORDER:
        if cls not in trace_ms and cls not in work:
            continue
        w = work.get(cls, Work(cls))
        ceiling: float | None = None
        if w.calls:
            ceiling = sum(n * measured[name].time_ms for name, n in w.calls.items())
        elif w.bytes:
            ceiling = w.bytes / (ceilings.copy_gb_s * GB) * 1e3
        rows.append(ClassGap(cls, trace_ms.get(cls, 0.0), w.flops, w.bytes, ceiling))
    return rows


def _amount(row: ClassGap) -> str:
    if row.flops:
        return f"{row.flops / 1e12:,.1f} TFLOP"
    return f"{row.bytes / GB:,.1f} GB" if row.bytes else "-"


def _rate(value: float | None, row: ClassGap) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f} TFLOP/s" if row.flops else f"{value:,.0f} GB/s"


def format_join(rows: list[ClassGap], timeline: profile_breakdown.Breakdown | None = None, steps: int = 1) -> str:
    """The table; with `timeline` (the trace's breakdown over `steps` steps) also its span from first to last
    kernel, its communication, the part of that exposed, and the idle time, per step, then the communication
    kernels with the most exposed time and the longest idle gaps."""
    header = (
        f"{'kernel class':<24} {'work per step':>14} {'trace ms':>9} {'achieved':>14} {'ceiling':>14} "
        f"{'at ceiling ms':>13} {'gap ms':>8}"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        ceiling = "-" if r.ceiling_ms is None else f"{r.ceiling_ms:.1f}"
        gap = "-" if r.gap_ms is None else f"{r.gap_ms:+.1f}"
        lines.append(
            f"{r.cls:<24} {_amount(r):>14} {r.trace_ms:>9.1f} {_rate(r.rate(r.trace_ms), r):>14} "
            f"{_rate(r.rate(r.ceiling_ms), r):>14} {ceiling:>13} {gap:>8}"
        )
    total = sum(r.trace_ms for r in rows)
    at_ceiling = sum(r.trace_ms if r.ceiling_ms is None else r.ceiling_ms for r in rows)
    blank = ""
    lines.append(
        f"{'kernels, total':<24} {blank:>14} {total:>9.1f} {blank:>14} {blank:>14} {at_ceiling:>13.1f} "
        f"{total - at_ceiling:>+8.1f}"
    )
    if timeline is not None:
        for label, ms in (
            ("first to last kernel", timeline.span_ms),
            ("communication", timeline.communication_ms),
            ("  exposed", timeline.exposed_communication_ms),
            ("idle (no kernel)", timeline.idle_ms),
        ):
            lines.append(f"{label:<24} {'':>14} {ms / steps:>9.1f}")
        lines += profile_breakdown.where_the_wait_is(timeline, top=5, steps=steps)
    lines.append("per step of one GPU; at ceiling: each class's work at its ceiling, 'other' at its trace time")
    return "\n".join(lines)


def _pair(alone: float | None, sustained: float | None) -> str:
    """'1,980/1,755': a number alone and back to back; '-' for one not measured."""
    return "/".join("-" if v is None else f"{v:,.0f}" for v in (alone, sustained))


def format_ceilings(ceilings: Ceilings, spec: GpuSpec | None, hbm_gb_s: float | None) -> str:
    """The standalone kernels: time, achieved rate and the datasheet peak it compares with, alone and back to back
    (sustained), with the SM clock and power of each."""
    header = (
        f"{'class':<14} {'kernel':<16} {'shape':<36} {'work':>12} {'ms':>8} {'achieved':>14} {'of peak':>8} "
        f"{'sustained':>14} {'of peak':>8} {'SM MHz':>11} {'W':>9}"
    )
    lines = [f"GPU: {ceilings.gpu}", header, "-" * len(header)]
    for m in ceilings.kernels:
        work = f"{m.flops / 1e12:.2f} TFLOP" if m.flops else f"{m.bytes / GB:.2f} GB"
        unit = "TFLOP/s" if m.flops else "GB/s"
        peak = None
        if spec is not None and m.flops:
            peak = spec.fp8_peak_flops if m.shape.endswith("fp8") and spec.fp8_peak_flops else spec.bf16_peak_flops
            peak /= 1e12
        elif hbm_gb_s and m.bytes:
            peak = hbm_gb_s
        rates = [m.rate, m.rate_at(m.sustained_ms) if m.sustained_ms else None]
        shown = ["-" if r is None else f"{r:,.0f} {unit}" for r in rates]
        shares = ["-" if r is None or peak is None else f"{r / peak * 100:.1f}%" for r in rates]
        lines.append(
            f"{m.cls:<14} {m.name:<16} {m.shape:<36} {work:>12} {m.time_ms:>8.3f} {shown[0]:>14} {shares[0]:>8} "
            f"{shown[1]:>14} {shares[1]:>8} {_pair(m.sm_mhz, m.sustained_sm_mhz):>11} "
            f"{_pair(m.power_w, m.sustained_power_w):>9}"
        )
    lines.append("SM MHz, W: medians while timed alone / back to back (NVML)")
    lines += ceilings.notes
    return "\n".join(lines)


def trace_steps(path: Path) -> tuple[int, int]:
    """(rank, steps) from the trace's name (rank<R>_steps<A>-<B>.pt.trace.json.gz: steps A to B)."""
    found = TRACE_NAME.search(path.name)
    if not found:
        raise SystemExit(f"{path.name}: not a profile.tool=torch trace (rank<R>_steps<A>-<B>.pt.trace.json.gz)")
    rank, first, last = (int(x) for x in found.groups())
    return rank, last - first + 1


# --------------------------------------------------------------------------- GPU (torch, Transformer Engine)
# GPU cycles of the spin kernel queued ahead of each timed call (about 10 ms at an H200's 1.98 GHz): longer than
# the host takes to launch any call timed here, so the call's kernels queue behind it and run back to back.
HOLD_CYCLES = 20_000_000


def _median_ms(run: Callable[[Any], Any], setup: Callable[[], Any] | None, warmup: int, iters: int) -> float:
    """Median of CUDA-event times of single calls, after warm-up; `setup` (untimed) feeds each call.

    Each call is launched while the GPU spins (torch.cuda._sleep) ahead of the start event, so the time is the
    kernels' alone, as in a training step, where the host runs ahead of the GPU. Without it a call whose kernels are
    shorter than its launch, as FP8 attention's forward with its autocast, timed the host: 397 TFLOP/s standalone
    against 706 in the step."""
    import torch

    for _ in range(warmup):
        run(setup() if setup else None)
    times = []
    for _ in range(iters):
        arg = setup() if setup else None
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(HOLD_CYCLES)
        start.record()
        run(arg)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _sustained_ms(run: Callable[[Any], Any], seconds: float, per_call_ms: float) -> float:
    """Time per call of `run` called back to back for about `seconds`, over the second half of the calls: the
    GPU's clock has settled to what it holds under this load by then, as in a step's seconds of GEMMs."""
    import torch

    calls = max(2, math.ceil(seconds * 1e3 / per_call_ms))
    start, middle, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
    start.record()
    for i in range(calls):
        if i == calls // 2:
            middle.record()
        run(None)
    end.record()
    end.synchronize()
    return middle.elapsed_time(end) / (calls - calls // 2)


# NVML samples a second while a kernel is timed: enough for a median over its fraction of a second.
CLOCK_INTERVAL_S = 0.02


def _clock_sampler(folder: str) -> Any:
    """The trainer's telemetry sampler (NVML) on this process's GPU 0, every CLOCK_INTERVAL_S; None where NVML is
    missing or fails (the timing goes on without clocks)."""
    try:
        from recipes.observability import telemetry as sampling

        return sampling.start(folder, CLOCK_INTERVAL_S, sampling.job_gpu_ids(1), node="gpu")
    except Exception:  # noqa: BLE001 - no pynvml, no NVML
        return None


@contextlib.contextmanager
def _gpu_clocks(into: dict[str, float | None]):
    """GPU 0's median SM clock (`into["sm_mhz"]`) and power (`into["power_w"]`) over the second half of the block
    (the clock settles after the load starts); nothing where NVML cannot say."""
    from launcher.report.telemetry import read_csv
    from recipes.observability.telemetry import csv_path

    folder = tempfile.mkdtemp(prefix="bench_kernels_clocks_")
    sampler = _clock_sampler(folder)
    began = time.time()
    try:
        yield
    finally:
        if sampler is not None:
            sampler.stop()
            middle = (began + time.time()) / 2
            late = [x for x in read_csv(Path(csv_path(folder, "gpu"))) if x.time >= middle]
            for key, field_name in (("sm_mhz", "sm_clock_mhz"), ("power_w", "power_w")):
                values = [getattr(x, field_name) for x in late if getattr(x, field_name) is not None]
                into[key] = statistics.median(values) if values else None


def _timed(
    m: Measured, run: Callable[[Any], Any], setup: Callable[[], Any] | None, warmup: int, iters: int, sustained_s: float
) -> Measured:
    """`m` with its time alone (the median of single calls), the clock and power then, and where `sustained_s` and
    no `setup`, its time back to back with that clock and power."""
    clocks: dict[str, float | None] = {}
    with _gpu_clocks(clocks):
        m.time_ms = _median_ms(run, setup, warmup, iters)
    m.sm_mhz, m.power_w = clocks.get("sm_mhz"), clocks.get("power_w")
    if sustained_s > 0 and setup is None:
        clocks = {}
        with _gpu_clocks(clocks):
            m.sustained_ms = _sustained_ms(run, sustained_s, m.time_ms)
        m.sustained_sm_mhz, m.sustained_power_w = clocks.get("sm_mhz"), clocks.get("power_w")
    return m


def _te_operands(g: Gemm, device: str = "cuda") -> tuple[Any, Any, str]:
    """(A, B, layout) as Transformer Engine's Linear hands them to general_gemm, which computes op(B) op(A) (T: the
    operand transposed). bf16: forward (W, X, TN), input gradient (W, dY, NN), weight gradient (X, dY, NT). FP8 on
    Hopper takes only TN (Transformer Engine keeps transposed FP8 copies): A [n, k], B [m, k] for every pass."""
    import torch

    def randn(*size: int) -> Any:
        return torch.randn(*size, device=device, dtype=torch.bfloat16)

    if g.fp8 or g.pass_ == "fwd":
        return randn(g.n, g.k), randn(g.m, g.k), "TN"
    if g.pass_ == "dgrad":
        return randn(g.k, g.n), randn(g.m, g.k), "NN"
    return randn(g.k, g.n), randn(g.k, g.m), "NT"


def _factors(a: Any, b: Any, layout: str) -> tuple[Any, Any]:
    """general_gemm(a, b, layout) computes left @ right of these (views, no copies)."""
    return (b.t() if layout[1] == "T" else b), (a.t() if layout[0] == "T" else a)


def _te_gemm(g: Gemm) -> Callable[[Any], Any]:
    """Transformer Engine's GEMM at the layouts its Linear runs: bf16, or FP8 as on Hopper (E4M3 x E4M3 forward,
    E5M2 gradients x E4M3 backward, split accumulation backward as its recipes set it); the weight gradient
    accumulated into fp32 as megatron-core's main_grad. Checked once against torch's fp32 product of the same
    operands, so a layout Transformer Engine reads otherwise fails here instead of timing another GEMM."""
    import torch

    # The extension module is loaded by transformer_engine.pytorch, not found on the path by its own name.
    import transformer_engine.pytorch  # noqa: F401
    import transformer_engine_torch as tex
    from transformer_engine.pytorch.cpp_extensions import general_gemm
    from transformer_engine.pytorch.tensor.float8_tensor import Float8Quantizer

    grad, wgrad = g.pass_ != "fwd", g.pass_ == "wgrad"
    a, b, layout = _te_operands(g)
    if g.fp8:

        def quantize(x: Any, dtype: Any) -> Any:
            scale, amax = torch.ones(1, device="cuda"), torch.zeros(1, device="cuda")
            return Float8Quantizer(scale, amax, dtype, rowwise=True, columnwise=False)(x)

        a = quantize(a, tex.DType.kFloat8E4M3)
        b = quantize(b, tex.DType.kFloat8E5M2 if grad else tex.DType.kFloat8E4M3)
    out = (torch.zeros if wgrad else torch.empty)(
        g.m, g.n, device="cuda", dtype=torch.float32 if wgrad else torch.bfloat16
    )

    def run(_: Any) -> Any:
        # It takes its cuBLAS workspace itself (Transformer Engine 2.20: no workspace argument).
        return general_gemm(
            a, b, out_dtype=out.dtype, layout=layout, out=out, accumulate=wgrad, use_split_accumulator=grad and g.fp8
        )

    run(None)  # into zeros: the weight gradient's first accumulation is the product itself
    plain = [x.dequantize() if g.fp8 else x for x in (a, b)]
    left, right = _factors(*plain, layout)
    want = left.float() @ right.float()
    error = float((out.float() - want).norm() / want.norm())
    if error > 1e-2:
        raise ValueError(f"general_gemm({layout}) is {error:.1e} off torch's product")
    return run


def _fallback_gemm(g: Gemm) -> Callable[[Any], Any]:
    """torch.matmul (bf16) or torch._scaled_mm (FP8), cuBLASLt without Transformer Engine, for a Transformer Engine
    whose Python API differs from the one used here."""
    import torch

    a, b, layout = _te_operands(g)
    if not g.fp8:
        left, right = _factors(a, b, layout)
        out = torch.empty(g.m, g.n, device="cuda", dtype=torch.bfloat16)
        return lambda _: torch.matmul(left, right, out=out)
    grad = g.pass_ != "fwd"
    b8 = b.to(torch.float8_e5m2 if grad else torch.float8_e4m3fn)
    a8 = a.to(torch.float8_e4m3fn)
    one = torch.ones((), device="cuda", dtype=torch.float32)
    dtype = torch.float32 if g.pass_ == "wgrad" else torch.bfloat16
    return lambda _: torch._scaled_mm(b8, a8.t(), scale_a=one, scale_b=one, out_dtype=dtype, use_fast_accum=not grad)


def _gemm(g: Gemm) -> tuple[Callable[[Any], Any], str]:
    try:
        return _te_gemm(g), "te"
    except Exception as err:  # noqa: BLE001 - any API difference: fall back, and say so in the table
        name = "torch._scaled_mm" if g.fp8 else "torch.matmul"
        return _fallback_gemm(g), f"{name} (Transformer Engine: {type(err).__name__}: {str(err)[:80]})"


def measure_gemm(g: Gemm, warmup: int, iters: int, sustained_s: float) -> Measured:
    run, backend = _gemm(g)
    measured = Measured(GEMM, g.name, 0.0, flops=g.flops, shape=g.shape, backend=backend)
    return _timed(measured, run, None, warmup, iters, sustained_s)


def _cuda_kernel_names(fn: Callable[[], Any]) -> list[str]:
    """The GPU kernels one call of fn launches, by the torch profiler."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = set()
    for event in prof.events():  # kernels as events of their own, or attached to the CPU op that launched them
        if str(getattr(event, "device_type", "")).endswith("CUDA"):
            names.add(event.name)
        names.update(k.name for k in getattr(event, "kernels", []))
    return sorted(names)


def attention_backend(kernels: list[str]) -> str:
    """Which Transformer Engine backend ran, from its kernels' names."""
    attention = [k for k in kernels if profile_breakdown.group_of(k) == ATTN]
    if any(re.search(r"cudnn|fort_native|sdpa|fmha", k, re.I) for k in attention):
        kind = "FusedAttention (cuDNN)"
    elif any("flash" in k.lower() for k in attention):
        kind = "FlashAttention"
    else:
        kind = "UnfusedDotProductAttention or unknown"
    return f"{kind}: {', '.join(k[:70] for k in attention[:3]) or 'no attention kernels'}"


def _attention_precision(fp8: bool) -> Any:
    """A context for the attention's forward: FP8 attention as the training runs it (delayed scaling with
    fp8_dpa: Transformer Engine casts q, k and v to FP8, the output stays bf16), or nothing for bf16."""
    import contextlib

    if not fp8:
        return contextlib.nullcontext()
    import transformer_engine.pytorch as te
    from transformer_engine.common.recipe import DelayedScaling, Format

    recipe = DelayedScaling(fp8_format=Format.HYBRID, fp8_dpa=True)
    if hasattr(te, "autocast"):  # Transformer Engine 2.8 and later; fp8_autocast is its deprecated name
        return te.autocast(enabled=True, recipe=recipe)
    return te.fp8_autocast(enabled=True, fp8_recipe=recipe)


def measure_attention(att: Attention, warmup: int, iters: int) -> tuple[Measured, Measured]:
    import torch
    import transformer_engine.pytorch as te

    dpa = te.DotProductAttention(
        att.heads,
        att.head_dim,
        num_gqa_groups=att.groups,
        attention_dropout=0.0,
        qkv_format="sbhd",
        attn_mask_type="causal",
    ).cuda()

    def tensor(heads: int) -> Any:
        return torch.randn(
            att.seq, att.batch, heads, att.head_dim, device="cuda", dtype=torch.bfloat16
        ).requires_grad_()

    q, k, v = tensor(att.heads), tensor(att.groups), tensor(att.groups)
    grad = torch.randn(att.seq, att.batch, att.heads * att.head_dim, device="cuda", dtype=torch.bfloat16)

    def forward() -> Any:
        for x in (q, k, v):
            x.grad = None
        with _attention_precision(att.fp8):
            return dpa(q, k, v)

    backend = attention_backend(_cuda_kernel_names(lambda: forward().backward(grad)))
    # Alone only: FP8 attention's forward launches for about as long as it runs, so back to back it would time
    # the host.
    fwd = Measured(ATTN_FWD, ATTN_FWD, 0.0, flops=att.fwd_flops, shape=att.shape, backend=backend)
    bwd = Measured(ATTN_BWD, ATTN_BWD, 0.0, flops=att.bwd_flops, shape=att.shape, backend=backend)
    return (
        _timed(fwd, lambda _: forward(), None, warmup, iters, sustained_s=0.0),
        _timed(bwd, lambda out: out.backward(grad), forward, warmup, iters, sustained_s=0.0),
    )


def measure_copy(gib: float, warmup: int, iters: int, sustained_s: float) -> Measured:
    """A device-to-device copy: what memory-bound kernels can reach (bytes read plus bytes written)."""
    import torch

    x = torch.empty(int(gib * 2**30) // 2, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    m = Measured(COPY, COPY, 0.0, bytes=2.0 * x.numel() * x.element_size(), shape=f"{gib:g} GiB bf16")
    return _timed(m, lambda _: y.copy_(x), None, warmup, iters, sustained_s)


def this_gpu() -> tuple[str, GpuSpec | None]:
    import torch

    name = torch.cuda.get_device_name(0)
    known = gpu_type_from_name(name)
    return name, gpu_spec(known) if known else None


def measure(
    gemms: list[Gemm], attention: Attention, warmup: int, iters: int, copy_gib: float, sustained_s: float
) -> Ceilings:
    import torch

    name, _ = this_gpu()
    torch.manual_seed(0)
    kernels = [measure_gemm(g, warmup, iters, sustained_s) for g in gemms]
    kernels += measure_attention(attention, warmup, iters)
    kernels.append(measure_copy(copy_gib, warmup, iters, sustained_s))
    backends = dict.fromkeys(f"{m.cls}: {m.backend}" for m in kernels if m.backend)
    return Ceilings(name, kernels, [f"backend {b}" for b in backends])


# --------------------------------------------------------------------------- entry
def _hbm_gb_s(spec: GpuSpec | None) -> float | None:
    gpus = default_constants().gpus
    return gpus[spec.name].hbm_gb_s if spec is not None and spec.name in gpus else None


def standalone_shape(args: argparse.Namespace, model: ModelConfig) -> StepShape:
    vocab = padded_vocab_size(model.vocab_size, model.make_vocab_size_divisible_by, args.tp)
    fp8 = args.dtype == "fp8"
    fp8_attention = fp8 if args.attention is None else args.attention == "fp8"
    return StepShape(args.tp, 1, args.mbs, args.seq, 1, 1, True, fp8, args.tp > 1, vocab, fp8_attention=fp8_attention)


def run_trace(args: argparse.Namespace) -> int:
    from common.run import RunDirError, load_run

    trace = Path(args.trace)
    rank, steps = trace_steps(trace)
    try:
        run = load_run(trace.parent.parent)
    except RunDirError as err:
        raise SystemExit(f"the trace's run directory: {err}") from None
    frozen_base = run.config.peft.method == PeftMethod.lora
    model, shape = run.config.training.model, shape_of_run(run.plan, rank, frozen_base)
    gemms, attention = wanted_kernels(model, shape)
    spec = gpu_spec(run.plan.gpu_type) if run.plan.gpu_type else None
    if args.ceilings == "peak":
        if spec is None:
            raise SystemExit("--ceilings peak needs the plan's gpu_type (cluster.gpu_type)")
        ceilings = peak_ceilings(gemms, attention, spec, _hbm_gb_s(spec) or 0.0)
    elif args.ceilings:
        ceilings = read_ceilings(Path(args.ceilings))
        check_shapes(ceilings, gemms, attention, args.ceilings)
    else:
        ceilings = measure(gemms, attention, args.warmup, args.iters, args.copy_gib, args.sustained_s)
        print(format_ceilings(ceilings, this_gpu()[1], _hbm_gb_s(this_gpu()[1])), "\n")
    if args.sustained:
        ceilings = ceilings.sustained()
    b = profile_breakdown.breakdown(profile_breakdown.load_events(trace))
    rows = join(step_work(model, shape, default_constants()), trace_class_ms(b, steps), ceilings)
    print(
        f"{trace} ({steps} step{'s' if steps > 1 else ''}, rank {rank}): {model.num_layers} layers, "
        f"{shape.layers} on this rank, TP{shape.tp} CP{shape.cp}, {shape.microbatches} microbatches of "
        f"{shape.mbs} x {shape.seq}, {'fp8' if shape.fp8 else 'bf16'}{', LoRA (frozen base)' if frozen_base else ''}; "
        f"ceilings: {ceilings.gpu}"
    )
    print(format_join(rows, b, steps))
    for note in ceilings.notes:
        print(note)
    if args.json:
        Path(args.json).write_text(json.dumps([{**asdict(r), "gap_ms": r.gap_ms} for r in rows], indent=1))
    return 0


def run_standalone(args: argparse.Namespace) -> int:
    from launcher.autoconf.perfdata import training_model

    try:
        model = training_model(args.model.replace("/", "_"))
    except Exception as err:  # noqa: BLE001 - Hydra's composition errors are several lines; one is enough
        raise SystemExit(
            f"--model {args.model}: {str(err).splitlines()[0]} (a training config, e.g. llama31/8b)"
        ) from None
    gemms, attention = wanted_kernels(model, standalone_shape(args, model))
    ceilings = measure(gemms, attention, args.warmup, args.iters, args.copy_gib, args.sustained_s)
    _, spec = this_gpu()
    print(f"{args.model}, TP{args.tp}, seq {args.seq}, micro batch {args.mbs}, {args.dtype}")
    print(format_ceilings(ceilings, spec, _hbm_gb_s(spec)))
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"gpu": ceilings.gpu, "kernels": [asdict(m) for m in ceilings.kernels], "notes": ceilings.notes},
                indent=1,
            )
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="llama31/8b", help="a training config (its architecture)")
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--mbs", type=int, default=1)
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp8"], help="of the decoder layers' GEMMs")
    parser.add_argument(
        "--attention",
        default=None,
        choices=["bf16", "fp8"],
        help="attention's precision; default: fp8 with --dtype fp8 (the plan's default where FP8 attention trains)",
    )
    parser.add_argument("--trace", default=None, help="join a profile.tool=torch trace with the ceilings")
    parser.add_argument("--ceilings", default=None, help="with --trace: a --json file of a measurement, or 'peak'")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--copy-gib", type=float, default=2.0, help="size of the copied buffer")
    parser.add_argument(
        "--sustained-s",
        type=float,
        default=1.0,
        help="also time each GEMM and the copy back to back for this long, at the clock the GPU holds then (0: off)",
    )
    parser.add_argument(
        "--sustained",
        action="store_true",
        help="with --trace: join against the sustained ceilings (back-to-back calls) where measured",
    )
    parser.add_argument("--json", default=None, help="also write the measurement (or the join) here")
    args = parser.parse_args(argv)
    for key in ("tp", "seq", "mbs", "warmup", "iters"):
        if getattr(args, key) < (0 if key == "warmup" else 1):
            parser.error(f"--{key} {getattr(args, key)}: give a positive number")
    if args.ceilings and not args.trace:
        parser.error("--ceilings goes with --trace")
    if args.sustained_s < 0:
        parser.error(f"--sustained-s {args.sustained_s}: give 0 (off) or a number of seconds")
    if args.sustained and not args.trace:
        parser.error("--sustained goes with --trace")
    if args.sustained and args.ceilings == "peak":
        parser.error("--sustained needs measured ceilings, not the datasheet's")
    if args.attention == "fp8" and args.dtype != "fp8":
        parser.error("--attention fp8 needs --dtype fp8 (FP8 attention runs only in FP8 training)")
    return run_trace(args) if args.trace else run_standalone(args)


if __name__ == "__main__":
    sys.exit(main())
