"""Step-time model: predicts one training step's time for a planned layout, to rank layouts before anything runs.

    step = compute (slowest pipeline stage x microbatches) + pipeline bubble + exposed communication + optimizer
           + per-step and per-microbatch overheads

- compute, per decoder layer and microbatch on one GPU: each GEMM's FLOPs at the dtype's peak times an efficiency
  that falls for narrow GEMMs (TP and CP make them narrower), the attention core at its own efficiency (slower per
  token with CP, which splits it into chunks), and memory-bound elementwise work at the HBM bandwidth; the output
  layer and loss on the last stage; full recomputation adds a forward.
- pipeline bubble: (pp - 1) / vp of the slowest stage's time per microbatch (the interleaved 1F1B schedule).
- exposed communication: TP all-gathers/reduce-scatters (a fraction of the decoder layers' with userbuffer overlap,
  plus GEMMs slowed by the SMs the overlap takes; the embedding's and the output layer's all of them), CP's KV
  exchange, pipeline sends, and the data-parallel gradient reduce-scatter and parameter all-gather beyond what the
  last (first) microbatch's backward (forward) hides; NVLink inside a node, the network between nodes.
- optimizer: the distributed optimizer's shard read and written at the HBM bandwidth.

Every constant is data (conf/parallelism/auto.yaml: parallelism.auto.step_time) fit to measured runs
(conf/perf/measured.yaml's `fit` rows; its `held_out` rows check the fit: bench/fit_steptime.py fits and prints
both); `python -m launcher.autoconf.steptime` prints the model against them. Left out: kernel-level detail (wave
quantisation, attention backends), CPU-bound stalls, network contention between jobs, stragglers, FP8 scaling
recipes, and anything that changes numerics.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

import yaml

from common.config import Config, Exposed, GpuBandwidth, ModelConfig, ParallelismConfig, Recompute, StepTimeConstants
from common.plan import Plan
from common.typed import from_plain
from launcher.autoconf.perfdata import (
    MEASURED,
    SPLITS,
    measured_rows,
    measured_tokens_per_s_per_gpu,
    pending_rows,
    row_overrides,
    row_split,
)
from launcher.config.compose import CONF_DIR, compose
from launcher.plan.build import build_plan
from launcher.plan.formulas import stage_parameters
from launcher.plan.hardware import GpuSpec, gpu_spec

GB = 1e9
ACT_BYTES = 2  # bf16 activations
# TP collectives of a [tokens, hidden] activation outside the decoder layers, per microbatch, forward + backward
# (predict): the embedding's, and the output layer's with and without sequence parallel.
EMBEDDING_TP_COLLECTIVES = 2
OUTPUT_TP_COLLECTIVES = {True: 3, False: 2}


@dataclass
class StepTime:
    """Predicted seconds per step and where they go (compute + bubble + comm + other = total)."""

    total_s: float
    compute_s: float
    bubble_s: float
    comm_s: float
    other_s: float
    comm_parts: dict[str, float] = field(default_factory=dict)  # tp, cp, pp, dp
    tokens_per_s_per_gpu: float = 0.0
    mfu: float = 0.0  # against the plan's peak (bf16 or fp8)


def _gemm_efficiency(c: StepTimeConstants, fp8: bool, dims: tuple[float, ...]) -> float:
    """Large-GEMM efficiency of the dtype, lowered when the narrowest dimension is small."""
    narrowest = min(dims)
    large = c.gemm_efficiency.fp8 if fp8 else c.gemm_efficiency.bf16
    return large * narrowest / (narrowest + c.gemm_half_dim)


def _gemm_seconds(c: StepTimeConstants, peak: float, fp8: bool, m: float, n: float, k: float) -> float:
    """Forward + both backward GEMMs (3 x 2mnk FLOPs)."""
    return 3 * 2 * m * n * k / (peak * _gemm_efficiency(c, fp8, (m, n, k)))


def _link_bytes_per_s(c: StepTimeConstants, gpu: GpuBandwidth, within_node: bool) -> float:
    """What a collective moves per second and GPU: NVLink within a node, the GPU's NIC between nodes."""
    return (gpu.nvlink_gb_s if within_node else gpu.network_gb_s) * c.link_efficiency * GB


def _exposed(share: Exposed, overlapped: bool) -> float:
    return share.overlap if overlapped else share.no_overlap


def _hbm_bytes_per_s(c: StepTimeConstants, gpu: GpuBandwidth) -> float:
    """What memory-bound kernels move per second."""
    return gpu.hbm_gb_s * GB * c.memory_efficiency


def linear_shapes(model: ModelConfig, tp: int, tokens: float) -> dict[str, tuple[float, float, float]]:
    """(m, n, k) of each decoder-layer linear layer's forward GEMM on one GPU: tokens x outputs x inputs, the
    column-parallel layers' outputs (qkv, fc1: gate and up) and the row-parallel layers' inputs (proj, fc2) split over
    TP. The two backward GEMMs multiply the same three sizes (bench/bench_kernels.py times each)."""
    h, ffn = model.hidden_size, model.ffn_hidden_size
    q = model.num_attention_heads * model.kv_channels
    kv = 2 * model.num_query_groups * model.kv_channels
    return {
        "qkv": (tokens, (q + kv) / tp, h),
        "proj": (tokens, h, q / tp),
        "fc1": (tokens, 2 * ffn / tp, h),
        "fc2": (tokens, h, ffn / tp),
    }


def elementwise_bytes(
    c: StepTimeConstants, model: ModelConfig, tp: int, sequence_parallel: bool, tokens: float
) -> float:
    """Bytes the memory-bound kernels of one decoder layer (norms, residuals, RoPE, SwiGLU) move for `tokens`, forward
    + backward; sequence parallel shards the hidden-size part over TP."""
    eb = c.elementwise_bytes
    sp_shard = tp if sequence_parallel or tp == 1 else 1
    return tokens * (eb.hidden * model.hidden_size / sp_shard + eb.ffn * model.ffn_hidden_size / tp)


def loss_bytes(c: StepTimeConstants, tokens: float, padded_vocab: int, tp: int) -> float:
    """Bytes the fused cross-entropy moves over one GPU's logits, forward + backward."""
    return tokens * padded_vocab / tp * c.loss_bytes_per_logit


@dataclass
class _Layer:
    compute_s: float  # GEMMs, attention, elementwise (+ recomputation)
    comm_s: float  # exposed TP and CP communication
    tp_s: float
    cp_s: float


def _decoder_layer(
    c: StepTimeConstants,
    gpu: GpuBandwidth,
    spec: GpuSpec,
    model: ModelConfig,
    plan: Plan,
    par: ParallelismConfig,
    tokens: float,
) -> _Layer:
    """One decoder layer, one microbatch, forward + backward, on one GPU."""
    tp, cp, fp8 = plan.tp, plan.cp, bool(plan.fp8)
    h = model.hidden_size
    q = model.num_attention_heads * model.kv_channels
    kv = 2 * model.num_query_groups * model.kv_channels
    peak = spec.fp8_peak_flops if fp8 and spec.fp8_peak_flops else spec.bf16_peak_flops  # the plan refuses FP8
    gemm_s = sum(_gemm_seconds(c, peak, fp8, *g) for g in linear_shapes(model, tp, tokens).values())
    # Attention core: the model-FLOPs formula counts 12 x heads-dim x seq per token (fwd + bwd) over the full
    # square; the causal kernel computes half of it. CP splits it into 2 x cp chunks per rank.
    attn_flops = 0.5 * 12 * (q / tp) * plan.seq_length * tokens
    attn_s = attn_flops / (spec.bf16_peak_flops * c.attention_efficiency)
    attn_s *= 1 + c.cp_attention_penalty * math.log2(cp)
    if plan.fp8_dot_product_attention:
        attn_s /= c.fp8_attention_speedup
    elem_s = elementwise_bytes(c, model, tp, plan.sequence_parallel, tokens) / _hbm_bytes_per_s(c, gpu)
    if fp8:
        elem_s *= c.fp8_elementwise_factor
    tp_s = 0.0
    if tp > 1:
        volume = c.tp_collectives_per_layer * (tp - 1) / tp * tokens * h * ACT_BYTES
        raw = volume / _link_bytes_per_s(c, gpu, True)
        overlap = bool(plan.tp_comm_overlap)
        tp_s = raw * _exposed(c.tp_exposed, overlap)
        # Ring collectives (and userbuffer ring exchange) take tp - 1 synchronised steps, each with a fixed cost.
        tp_s += c.tp_collectives_per_layer * (tp - 1) * c.tp_ring_step_s
        if overlap:  # the communication kernels take SMs from the GEMMs they overlap
            gemm_s *= 1 + c.tp_overlap_gemm_slowdown
    cp_s = 0.0
    if cp > 1:
        # Ring exchange of this rank's K and V, forward, and K, V, dK, dV backward.
        raw = 3 * (cp - 1) * tokens * kv / tp * ACT_BYTES
        cp_s = c.cp_exposed * raw / _link_bytes_per_s(c, gpu, plan.tp * cp <= plan.gpus_per_node)
    compute = gemm_s + attn_s + elem_s
    recompute = par.recompute_granularity
    if recompute == Recompute.full:  # one more forward of the layer (a third of forward + backward)
        compute += compute / 3
        tp_s += tp_s / 3
    elif recompute == Recompute.selective:  # the attention core's forward
        compute += attn_s / 3
    return _Layer(compute, tp_s + cp_s, tp_s, cp_s)


def _output_layer_seconds(
    c: StepTimeConstants, gpu: GpuBandwidth, spec: GpuSpec, model: ModelConfig, plan: Plan, tokens: float
) -> float:
    """Output GEMM (megatron's own linear layer, bf16 even with FP8) and the fused cross-entropy over the logits."""
    vocab, tp = plan.padded_vocab_size, plan.tp
    gemm = _gemm_seconds(c, spec.bf16_peak_flops, False, tokens, vocab / tp, model.hidden_size)
    loss = loss_bytes(c, tokens, vocab, tp) / _hbm_bytes_per_s(c, gpu)
    return gemm + loss


def _tp_collective_seconds(
    c: StepTimeConstants, gpu: GpuBandwidth, model: ModelConfig, plan: Plan, tokens: float
) -> float:
    """One TP all-gather or reduce-scatter of a [tokens, hidden] activation outside the decoder layers, all of it
    exposed: the embedding and the output layer are Megatron's own layers, which userbuffer overlap leaves out."""
    tp = plan.tp
    if tp == 1:
        return 0.0
    volume = (tp - 1) / tp * tokens * model.hidden_size * ACT_BYTES
    return volume / _link_bytes_per_s(c, gpu, True) + (tp - 1) * c.tp_ring_step_s


def _stage_parameters(model: ModelConfig, plan: Plan) -> float:
    """Parameters on the most loaded pipeline stage, per TP rank."""
    stages = plan.layers_per_pipeline_stage
    last = len(stages) - 1
    return (
        max(stage_parameters(model, n, s == 0, s == last, plan.padded_vocab_size) for s, n in enumerate(stages))
        / plan.tp
    )


def predict(cfg: Config, plan: Plan, constants: StepTimeConstants) -> StepTime:
    """Step time of a validated plan with its resolved config; the plan must name its GPU type."""
    c = constants
    model, par = cfg.training.model, cfg.parallelism
    if plan.gpu_type is None:
        raise ValueError("the step-time model needs the plan's gpu_type (cluster.gpu_type)")
    spec = gpu_spec(plan.gpu_type)
    gpu = c.gpus[spec.name]
    tp, pp, cp, dp = plan.tp, plan.pp, plan.cp, plan.dp
    chunks = plan.vp or 1
    micro = plan.num_microbatches
    per_node = plan.gpus_per_node
    tokens = plan.micro_batch_size * plan.seq_length / cp

    layer = _decoder_layer(c, gpu, spec, model, plan, par, tokens)
    output = _output_layer_seconds(c, gpu, spec, model, plan, tokens)
    pp_s = 0.0
    if pp > 1:  # activations forward and their gradients backward, once per model chunk
        sp_shard = tp if plan.sequence_parallel else 1
        raw = 2 * chunks * tokens * model.hidden_size / sp_shard * ACT_BYTES
        raw /= _link_bytes_per_s(c, gpu, tp * cp * dp < per_node)
        overlapped = par.overlap_p2p_comm and plan.vp is not None
        pp_s = raw * _exposed(c.pp_exposed, overlapped)
    # TP outside the decoder layers, counted as the layers' (tp_collectives_per_layer) are. With sequence parallel
    # the embedding reduce-scatters its output forward and all-gathers its gradient backward (2, on the first stage);
    # the output layer all-gathers its input forward, gathers it again for its weight gradient and reduce-scatters
    # its input's gradient backward (3, on the last stage). Without it, one all-reduce each (a pair's bytes): the
    # embedding's output forward, the output layer's input gradient backward.
    collective_s = _tp_collective_seconds(c, gpu, model, plan, tokens)
    output_collectives = OUTPUT_TP_COLLECTIVES[bool(plan.sequence_parallel)]
    stages = []  # (compute, comm, decoder layers, TP communication outside them) per microbatch
    for s, n in enumerate(plan.layers_per_pipeline_stage):
        compute = n * layer.compute_s + (output if s == pp - 1 else 0.0)
        edge = collective_s * (EMBEDDING_TP_COLLECTIVES * (s == 0) + output_collectives * (s == pp - 1))
        stages.append((compute, n * layer.comm_s + pp_s + edge, n, edge))
    compute_mb, comm_mb, slowest_layers, slowest_edge = max(stages, key=lambda st: st[0] + st[1])
    stage_mb = compute_mb + comm_mb
    bubble = (pp - 1) / chunks * stage_mb

    # Data parallel (over DP x CP ranks, which hold the same weights): gradient reduce-scatter after the last
    # microbatch's backward, parameter all-gather before the first forward, overlapped with them where enabled.
    params = _stage_parameters(model, plan)
    shards = dp * cp
    dp_s = 0.0
    distributed = par.use_distributed_optimizer
    if shards > 1:
        link = _link_bytes_per_s(c, gpu, tp * cp * dp <= per_node)
        grad_bytes = 4 if par.grad_reduce_in_fp32 else 2
        param_bytes = 1 if plan.fp8_param_gather else 2
        reduce_s = (shards - 1) / shards * params * grad_bytes / link * (1 if distributed else 2)
        gather_s = (shards - 1) / shards * params * param_bytes / link if distributed else 0.0
        back_window = 2 / 3 * stage_mb if par.overlap_grad_reduce else 0.0
        fwd_window = 1 / 3 * stage_mb if par.overlap_param_gather else 0.0
        floor = c.dp_exposed_min
        dp_s = max(floor * reduce_s, reduce_s - back_window) + max(floor * gather_s, gather_s - fwd_window)

    optimizer = params / (shards if distributed else 1) * c.optimizer_bytes_per_param
    optimizer /= _hbm_bytes_per_s(c, gpu)
    overheads = c.step_overhead_s + c.microbatch_overhead_s * micro * chunks

    compute = micro * compute_mb
    comm_parts = {
        "tp": micro * (slowest_layers * layer.tp_s + slowest_edge),
        "cp": micro * slowest_layers * layer.cp_s,
        "pp": micro * pp_s,
        "dp": dp_s,
    }
    comm = micro * comm_mb + dp_s
    total = compute + bubble + comm + optimizer + overheads
    tokens_per_gpu = plan.global_batch_size * plan.seq_length / total / plan.num_gpus
    peak = plan.peak_flops_per_gpu or spec.bf16_peak_flops
    mfu = plan.global_batch_size * plan.model_flops_per_sample / total / plan.num_gpus / peak
    return StepTime(total, compute, bubble, comm, optimizer + overheads, comm_parts, tokens_per_gpu, mfu)


# --------------------------------------------------------------------------- constants and measured rows
def default_constants() -> StepTimeConstants:
    """parallelism.auto.step_time as conf/parallelism/auto.yaml sets it (for runs planned without parallelism=auto)."""
    layout = yaml.safe_load((CONF_DIR / "parallelism" / "auto.yaml").read_text())
    return from_plain(StepTimeConstants, layout["auto"]["step_time"], path="parallelism.auto.step_time")


@dataclass
class Check:
    name: str
    split: str  # measured.yaml's split: fit or held_out
    measured: float  # tokens/s/GPU
    predicted: StepTime
    plan: Plan
    cfg: Config
    overrides: list[str] = field(default_factory=list)

    @property
    def error(self) -> float:
        return self.predicted.tokens_per_s_per_gpu / self.measured - 1

    @property
    def measured_step_s(self) -> float:
        return self.plan.global_batch_size * self.plan.seq_length / self.measured / self.plan.num_gpus

    def again(self, constants: StepTimeConstants) -> Check:
        """The same row predicted with other constants: planning a row is what takes the time, so a fit plans each
        row once and predicts it many times."""
        return replace(self, predicted=predict(self.cfg, self.plan, constants))


def _predict_row(row: Mapping[str, Any], constants: StepTimeConstants) -> tuple[StepTime, Plan, Config]:
    cfg = compose(row_overrides(row))
    plan = build_plan(cfg)
    return predict(cfg, plan, constants), plan, cfg


def check_rows(constants: StepTimeConstants | None = None, rows: list[dict[str, Any]] | None = None) -> list[Check]:
    """The model against every measured row."""
    constants = constants if constants is not None else default_constants()
    out = []
    for row in rows if rows is not None else measured_rows():
        split = row_split(row)
        predicted, plan, cfg = _predict_row(row, constants)
        measured = measured_tokens_per_s_per_gpu(row, plan)
        out.append(Check(row["name"], split, measured, predicted, plan, cfg, list(row["overrides"])))
    return out


@dataclass
class SplitError:
    """How far the model is off on one split's rows: the mean and the largest |error| in tokens/s/GPU."""

    split: str
    rows: int
    mean: float
    largest: float


def split_errors(checks: Sequence[Check]) -> list[SplitError]:
    """Per split (in SPLITS order, those with rows)."""
    out = []
    for split in SPLITS:
        errors = [abs(c.error) for c in checks if c.split == split]
        if errors:
            out.append(SplitError(split, len(errors), sum(errors) / len(errors), max(errors)))
    return out


def format_checks(checks: list[Check], pending: Sequence[tuple[str, str, StepTime]] = ()) -> str:
    """Measured and predicted side by side (step time and tokens/s/GPU) with each row's split, the error per split,
    then the cases that await measurement."""
    w = max([44] + [len(c.name) for c in checks] + [len(name) for name, _, _ in pending])
    lines = [
        f"{'measured run':<{w}} {'split':<8} {'step s':>7} {'model':>7} {'tok/s/GPU':>9} {'model':>7} {'error':>7}   "
        "model: compute / bubble / comm (tp cp pp dp) / other, s per step"
    ]
    for c in checks:
        p = c.predicted
        parts = " ".join(f"{p.comm_parts[k]:.2f}" for k in ("tp", "cp", "pp", "dp"))
        lines.append(
            f"{c.name:<{w}} {c.split:<8} {c.measured_step_s:>7.3f} {p.total_s:>7.3f} {c.measured:>9,.0f} "
            f"{p.tokens_per_s_per_gpu:>7,.0f} {c.error * 100:>+6.1f}%   "
            f"{p.compute_s:.2f} / {p.bubble_s:.2f} / {p.comm_s:.2f} ({parts}) / {p.other_s:.2f}"
        )
    worst = max(abs(c.error) for c in checks)
    lines.append(f"{len(checks)} rows; largest error {worst * 100:.1f}%")
    for e in split_errors(checks):
        lines.append(f"{e.split}: {e.rows} rows; mean |error| {e.mean * 100:.1f}%, largest {e.largest * 100:.1f}%")
    if pending:
        lines.append(
            f"awaiting measurement ({len(pending)} cases in {MEASURED.name} `pending`: "
            "bench/gpu_autoconf_cases.sh prints their rows)"
        )
        for name, split, p in pending:
            lines.append(f"{name:<{w}} {split:<8} {'-':>7} {p.total_s:>7.3f} {'-':>9} {p.tokens_per_s_per_gpu:>7,.0f}")
    return "\n".join(lines)


def pending_predictions(
    constants: StepTimeConstants | None = None, rows: list[dict[str, Any]] | None = None
) -> list[tuple[str, str, StepTime]]:
    """(name, split, prediction) of each case awaiting measurement: its split is chosen before it is measured."""
    constants = constants if constants is not None else default_constants()
    pending = rows if rows is not None else pending_rows()
    return [(row["name"], row_split(row), _predict_row(row, constants)[0]) for row in pending]


def main() -> int:
    print(f"step-time model (parallelism.auto.step_time) against {MEASURED.relative_to(CONF_DIR.parent)}")
    print(format_checks(check_rows(), pending_predictions()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
