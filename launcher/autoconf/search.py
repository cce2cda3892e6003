"""parallelism=auto: every layout of the search space (conf/parallelism/auto.yaml) on the job's GPUs, validated by
the plan itself (its layout checks: TP/PP/CP splits, batch divisibility, the memory estimate against the GPU), ranked by
the step-time model (launcher/autoconf/steptime.py). The pick becomes the run's layout as the overrides of an
explicit layout (a named one when it has exactly these settings, else parallelism=custom), so the run directory is
exactly what that command line gives; main.py prints it.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from dataclasses import dataclass, fields
from typing import Any, Callable, Iterator, Sequence

import yaml

from common.config import AutoConfig, Config, ParallelismConfig, Recompute, RecomputeMethod, SearchSpace, TunedSize
from common.plan import Plan
from common.typed import changed
from launcher.autoconf.steptime import StepTime, predict
from launcher.config.compose import CONF_DIR, compose, hydra_state_kept
from launcher.plan.build import build_plan
from launcher.plan.checks import ranges
from launcher.plan.validate import LAYOUT_CHECKS, validate, with_hf_architecture
from launcher.plan.errors import PlanError
from launcher.plan.hardware import LocalGpus, gpu_spec
from launcher.plan.table import layout as layout_label

Say = Callable[[str], None]

# What the auto-configurator decides, with the search key that restricts it instead.
DECIDED = {
    "parallelism.tp": "tp",
    "parallelism.pp": "pp",
    "parallelism.cp": "cp",
    "parallelism.vp": "vp",
    "parallelism.asymmetric_pipeline": "asymmetric_pipeline",
    "training.micro_batch_size": "micro_batch_size",
    "parallelism.recompute_granularity": "recompute",
    "parallelism.recompute_method": "recompute",
    "parallelism.recompute_num_layers": "recompute",
    "parallelism.sequence_parallel": None,
    "parallelism.tp_comm_overlap": None,
    "parallelism.tp_comm_overlap_cfg": None,
    "parallelism.defer_embedding_wgrad_compute": None,
    "parallelism.wgrad_deferral_limit": None,
    "parallelism.name": None,
}
MAX_GPUS = 65536  # how far the smallest-GPU-count search looks
TIE = 0.005  # predicted step times in the same bin of this width (relative to the best) rank by memory


@dataclass(frozen=True)
class Layout:
    tp: int
    pp: int
    cp: int
    vp: int | None
    micro_batch_size: int
    recompute: Recompute | None
    asymmetric: bool

    def sort_key(self) -> tuple:
        """Ties in predicted time break the same way every time."""
        return (self.tp, self.pp, self.cp, self.vp or 0, self.micro_batch_size, self.recompute or "", self.asymmetric)

    def name(self, default_micro_batch_size: int) -> str:
        """Run-name part in the named layouts' style (tp4_pp4_cp2_vp5_asym), plus _mbs<N> and _recompute_full
        where they differ from the training config's."""
        parts = [f"tp{self.tp}"] + [f"{k}{v}" for k, v in (("pp", self.pp), ("cp", self.cp)) if v > 1]
        parts += [f"vp{self.vp}"] if self.vp else []
        parts += ["asym"] if self.asymmetric else []
        parts += [f"mbs{self.micro_batch_size}"] if self.micro_batch_size != default_micro_batch_size else []
        parts += [f"recompute_{self.recompute}"] if self.recompute else []
        return "_".join(parts)


@dataclass
class Ranked:
    layout: Layout
    plan: Plan
    cfg: Config
    time: StepTime


@dataclass
class Search:
    cfg: Config
    num_gpus: int
    tried: int
    ranked: list[Ranked]
    dropped: Counter[str]  # drop reason -> layouts (each counted under the first problem the plan names)


def auto_settings(cfg: Config) -> AutoConfig:
    """parallelism.auto of a config that searches (is_auto)."""
    auto = cfg.parallelism.auto
    if auto is None:
        raise ValueError("parallelism.auto is null: the config names a layout, there is nothing to search")
    return auto


# --------------------------------------------------------------------------- the search space
def search_space(auto: AutoConfig) -> SearchSpace:
    """parallelism.auto.search, checked (each size's range is declared in the schema, checked before the search);
    vp 1 means no interleaving (null)."""
    space = auto.search
    problems = [
        f"parallelism.auto.search.{f.name} must be a non-empty list"
        for f in fields(space)
        if not getattr(space, f.name)
    ]
    if problems:
        raise PlanError(problems)
    return changed(space, {"vp": list(dict.fromkeys(None if v in (None, 1) else v for v in space.vp))})


def candidate_layouts(space: SearchSpace, num_gpus: int) -> Iterator[Layout]:
    """Every combination whose model-parallel size divides the GPUs (DP is the quotient); VP and the asymmetric
    split exist only with a pipeline."""
    for tp, pp, cp in itertools.product(space.tp, space.pp, space.cp):
        if num_gpus % (tp * pp * cp):
            continue
        vps = space.vp if pp > 1 else [None]
        asymmetric = sorted(set(space.asymmetric_pipeline)) if pp > 1 else [False]
        for vp, asym, mbs, recompute in itertools.product(vps, asymmetric, space.micro_batch_size, space.recompute):
            yield Layout(tp, pp, cp, vp, mbs, recompute, asym)


def _tuned(auto: AutoConfig, hidden: int) -> TunedSize | None:
    return next((t for t in auto.tuned if t.hidden_size == hidden), None)


def userbuffer_preset(auto: AutoConfig, hidden: int, layout: Layout) -> str | None:
    tuned = _tuned(auto, hidden)
    if layout.tp == 1 or tuned is None:
        return None
    return next((u.preset for u in tuned.userbuffers if u.tp == layout.tp), None)


def layout_settings(auto: AutoConfig, hidden: int, layout: Layout) -> dict[str, Any]:
    """The parallelism keys a layout sets (besides its name and userbuffer preset), by their names in
    ParallelismConfig."""
    tuned = _tuned(auto, hidden)
    defer = layout.pp > 1 and tuned is not None
    full = layout.recompute == Recompute.full
    return dict(
        tp=layout.tp,
        pp=layout.pp,
        cp=layout.cp,
        vp=layout.vp,
        sequence_parallel=layout.tp > 1,
        tp_comm_overlap=layout.tp > 1,
        asymmetric_pipeline=layout.asymmetric,
        defer_embedding_wgrad_compute=defer,
        wgrad_deferral_limit=tuned.wgrad_deferral_limit if defer and tuned is not None else 0,
        recompute_granularity=layout.recompute,
        recompute_method=RecomputeMethod.uniform if full else None,
        recompute_num_layers=1 if full else None,
    )


def candidate_config(cfg: Config, layout: Layout) -> Config:
    """The config the plan checks for a layout: the same keys parallelism=custom and the layout's overrides
    compose to (the userbuffer preset's contents aside, which planning does not read). The memory check is on:
    a layout the estimate says does not fit is never picked."""
    settings = layout_settings(auto_settings(cfg), cfg.training.model.hidden_size, layout)
    return changed(
        cfg,
        {
            **{f"parallelism.{key}": value for key, value in settings.items()},
            "parallelism.name": layout.name(cfg.training.micro_batch_size),
            "parallelism.tp_comm_overlap_cfg": None,
            "parallelism.auto": None,
            "training.micro_batch_size": layout.micro_batch_size,
            "memory_check": True,
        },
    )


# --------------------------------------------------------------------------- search and rank
_VALUE = re.compile(r"=[^\s,;:)\]]+")
_NUMBER = re.compile(r"\b\d[\d.,]*\d\b|\b\d\b")


def drop_reason(problem: str) -> str:
    """A plan problem without its numbers and without the suggested fix, so layouts failing alike count together."""
    text = re.split(r"; |: use ", problem, maxsplit=1)[0]
    return _NUMBER.sub("N", _VALUE.sub("=…", text))


def _gpu_type_problem(cfg: Config, local_gpus: LocalGpus | None) -> str | None:
    cluster = cfg.cluster
    if cluster.gpu_type or (cluster.runs_here and local_gpus and local_gpus.gpu_type):
        return None
    return (
        "parallelism=auto needs the GPU type for its memory filter and step-time model: set cluster.gpu_type "
        "(h100, h200, ...)"
    )


def search(cfg: Config, local_gpus: LocalGpus | None = None) -> Search:
    """Every candidate through the plan's layout checks; the ones that fit ranked by predicted step time."""
    cfg = with_hf_architecture(cfg)  # the step-time model reads the architecture too
    out_of_range = ranges.problems(cfg)  # once here: every layout tried is checked with ranges_checked=True
    if out_of_range:
        raise PlanError(out_of_range)
    auto = auto_settings(cfg)
    space = search_space(auto)
    problem = _gpu_type_problem(cfg, local_gpus)
    if problem:
        raise PlanError([problem])
    num_gpus = cfg.parallelism.num_gpus
    headroom = auto.memory_headroom
    ranked: list[Ranked] = []
    dropped: Counter[str] = Counter()
    tried = 0
    for layout in candidate_layouts(space, num_gpus):
        tried += 1
        candidate = candidate_config(cfg, layout)
        try:
            plan = validate(candidate, local_gpus, checks=LAYOUT_CHECKS, ranges_checked=True).plan
        except PlanError as err:
            dropped[drop_reason(err.problems[0])] += 1
            continue
        if plan.est_memory_gib_per_gpu > (1 - headroom) * _gpu_memory_gib(plan):
            dropped[f"estimated memory within parallelism.auto.memory_headroom={headroom:g} of the GPU's"] += 1
            continue
        ranked.append(Ranked(layout, plan, candidate, predict(candidate, plan, auto.step_time)))
    return Search(cfg, num_gpus, tried, rank(ranked), dropped)


def _gpu_memory_gib(plan: Plan) -> float:
    if plan.gpu_type is None:  # _gpu_type_problem refused the search before any plan
        raise ValueError("parallelism=auto planned a layout without a GPU type")
    return gpu_spec(plan.gpu_type).memory_gib


def rank(candidates: list[Ranked]) -> list[Ranked]:
    """Fastest predicted first. Step times are compared in bins of TIE x the best one (differences that small are
    far below the model's accuracy); within a bin the lower memory estimate goes first, then the layout order, so
    the ranking never depends on the order of the search."""
    if not candidates:
        return []
    best = min(r.time.total_s for r in candidates)
    return sorted(
        candidates,
        key=lambda r: (round(r.time.total_s / best / TIE), r.plan.est_memory_gib_per_gpu, r.layout.sort_key()),
    )


def _first_fitting(cfg: Config, space: SearchSpace, num_gpus: int, local_gpus: LocalGpus | None) -> bool:
    cfg = changed(cfg, {"parallelism.num_gpus": num_gpus})
    for layout in candidate_layouts(space, num_gpus):
        try:
            validate(candidate_config(cfg, layout), local_gpus, checks=LAYOUT_CHECKS, ranges_checked=True)
            return True
        except PlanError:
            continue
    return False


def smallest_fitting_gpus(cfg: Config, local_gpus: LocalGpus | None = None) -> int | None:
    """The smallest GPU count (up to MAX_GPUS) with a layout that fits. GPU counts are model-parallel sizes of the
    search space times data-parallel sizes that divide the global batch. On this machine (cluster=local) the
    question is asked of nodes of its GPUs (a Slurm cluster of such machines)."""
    space = search_space(auto_settings(cfg))
    gbs = cfg.training.global_batch_size
    data_parallel = [d for d in range(1, gbs + 1) if gbs % d == 0]
    counts = sorted(
        {
            tp * pp * cp * d
            for tp, pp, cp in itertools.product(space.tp, space.pp, space.cp)
            for d in data_parallel
            if tp * pp * cp * d <= MAX_GPUS
        }
    )
    if cfg.cluster.runs_here:
        local = local_gpus or LocalGpus(0, None, ())
        per_node = cfg.cluster.gpus_per_node or local.count or 8
        gpu_type = cfg.cluster.gpu_type or local.gpu_type
        cfg = changed(cfg, {"cluster.name": "nodes", "cluster.gpus_per_node": per_node, "cluster.gpu_type": gpu_type})
    return next((n for n in counts if _first_fitting(cfg, space, n, local_gpus)), None)


def no_fit_message(result: Search, local_gpus: LocalGpus | None) -> str:
    cfg = result.cfg
    gpu = cfg.cluster.gpu_type or (local_gpus.gpu_type if local_gpus else None)
    reasons = result.dropped.most_common()
    why = f"the most common problem: {reasons[0][0]} ({reasons[0][1]:,} layouts)" if reasons else "none to try"
    smallest = smallest_fitting_gpus(cfg, local_gpus)
    fix = (
        f"the smallest GPU count with one that fits is {smallest}: set parallelism.num_gpus={smallest}"
        if smallest
        else f"no GPU count up to {MAX_GPUS} has one; widen parallelism.auto.search"
    )
    if smallest and cfg.cluster.runs_here:
        fix = (
            f"on nodes of this machine's GPUs the smallest GPU count with one that fits is {smallest}: "
            f"cluster=bcm parallelism.num_gpus={smallest}"
        )
    return (
        f"parallelism=auto: no layout of {cfg.training.name} ({cfg.dtype.name}) fits "
        f"parallelism.num_gpus={result.num_gpus} {gpu} GPUs ({result.tried:,} tried; {why}); {fix}"
    )


# --------------------------------------------------------------------------- the table
def format_search(result: Search, top: int, pick: int | None = None) -> str:
    cfg = result.cfg
    ranked = result.ranked
    first = ranked[0].plan if ranked else None
    where = f"{first.gpus_per_node} per node, " if first and not cfg.cluster.runs_here else ""
    gpu = first.gpu_type if first else cfg.cluster.gpu_type
    lines = [
        f"auto-configurator: {cfg.training.name} {cfg.dtype.name} on {result.num_gpus} {gpu} GPUs "
        f"({where}GBS {cfg.training.global_batch_size}, seq {cfg.training.seq_length})",
        f"  {result.tried:,} layouts tried: {len(ranked):,} fit, {sum(result.dropped.values()):,} dropped "
        "(each under the first problem the plan names):",
    ]
    for reason, count in result.dropped.most_common():
        lines.append(f"  {count:>7,}  {reason}")
    header = [
        "rank",
        "layout",
        "MBS",
        "recompute",
        "mem GiB",
        "step s",
        "compute",
        "bubble",
        "comm",
        "other",
        "tok/s/GPU",
        "MFU",
    ]
    rows = [header]
    shown = list(range(min(top, len(ranked))))
    if pick is not None and pick not in shown and pick < len(ranked):
        shown.append(pick)
    for i in shown:
        r = ranked[i]
        p, t = r.plan, r.time
        label = layout_label(p.tp, p.pp, p.cp, p.vp, p.dp) + (" asym" if p.asymmetric_pipeline else "")
        rows.append(
            [
                f"{i}{'*' if i == pick else ''}",
                label,
                str(p.micro_batch_size),
                r.layout.recompute or "-",
                f"{p.est_memory_gib_per_gpu:.1f}",
                f"{t.total_s:.3f}",
                f"{t.compute_s:.3f}",
                f"{t.bubble_s:.3f}",
                f"{t.comm_s:.3f}",
                f"{t.other_s:.3f}",
                f"{t.tokens_per_s_per_gpu:,.0f}",
                f"{t.mfu * 100:.1f}%",
            ]
        )
    widths = [max(len(row[c]) for row in rows) for c in range(len(header))]
    left = {1, 3}
    for row in rows:
        lines.append(
            "  "
            + "  ".join(cell.ljust(w) if c in left else cell.rjust(w) for c, (cell, w) in enumerate(zip(row, widths)))
        )
    peak = first.peak_flops_kind if first else "bf16"
    lines.append(
        f"  predicted: step s = compute (slowest pipeline stage) + bubble + exposed comm + other (optimizer, "
        f"overheads); MFU against the {peak} peak; * = the pick (parallelism.auto.pick)"
    )
    return "\n".join(lines)


# --------------------------------------------------------------------------- the pick as a command line
def _key(override: str) -> str:
    return override.lstrip("+~").split("=", 1)[0]


def decided_problems(overrides: Sequence[str]) -> list[str]:
    problems = []
    for override in overrides:
        key = _key(override)
        if key in DECIDED:
            search_key = DECIDED[key]
            fix = (
                f"restrict the search with parallelism.auto.search.{search_key}=[...]"
                if search_key
                else "it follows from the layout"
            )
            problems.append(f"{key} is decided by parallelism=auto; drop {override} ({fix}) or name a layout")
    return problems


def _shared_defaults() -> dict[str, Any]:
    """What every layout starts from (conf/parallelism/_common.yaml)."""
    return yaml.safe_load((CONF_DIR / "parallelism" / "_common.yaml").read_text())


def layout_overrides(ranked: Ranked, cfg: Config) -> list[str]:
    """The layout as explicit overrides of parallelism=custom."""
    layout, auto = ranked.layout, auto_settings(cfg)
    hidden = cfg.training.model.hidden_size
    settings = layout_settings(auto, hidden, layout)
    out = [
        "parallelism=custom",
        f"parallelism.name={layout.name(cfg.training.micro_batch_size)}",
        f"parallelism.num_gpus={ranked.plan.num_gpus}",
    ]
    always = ("tp", "pp", "cp")
    common = _shared_defaults()
    for key, value in settings.items():
        if key in always or value != common.get(key):
            out.append(f"parallelism.{key}={'null' if value is None else str(value).lower()}")
    preset = userbuffer_preset(auto, hidden, layout)
    if preset:
        out.append(f"+userbuffers@parallelism.tp_comm_overlap_cfg={preset}")
    if layout.micro_batch_size != cfg.training.micro_batch_size:
        out.append(f"training.micro_batch_size={layout.micro_batch_size}")
    return out


def _named_layouts(par: ParallelismConfig) -> list[str]:
    """Named layouts (conf/parallelism/*.yaml) with the same TP/PP/CP/VP/asymmetric split."""
    common = _shared_defaults()
    names = []
    for path in sorted((CONF_DIR / "parallelism").glob("*.yaml")):
        if path.stem.startswith("_") or path.stem in ("auto", "custom"):
            continue
        raw = {**common, **(yaml.safe_load(path.read_text()) or {})}  # the layout's file, not a resolved config
        if all(raw.get(k) == getattr(par, k) for k in ("tp", "pp", "cp", "vp", "asymmetric_pipeline")):
            names.append(path.stem)
    return names


def _same_but_name(a: ParallelismConfig, b: ParallelismConfig) -> bool:
    return changed(a, {"name": b.name}) == b


def pick_overrides(user: Sequence[str], ranked: Ranked, cfg: Config) -> tuple[list[str], Config]:
    """(the command line of the picked layout, its composed config): the user's overrides without parallelism=auto
    and its own keys, then the layout's; a named layout with exactly these settings is used by its name."""
    kept = [
        o
        for o in user
        if _key(o) not in ("parallelism", "parallelism.num_gpus") and not _key(o).startswith("parallelism.auto.")
    ]
    custom = [*kept, *layout_overrides(ranked, cfg)]
    final = compose(custom)
    layout = ranked.layout
    if layout.micro_batch_size == cfg.training.micro_batch_size and not layout.recompute:
        for name in _named_layouts(final.parallelism):
            named = [*kept, f"parallelism={name}", f"parallelism.num_gpus={ranked.plan.num_gpus}"]
            candidate = compose(named)
            if _same_but_name(candidate.parallelism, final.parallelism):
                return named, candidate
    return custom, final


def resolve(
    user_overrides: Sequence[str], cfg: Config, local_gpus: LocalGpus | None = None, say: Say | None = print
) -> Config:
    """The config of the picked layout, exactly as its command line composes. Raises PlanError (one line each)."""
    problems = decided_problems(user_overrides)
    if problems:
        raise PlanError(problems)
    auto = auto_settings(cfg)
    result = search(cfg, local_gpus)
    if not result.ranked:
        raise PlanError([no_fit_message(result, local_gpus)])
    pick = auto.pick
    if not 0 <= pick < len(result.ranked):
        raise PlanError(
            [
                f"parallelism.auto.pick={pick!r}: {len(result.ranked)} layouts fit; use a rank in "
                f"0..{len(result.ranked) - 1}"
            ]
        )
    chosen = result.ranked[pick]
    with hydra_state_kept():
        overrides, final = pick_overrides(user_overrides, chosen, cfg)
    _check_same_plan(build_plan(with_hf_architecture(final), local_gpus), chosen.plan)
    if say:
        say(format_search(result, auto.top, pick))
        p = chosen.plan
        say(
            f"pick {pick}: {layout_label(p.tp, p.pp, p.cp, p.vp, p.dp)} MBS {p.micro_batch_size}; the same run "
            "without the search:"
        )
        say("  python main.py " + " ".join(_quoted(o) for o in overrides))
    return final


def _quoted(override: str) -> str:
    return f"'{override}'" if re.search(r"[\s\[\]{}()*?$'\"]", override) else override


def _check_same_plan(final: Plan, searched: Plan) -> None:
    """The composed config must plan exactly as the candidate the search validated and ranked."""
    a, b = final.to_json_dict(), searched.to_json_dict()
    differ = sorted(k for k in a if k != "command" and a[k] != b[k])
    if differ:
        raise RuntimeError(
            f"parallelism=auto: the picked layout's command line plans differently from the searched "
            f"candidate in {differ}"
        )
