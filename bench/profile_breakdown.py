"""GPU kernel time of a torch-profiler trace (profile.tool=torch writes RUN_DIR/profile/*.pt.trace.json.gz), grouped:
GEMM, attention, FP8 cast/transpose/amax, norm/RoPE/SwiGLU, loss, other; one column per trace, so a step before and
after a change compare side by side. bench/bench_kernels.py --trace sets each group against its ceiling.

Beside the groups, from the kernels' intervals: the communication kernels' time (NCCL's and Transformer Engine's
userbuffers kernels, and peer-to-peer copies; inside "other"), the part of it no other kernel overlaps (exposed
communication: what TP overlap or the gradient reduction's overlap leaves on the critical path), and the time within
the span that no kernel runs at all (idle: launch gaps, the CPU, a pipeline bubble waiting on another rank).
So that a step's loss to TP or pipelining can be placed, the exposed time is also split by communication kernel,
and the longest idle gaps are listed with the kernel that ends each (the work the GPU waited for).

    python bench/profile_breakdown.py before=RUN_A/profile/rank0_steps6-6.pt.trace.json.gz \\
        after=RUN_B/profile/rank0_steps6-6.pt.trace.json.gz
"""

from __future__ import annotations

import argparse
import bisect
from collections import Counter, defaultdict
from dataclasses import dataclass, field
import gzip
import json
from pathlib import Path
import re
import sys
from typing import Callable

# First match wins. Attention before GEMM (cuDNN's attention kernels carry sm90_ and xmma in their names); GEMM
# before the casts (FP8 GEMMs carry e4m3 in theirs); norm, RoPE and SwiGLU before the casts, so a kernel that
# normalises or activates and writes FP8 in the same pass counts as the fused work it is, not as a cast. The loss:
# Transformer Engine's and megatron-core's cross-entropy kernels, and the Triton kernels torch.compile makes of
# megatron's native fusion (named after their ops: triton_red_fused_copy__exp_sub_sum_unsqueeze_2); in a step only
# the loss exponentiates or takes logarithms outside attention and SiLU.
GROUPS: tuple[tuple[str, re.Pattern], ...] = (
    ("attention", re.compile(r"flash|fmha|sdpa|fused_attn|attn|cudnn", re.I)),
    ("GEMM", re.compile(r"gemm|nvjet|cutlass|xmma|cublas|gemv|splitk", re.I)),
    (
        "norm/RoPE/SwiGLU",
        re.compile(r"rmsnorm|layernorm|layer_norm|ln_fwd|ln_bwd|rope|rotary|swiglu|silu|gated|geglu", re.I),
    ),
    (
        "loss",
        re.compile(
            r"cross_entropy|crossentropy|xentropy|log_softmax|logsoftmax|logsumexp|nll_loss|online_softmax|"
            r"triton_\w*?_(exp|log)_",
            re.I,
        ),
    ),
    (
        "FP8 cast/transpose/amax",
        re.compile(
            r"cast|transpose|amax|quantiz|compute_scale|scale_update|fp8|float8|fp4|"
            r"e4m3|e5m2",
            re.I,
        ),
    ),
)
OTHER = "other"
ORDER = [name for name, _ in GROUPS] + [OTHER]
COMMUNICATION = re.compile(r"nccl|userbuffers|allgather|all_gather|reducescatter|reduce_scatter|allreduce|sendrecv"
                           r"|memcpy ptop", re.I)  # fmt: skip


def group_of(kernel: str) -> str:
    for name, pattern in GROUPS:
        if pattern.search(kernel):
            return name
    return OTHER


@dataclass
class Breakdown:
    """GPU time per group (ms) of one trace, the kernels behind it, and the span from first to last kernel."""

    ms: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    kernels: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))
    span_ms: float = 0.0
    communication_ms: float = 0.0
    exposed_communication_ms: float = 0.0  # communication while no other kernel runs
    idle_ms: float = 0.0  # within the span, no kernel running
    # Per communication kernel, its time under no compute kernel (two at once both count, so the sum can exceed
    # exposed_communication_ms).
    exposed_by_kernel: Counter = field(default_factory=Counter)
    idle_gaps: list[tuple[float, str]] = field(default_factory=list)  # (ms, the kernel that ends it), longest first

    @property
    def total_ms(self) -> float:
        return sum(self.ms.values())


def load_events(path: Path) -> list[dict]:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


def merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of [start, end) intervals as disjoint ones, in order."""
    out: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def covered_us(intervals: list[tuple[float, float]]) -> float:
    """The length of the union of [start, end) intervals."""
    return sum(end - start for start, end in merged(intervals))


def uncovered_us(start: float, end: float, cover: list[tuple[float, float]]) -> float:
    """How much of [start, end) lies outside `cover` (disjoint intervals in order, as merged() gives)."""
    inside = 0.0
    i = max(0, bisect.bisect_right(cover, (start, float("inf"))) - 1)
    while i < len(cover) and cover[i][0] < end:
        inside += max(0.0, min(end, cover[i][1]) - max(start, cover[i][0]))
        i += 1
    return end - start - inside


def idle_gaps(spans: list[tuple[float, float, str]]) -> list[tuple[float, str]]:
    """The gaps (ms) between kernels where none runs, each with the kernel that ends it, longest first."""
    gaps: list[tuple[float, str]] = []
    reach = None
    for start, end, name in sorted(spans):
        if reach is not None and start > reach:
            gaps.append(((start - reach) / 1e3, name))
        reach = end if reach is None else max(reach, end)
    return sorted(gaps, reverse=True)


def breakdown(events: list[dict]) -> Breakdown:
    out = Breakdown()
    compute: list[tuple[float, float, str]] = []  # (start, end, name) of every kernel and copy counted
    communication: list[tuple[float, float, str]] = []
    for event in events:
        kernel = event.get("cat") == "kernel"
        if event.get("ph") != "X" or not (kernel or event.get("cat") == "gpu_memcpy"):
            continue
        name, start, dur = event["name"], float(event["ts"]), float(event.get("dur", 0.0))
        communicates = bool(COMMUNICATION.search(name))
        if not (kernel or communicates):  # of the copies, only peer-to-peer ones count: as communication
            continue
        if kernel:
            group = group_of(name)
            out.ms[group] += dur / 1e3
            out.kernels[group][name] += dur / 1e3
        (communication if communicates else compute).append((start, start + dur, name))
    every = compute + communication
    if not every:
        return out
    compute_cover = merged([(start, end) for start, end, _ in compute])
    for start, end, name in communication:
        out.exposed_by_kernel[name] += uncovered_us(start, end, compute_cover) / 1e3
    out.idle_gaps = idle_gaps(every)
    out.span_ms = (max(end for _, end, _ in every) - min(start for start, _, _ in every)) / 1e3
    out.communication_ms = sum(end - start for start, end, _ in communication) / 1e3
    every_us = covered_us([(start, end) for start, end, _ in every])
    out.exposed_communication_ms = (every_us - sum(end - start for start, end in compute_cover)) / 1e3
    out.idle_ms = out.span_ms - every_us / 1e3
    return out


def format_breakdowns(named: list[tuple[str, Breakdown]], top: int = 3) -> str:
    header = f"{'kernel group':<26}" + "".join(f"{label:>14} {'share':>6}" for label, _ in named)
    if len(named) == 2:
        header += f"{'change':>10}"
    lines = [header, "-" * len(header)]
    for group in ORDER:
        row = f"{group:<26}"
        for _, b in named:
            share = b.ms.get(group, 0.0) / b.total_ms if b.total_ms else 0.0
            row += f"{b.ms.get(group, 0.0):>11.1f} ms {share * 100:>5.1f}%"
        if len(named) == 2:
            row += f"{named[1][1].ms.get(group, 0.0) - named[0][1].ms.get(group, 0.0):>+8.1f}ms"
        lines.append(row)
    rows: tuple[tuple[str, Callable[[Breakdown], float]], ...] = (
        ("kernels, total", lambda b: b.total_ms),
        ("first to last kernel", lambda b: b.span_ms),
        ("communication", lambda b: b.communication_ms),
        ("  exposed", lambda b: b.exposed_communication_ms),
        ("idle (no kernel)", lambda b: b.idle_ms),
    )
    for label, getter in rows:
        row = f"{label:<26}" + "".join(f"{getter(b):>11.1f} ms {'':>6}" for _, b in named)
        if len(named) == 2:
            row += f"{getter(named[1][1]) - getter(named[0][1]):>+8.1f}ms"
        lines.append(row)
    for label, b in named:
        lines.append("")
        lines.append(f"{label}: the {top} longest kernels of each group (ms)")
        for group in ORDER:
            for kernel, ms in b.kernels.get(group, Counter()).most_common(top):
                lines.append(f"  {group:<24} {ms:>9.1f}  {kernel[:110]}")
        lines += where_the_wait_is(b, top)
    return "\n".join(lines)


def where_the_wait_is(b: Breakdown, top: int, steps: int = 1) -> list[str]:
    """The communication kernels with the most exposed time and the longest idle gaps (per step over `steps`)."""
    lines = [f"exposed communication, the {top} kernels with the most (ms per step, under no compute kernel):"]
    exposed = [(kernel, ms) for kernel, ms in b.exposed_by_kernel.most_common(top) if ms > 0]
    lines += [f"  {ms / steps:>9.1f}  {kernel[:110]}" for kernel, ms in exposed]
    lines.append(f"idle, the {top} longest gaps (ms, each with the kernel that ends it):")
    lines += [f"  {ms:>9.2f}  {kernel[:110]}" for ms, kernel in b.idle_gaps[:top]]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("traces", nargs="+", metavar="LABEL=TRACE", help="a label and a trace file")
    parser.add_argument("--top", type=int, default=3, help="kernels listed per group")
    args = parser.parse_args(argv)
    named = []
    for item in args.traces:
        label, _, path = item.partition("=")
        if not path:
            label, path = Path(item).name, item
        named.append((label, breakdown(load_events(Path(path)))))
    print(format_breakdowns(named, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
