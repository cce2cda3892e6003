"""Throughput report: step time over a late window, tokens/s, tokens/s/GPU, TFLOPS/GPU, MFU (naming the peak)
and days to train 1T tokens, for run directories or bare training logs (NeMo's progress lines included), plus a
PNG of loss and step time per run. The command line, `python -m launcher.report`, is launcher/report/__main__.py."""

from __future__ import annotations

import argparse
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from common.config import ModelConfig
from launcher.plan import table
from launcher.plan.formulas import model_flops_per_sample
from launcher.plan.hardware import GPUS, gpu_spec
from launcher.records import from_record
from launcher.report import figures, mlperf

TOKENS_TO_TRAIN = 1e12

# Names in log lines -> metrics.jsonl keys.
_KEYS = {
    "reduced_train_loss": "loss",
    "train_loss": "loss",
    "loss": "loss",
    "lm loss": "loss",
    "train_step_timing in s": "step_time_s",
    "step_time_s": "step_time_s",
    "global_step": "step",
    "step": "step",
    "consumed_samples": "consumed_samples",
    "lr": "lr",
    "grad_norm": "grad_norm",
    "val_loss": "val_loss",
    "tokens_per_s": "tokens_per_s",
    "trained_tokens_per_s": "trained_tokens_per_s",
    "tflops_per_gpu": "tflops_per_gpu",
    "mfu": "mfu",
}
_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf"
# key=value where keys may hold spaces ("train_step_timing in s"); pairs are separated by " | " or ", ".
_PAIR = re.compile(rf"([A-Za-z_][A-Za-z0-9_ ]*?)\s*=\s*({_NUMBER})(?![\w.])")


@dataclass(frozen=True)
class StepRecord:
    """One training step's numbers: a metrics.jsonl row (recipes' trainer) or a log's progress line. What a row or a
    line does not carry is None (older runs and NeMo's lines carry fewer)."""

    step: int
    step_time_s: float | None = None  # None on a validation-only row
    loss: float | None = None
    val_loss: float | None = None
    consumed_samples: float | None = None
    lr: float | None = None
    grad_norm: float | None = None
    tokens_per_s: float | None = None
    trained_tokens_per_s: float | None = None  # fine-tuning: the loss mask's tokens (no prompt, no padding) per s
    tflops_per_gpu: float | None = None
    mfu: float | None = None
    mfu_peak_flops: float | None = None  # the peak the trainer divided by (planned without a GPU type)
    peak_memory_gib: float | None = None


def parse_pairs(line: str) -> dict[str, float]:
    pairs = {}
    for chunk in re.split(r"\s*\|\s*|,\s+|\[|\]", line):
        match = _PAIR.search(chunk)
        if match:
            pairs[match.group(1).strip()] = float(match.group(2))
    return pairs


def parse_log(text: str) -> list[StepRecord]:
    """One record per training step from progress lines (ours or NeMo's). Progress bars redraw the same step
    with carriage returns, so the last line seen for a step wins."""
    by_step: dict[float, StepRecord] = {}
    order = 0
    for line in re.split(r"[\r\n]+", text):
        pairs = parse_pairs(line)
        record = {_KEYS[k]: v for k, v in pairs.items() if k in _KEYS}
        if "step_time_s" not in record:
            continue
        step = record.pop("step", None)
        if step is None:
            order += 1
            step = order
        by_step[step] = StepRecord(step=int(step), **record)
    return [by_step[k] for k in sorted(by_step)]


def read_metrics(path: Path) -> list[StepRecord]:
    records = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut short by a killed job
    return [from_record(StepRecord, r) for r in records if r.get("step") is not None]


@dataclass
class RunInfo:
    name: str
    global_batch_size: int | None
    seq_length: int | None
    num_gpus: int | None
    model_flops_per_sample: float | None
    peak_flops: float | None
    peak_label: str | None  # e.g. "h100 fp8"
    layout: str = "-"
    inputs: str = ""  # where the sizes and the peak came from: what to check when the MFU cannot be right


@dataclass
class RunReport:
    info: RunInfo
    steps: list[StepRecord]
    window: tuple[int, int]
    step_time_s: float
    loss: float | None
    val: list[tuple[int, float]] = field(default_factory=list)  # (step, validation loss)

    @property
    def tokens_per_s(self) -> float | None:
        if not (self.info.global_batch_size and self.info.seq_length):
            return None
        return self.info.global_batch_size * self.info.seq_length / self.step_time_s

    @property
    def trained_tokens_per_s(self) -> float | None:
        """Fine-tuning runs: tokens that count in the loss per second over the window (None where a step of the
        window did not log them: pretraining counts every token, tokens_per_s)."""
        lo, hi = self.window
        timed = [s for s in self.steps if s.step_time_s is not None][lo:hi]
        rates = [s.trained_tokens_per_s for s in timed]
        if not rates or any(r is None for r in rates):
            return None
        # Tokens over time: each step's count is its rate times its time.
        tokens = sum(float(r) * float(s.step_time_s) for r, s in zip(rates, timed) if r is not None and s.step_time_s)
        return tokens / sum(float(s.step_time_s) for s in timed if s.step_time_s)

    @property
    def tokens_per_s_per_gpu(self) -> float | None:
        return self.tokens_per_s / self.info.num_gpus if self.tokens_per_s and self.info.num_gpus else None

    @property
    def tflops_per_gpu(self) -> float | None:
        i = self.info
        if not (i.global_batch_size and i.model_flops_per_sample and i.num_gpus):
            return None
        return i.global_batch_size * i.model_flops_per_sample / self.step_time_s / i.num_gpus / 1e12

    @property
    def mfu(self) -> float | None:
        tflops = self.tflops_per_gpu
        return tflops * 1e12 / self.info.peak_flops if tflops and self.info.peak_flops else None

    @property
    def days_to_train_1t_tokens(self) -> float | None:
        return TOKENS_TO_TRAIN / self.tokens_per_s / 86400 if self.tokens_per_s else None


def late_window(n: int) -> tuple[int, int]:
    """Positions [start, end) to average: the first steps are slow (compilation, allocator warm-up), so the
    public recipes use iterations 35-44 of 50; generally 70%..90% of the run, or all but the first step of
    a short one."""
    if n >= 10:
        return int(n * 0.7), int(n * 0.9)
    return (1, n) if n >= 2 else (0, n)


def summarize(info: RunInfo, records: list[StepRecord], window: tuple[int, int] | None = None) -> RunReport:
    """Averages over `window`, positions in the timed steps (validation-only records carry no step time)."""
    steps = [r for r in records if r.step_time_s is not None]
    if not steps:
        raise ValueError(f"{info.name}: no step timings found (metrics.jsonl or 'train_step_timing in s=' lines)")
    start, end = window or late_window(len(steps))
    chosen = steps[start:end]
    if not chosen:
        raise ValueError(f"{info.name}: window {start}:{end} is empty ({len(steps)} steps logged)")
    step_time = sum(float(s.step_time_s) for s in chosen if s.step_time_s is not None) / len(chosen)
    losses = [s.loss for s in steps if s.loss is not None and not math.isnan(s.loss)]
    return RunReport(
        info,
        steps,
        (start, start + len(chosen)),
        step_time,
        losses[-1] if losses else None,
        val=[(r.step, r.val_loss) for r in records if r.val_loss is not None],
    )


# --------------------------------------------------------------------------- inputs
@dataclass(frozen=True)
class PlanSizes:
    """What the report takes from a plan.json, read leniently: a plan.json of an older run, or one handed in with
    --plan, may lack the optional keys."""

    tp: int
    pp: int
    cp: int
    global_batch_size: int
    seq_length: int
    num_gpus: int
    model_flops_per_sample: float
    vp: int | None = None
    gpu_type: str | None = None
    peak_flops_per_gpu: float | None = None
    peak_flops_kind: str = ""  # "" where an old plan.json lacks it


def _info_from_plan(name: str, plan: PlanSizes, steps: list[StepRecord]) -> RunInfo:
    peak, label = plan.peak_flops_per_gpu, None
    if peak:
        label = f"{plan.gpu_type} {plan.peak_flops_kind}"
    else:  # planned without knowing the GPU: the trainer logs the peak it divided by
        logged = [s.mfu_peak_flops for s in steps if s.mfu_peak_flops]
        if logged:
            peak, label = float(logged[-1]), f"{plan.peak_flops_kind} (as logged)".strip()
    layout = table.layout(plan.tp, plan.pp, plan.cp, plan.vp)
    return RunInfo(
        name,
        plan.global_batch_size,
        plan.seq_length,
        plan.num_gpus,
        plan.model_flops_per_sample,
        peak,
        label,
        layout,
        inputs=f"the plan's gpu_type ({plan.gpu_type}) and sizes",
    )


def _log_files(run_dir: Path) -> list[Path]:
    logs = run_dir / "logs"
    # Oldest first (a resubmitted run has several job logs); the last line seen for a step wins.
    found = [*logs.glob("training*.log"), *logs.glob("training_*.out")] if logs.is_dir() else []
    return sorted(found, key=lambda p: p.stat().st_mtime)


def read_plan_file(path: Path) -> PlanSizes:
    """A plan.json's sizes; ValueError naming the file when it cannot be read (missing, cut short, not a plan)."""
    try:
        plan = json.loads(path.read_text())
    except OSError as err:
        raise ValueError(f"{path}: cannot be read ({err.strerror}); pass the plan.json of a run directory") from None
    except ValueError as err:
        raise ValueError(
            f"{path} is not valid JSON ({err}; a file cut short?): write the run directory again with the "
            "python main.py command that made it (training resumes from its checkpoints)"
        ) from None
    if not isinstance(plan, dict):
        raise ValueError(
            f"{path} is not a plan (a JSON object of the plan's keys); pass the plan.json of a run directory"
        )
    return from_record(PlanSizes, plan)


def load(path: Path, args: argparse.Namespace) -> tuple[RunInfo, list[StepRecord]]:
    """A run directory (plan.json + metrics.jsonl, else its logs) or a bare log file (sizes from flags)."""
    if path.is_dir():
        plan_path = path / "plan.json"
        if not plan_path.exists():
            raise ValueError(f"{path}: no plan.json (not a run directory); pass a log file with --gbs/--seq/--gpus")
        steps: list[StepRecord] = []
        if (path / "metrics.jsonl").exists():
            steps = read_metrics(path / "metrics.jsonl")
        if not steps:
            text = "\n".join(p.read_text(errors="replace") for p in _log_files(path))
            steps = parse_log(text)
        return _info_from_plan(path.name, read_plan_file(plan_path), steps), steps
    if not path.exists():
        raise ValueError(f"{path}: no such file or directory")
    text = path.read_text(errors="replace")
    steps = parse_log(text)
    for key, value in mlperf.sizes_from_mllog(text).items():  # an MLPerf log states its own sizes
        if not getattr(args, key):
            setattr(args, key, value)
    if args.plan:
        return _info_from_plan(path.name, read_plan_file(Path(args.plan)), steps), steps
    missing = [flag for flag, value in (("--gbs", args.gbs), ("--seq", args.seq), ("--gpus", args.gpus)) if not value]
    if missing:
        raise ValueError(f"{path}: a bare log needs {', '.join(missing)} (or --plan RUN_DIR/plan.json)")
    flops = None
    if args.model:
        flops = model_flops_per_sample(_model_config(args.model), args.seq)
    try:
        spec = gpu_spec(args.gpu)
    except KeyError:
        raise ValueError(f"--gpu {args.gpu}: unknown GPU type; use one of {', '.join(GPUS)}") from None
    peak = spec.fp8_peak_flops if args.peak == "fp8" else spec.bf16_peak_flops
    return RunInfo(
        path.name,
        args.gbs,
        args.seq,
        args.gpus,
        flops,
        peak,
        f"{spec.name} {args.peak}",
        inputs="--gpu, --peak, --gpus, --gbs, --seq and --model",
    ), steps


def _model_config(model: str) -> ModelConfig:
    from launcher.config.compose import compose

    name = model if "/" in model else f"llama31/{model}"
    try:
        return compose([f"training={name}"]).training.model
    except Exception as err:  # Hydra's own error types; the message names the options
        raise ValueError(f"--model {model}: {str(err).splitlines()[0]}") from err


# --------------------------------------------------------------------------- output
def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def format_table(reports: Sequence[RunReport]) -> str:
    header = [
        "run",
        "GPUs",
        "layout",
        "GBS",
        "seq",
        "window",
        "step s",
        "tokens/s",
        "tokens/s/GPU",
        "TFLOPS/GPU",
        "MFU",
        "MFU peak",
        "days/1T tok",
        "loss",
    ]
    # Fine-tuning runs add the tokens that count in the loss (tokens/s counts padding and prompts too).
    trained = any(r.trained_tokens_per_s is not None for r in reports)
    if trained:
        header.insert(9, "trained tok/s")
    rows = [header]
    for r in reports:
        i = r.info
        peak = f"{i.peak_label} {i.peak_flops / 1e12:.0f}T" if i.peak_flops else "-"
        rows.append(
            [
                i.name,
                _fmt(i.num_gpus, "d"),
                i.layout,
                _fmt(i.global_batch_size, "d"),
                _fmt(i.seq_length, "d"),
                f"{r.window[0]}-{r.window[1] - 1} of {len(r.steps)}",
                f"{r.step_time_s:.3f}",
                _fmt(r.tokens_per_s, ",.0f"),
                _fmt(r.tokens_per_s_per_gpu, ",.0f"),
                _fmt(r.tflops_per_gpu, ".1f"),
                _fmt(None if r.mfu is None else 100 * r.mfu, ".1f", "%!" if _impossible(r) else "%"),
                peak,
                _fmt(r.days_to_train_1t_tokens, ",.1f"),
                _fmt(r.loss, ".4f"),
            ]
        )
        if trained:
            rows[-1].insert(9, _fmt(r.trained_tokens_per_s, ",.0f"))
    widths = [max(len(row[c]) for row in rows) for c in range(len(header))]
    left = {0, 2, 12 if trained else 11}
    lines = [
        "  ".join(cell.ljust(w) if c in left else cell.rjust(w) for c, (cell, w) in enumerate(zip(row, widths)))
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _impossible(r: RunReport) -> bool:
    return r.mfu is not None and r.mfu > 1


def mfu_warnings(reports: Sequence[RunReport]) -> list[str]:
    """One line per run whose MFU is above 100%, which no run reaches: a size or the peak is wrong."""
    return [
        f"warning: {r.info.name}: MFU {100 * mfu:.1f}% cannot be right (above 100%): it divides by the "
        f"{r.info.peak_label} peak, {peak / 1e12:.0f} TFLOP/s per GPU, for "
        f"{r.info.num_gpus} GPUs, GBS {r.info.global_batch_size}, seq {r.info.seq_length}; check "
        f"{r.info.inputs or 'the sizes and the GPU type'}"
        for r in reports
        if (mfu := r.mfu) is not None and mfu > 1 and (peak := r.info.peak_flops)
    ]


def default_plot_path(paths: Sequence[Path]) -> Path:
    """Where report.png goes without --plot: into the run directory for one run, beside the first bare log
    (never into the current directory, which may be the repository), else ./report.png."""
    logs = [path for path in paths if not path.is_dir()]
    if logs:
        return logs[0].with_name(f"{logs[0].stem}_report.png")
    return paths[0] / "report.png" if len(paths) == 1 else Path("report.png")


def plot(reports: Sequence[RunReport], path: Path) -> Path:
    plt = figures.pyplot()
    fig, (ax_loss, ax_time) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    for r in reports:
        steps = [s.step for s in r.steps]
        with_loss = [(s.step, s.loss) for s in r.steps if s.loss is not None]
        if with_loss:
            (line,) = ax_loss.plot(*zip(*with_loss), label=r.info.name)
            if r.val:
                ax_loss.plot(*zip(*r.val), "o", color=line.get_color(), label=f"{r.info.name} (validation)")
        ax_time.plot(steps, [s.step_time_s for s in r.steps], label=r.info.name)
        lo, hi = r.window
        ax_time.axvspan(steps[lo], steps[hi - 1], alpha=0.08)  # the averaged window
    ax_loss.set_ylabel("training loss")
    ax_time.set_ylabel("step time (s)")
    ax_time.set_xlabel("step")
    for ax in (ax_loss, ax_time):
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    return figures.save(fig, path)
