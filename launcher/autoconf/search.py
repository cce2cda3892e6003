"""parallelism=auto: every layout of the search space (conf/parallelism/auto.yaml) on the job's GPUs, validated by
the plan itself (its layout checks: TP/PP/CP splits, batch divisibility, the memory estimate against the GPU), ranked by
the step-time model (launcher/autoconf/steptime.py). The pick becomes the run's layout as the overrides of an
explicit layout (a named one when it has exactly these settings, else parallelism=custom), so the run directory is
exactly what that command line gives; main.py prints it.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

import yaml

from common.config import Config
from common.plan import Plan
from common.typed import changed
from launcher.autoconf.steptime import StepTime, predict
from launcher.config.compose import CONF_DIR, compose, hydra_state_kept
from launcher.plan.build import build_plan
from launcher.plan.checks import ranges
from launcher.plan.validate import LAYOUT_CHECKS, validate
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
SEARCH_KEYS = ("tp", "pp", "cp", "vp", "micro_batch_size", "recompute", "asymmetric_pipeline")
MAX_GPUS = 65536  # how far the smallest-GPU-count search looks
TIE = 0.005  # predicted step times in the same bin of this width (relative to the best) rank by memory


@dataclass(frozen=True)
class Layout:
    tp: int
    pp: int
    cp: int
    vp: int | None
    micro_batch_size: int
    recompute: str | None
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
    cfg: dict[str, Any]
    time: StepTime


@dataclass
class Search:
    cfg: dict[str, Any]
    num_gpus: int
    tried: int
    ranked: list[Ranked]
    dropped: Counter  # drop reason -> layouts (each counted under the first problem the plan names)


def is_auto(cfg: Mapping[str, Any]) -> bool:
    return cfg["parallelism"].get("auto") is not None


# --------------------------------------------------------------------------- the search space
def search_space(auto: Mapping[str, Any]) -> dict[str, list]:
    """parallelism.auto.search, checked (each size's range is declared in the schema, checked before the search);
    vp 1 means no interleaving (null)."""
    space = auto.get("search") or {}
    problems = [
        f"parallelism.auto.search.{k} must be a non-empty list"
        for k in SEARCH_KEYS
        if not isinstance(space.get(k), list) or not space[k]
    ]
    if problems:
        raise PlanError(problems)
    space = {k: list(space[k]) for k in SEARCH_KEYS}
    space["vp"] = list(dict.fromkeys(None if v in (None, 1) else v for v in space["vp"]))
    bad = [v for v in space["recompute"] if v not in (None, "selective", "full")]
    if bad:
        problems.append(f"parallelism.auto.search.recompute: {bad}; use null, selective or full")
    if problems:
        raise PlanError(problems)
    return space


def candidate_layouts(space: Mapping[str, list], num_gpus: int) -> Iterator[Layout]:
    """Every combination whose model-parallel size divides the GPUs (DP is the quotient); VP and the asymmetric
    split exist only with a pipeline."""
    for tp, pp, cp in itertools.product(space["tp"], space["pp"], space["cp"]):
        if num_gpus % (tp * pp * cp):
            continue
        vps = space["vp"] if pp > 1 else [None]
        asymmetric = sorted({bool(a) for a in space["asymmetric_pipeline"]}) if pp > 1 else [False]
        for vp, asym, mbs, recompute in itertools.product(
            vps, asymmetric, space["micro_batch_size"], space["recompute"]
        ):
            yield Layout(tp, pp, cp, vp, mbs, recompute, asym)


def _tuned(auto: Mapping[str, Any], hidden: int) -> Mapping[str, Any] | None:
    return next((t for t in auto.get("tuned") or [] if t["hidden_size"] == hidden), None)


def userbuffer_preset(auto: Mapping[str, Any], hidden: int, layout: Layout) -> str | None:
    tuned = _tuned(auto, hidden)
    if layout.tp == 1 or tuned is None:
        return None
    return next((u["preset"] for u in tuned.get("userbuffers") or [] if u["tp"] == layout.tp), None)


def layout_settings(auto: Mapping[str, Any], hidden: int, layout: Layout) -> dict[str, Any]:
    """The parallelism keys a layout sets (besides its name and userbuffer preset)."""
    tuned = _tuned(auto, hidden)
    defer = layout.pp > 1 and tuned is not None
    full = layout.recompute == "full"
    return dict(
        tp=layout.tp,
        pp=layout.pp,
        cp=layout.cp,
        vp=layout.vp,
        sequence_parallel=layout.tp > 1,
        tp_comm_overlap=layout.tp > 1,
        asymmetric_pipeline=layout.asymmetric,
        defer_embedding_wgrad_compute=defer,
        wgrad_deferral_limit=tuned["wgrad_deferral_limit"] if defer else 0,
        recompute_granularity=layout.recompute,
        recompute_method="uniform" if full else None,
        recompute_num_layers=1 if full else None,
    )


def candidate_config(cfg: Config, layout: Layout) -> Config:
    """The config the plan checks for a layout: the same keys parallelism=custom and the layout's overrides
    compose to (the userbuffer preset's contents aside, which planning does not read). The memory check is on:
    a layout the estimate says does not fit is never picked."""
    auto = cfg.parallelism.auto
    par = dataclasses.replace(
        cfg.parallelism,
        **layout_settings(auto, cfg.training.model.hidden_size, layout),
        name=layout.name(cfg.training.micro_batch_size),
        tp_comm_overlap_cfg=None,
        auto=None,
    )
    training = dataclasses.replace(cfg.training, micro_batch_size=layout.micro_batch_size)
    return dataclasses.replace(cfg, parallelism=par, training=training, memory_check=True)


# --------------------------------------------------------------------------- search and rank
_VALUE = re.compile(r"=[^\s,;:)\]]+")
_NUMBER = re.compile(r"\b\d[\d.,]*\d\b|\b\d\b")


def drop_reason(problem: str) -> str:
    """A plan problem without its numbers and without the suggested fix, so layouts failing alike count together."""
    text = re.split(r"; |: use ", problem, maxsplit=1)[0]
    return _NUMBER.sub("N", _VALUE.sub("=…", text))


def _gpu_type_problem(cfg: Mapping[str, Any], local_gpus: LocalGpus | None) -> str | None:
    cluster = cfg["cluster"]
    if cluster.get("gpu_type") or (cluster["name"] == "local" and local_gpus and local_gpus.gpu_type):
        return None
    return (
        "parallelism=auto needs the GPU type for its memory filter and step-time model: set cluster.gpu_type "
        "(h100, h200, ...)"
    )


def search(cfg: Mapping[str, Any], local_gpus: LocalGpus | None = None) -> Search:
    """Every candidate through the plan's layout checks; the ones that fit ranked by predicted step time."""
    out_of_range = ranges.problems(cfg)  # once here: every layout tried is checked with ranges_checked=True
    if out_of_range:
        raise PlanError(out_of_range)
    auto = cfg["parallelism"]["auto"]
    space = search_space(auto)
    problem = _gpu_type_problem(cfg, local_gpus)
    if problem:
        raise PlanError([problem])
    num_gpus = cfg["parallelism"]["num_gpus"]
    headroom = float(auto.get("memory_headroom") or 0.0)
    ranked, dropped, tried = [], Counter(), 0
    for layout in candidate_layouts(space, num_gpus):
        tried += 1
        candidate = candidate_config(cfg, layout)
        try:
            plan = validate(candidate, local_gpus, checks=LAYOUT_CHECKS, ranges_checked=True).plan
        except PlanError as err:
            dropped[drop_reason(err.problems[0])] += 1
            continue
        if plan.est_memory_gib_per_gpu > (1 - headroom) * gpu_spec(plan.gpu_type).memory_gib:
            dropped[f"estimated memory within parallelism.auto.memory_headroom={headroom:g} of the GPU's"] += 1
            continue
        ranked.append(Ranked(layout, plan, candidate, predict(candidate, plan.to_json_dict(), auto["step_time"])))
    return Search(cfg, num_gpus, tried, rank(ranked), dropped)


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


def _first_fitting(
    cfg: Mapping[str, Any], space: Mapping[str, list], num_gpus: int, local_gpus: LocalGpus | None
) -> bool:
    cfg = changed(cfg, {"parallelism.num_gpus": num_gpus})
    for layout in candidate_layouts(space, num_gpus):
        try:
            validate(candidate_config(cfg, layout), local_gpus, checks=LAYOUT_CHECKS, ranges_checked=True)
            return True
        except PlanError:
            continue
    return False


def smallest_fitting_gpus(cfg: Mapping[str, Any], local_gpus: LocalGpus | None = None) -> int | None:
    """The smallest GPU count (up to MAX_GPUS) with a layout that fits. GPU counts are model-parallel sizes of the
    search space times data-parallel sizes that divide the global batch. On this machine (cluster=local) the
    question is asked of nodes of its GPUs (a Slurm cluster of such machines)."""
    space = search_space(cfg["parallelism"]["auto"])
    gbs = cfg["training"]["global_batch_size"]
    data_parallel = [d for d in range(1, gbs + 1) if gbs % d == 0]
    counts = sorted(
        {
            tp * pp * cp * d
            for tp, pp, cp in itertools.product(space["tp"], space["pp"], space["cp"])
            for d in data_parallel
            if tp * pp * cp * d <= MAX_GPUS
        }
    )
    if cfg["cluster"]["name"] == "local":
        local = local_gpus or LocalGpus(0, None, ())
        per_node = cfg["cluster"].get("gpus_per_node") or local.count or 8
        gpu_type = cfg["cluster"].get("gpu_type") or local.gpu_type
        cfg = changed(cfg, {"cluster.name": "nodes", "cluster.gpus_per_node": per_node, "cluster.gpu_type": gpu_type})
    return next((n for n in counts if _first_fitting(cfg, space, n, local_gpus)), None)


def no_fit_message(result: Search, local_gpus: LocalGpus | None) -> str:
    cfg = result.cfg
    gpu = cfg["cluster"].get("gpu_type") or (local_gpus.gpu_type if local_gpus else None)
    reasons = result.dropped.most_common()
    why = f"the most common problem: {reasons[0][0]} ({reasons[0][1]:,} layouts)" if reasons else "none to try"
    smallest = smallest_fitting_gpus(cfg, local_gpus)
    fix = (
        f"the smallest GPU count with one that fits is {smallest}: set parallelism.num_gpus={smallest}"
        if smallest
        else f"no GPU count up to {MAX_GPUS} has one; widen parallelism.auto.search"
    )
    if smallest and cfg["cluster"]["name"] == "local":
        fix = (
            f"on nodes of this machine's GPUs the smallest GPU count with one that fits is {smallest}: "
            f"cluster=bcm parallelism.num_gpus={smallest}"
        )
    return (
        f"parallelism=auto: no layout of {cfg['training']['name']} ({cfg['dtype']['name']}) fits "
        f"parallelism.num_gpus={result.num_gpus} {gpu} GPUs ({result.tried:,} tried; {why}); {fix}"
    )


# --------------------------------------------------------------------------- the table
def format_search(result: Search, top: int, pick: int | None = None) -> str:
    cfg = result.cfg
    ranked = result.ranked
    first = ranked[0].plan if ranked else None
    where = f"{first.gpus_per_node} per node, " if first and cfg["cluster"]["name"] != "local" else ""
    gpu = first.gpu_type if first else cfg["cluster"].get("gpu_type")
    lines = [
        f"auto-configurator: {cfg['training']['name']} {cfg['dtype']['name']} on {result.num_gpus} {gpu} GPUs "
        f"({where}GBS {cfg['training']['global_batch_size']}, seq {cfg['training']['seq_length']})",
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


def layout_overrides(ranked: Ranked, cfg: Mapping[str, Any]) -> list[str]:
    """The layout as explicit overrides of parallelism=custom."""
    layout, auto = ranked.layout, cfg["parallelism"]["auto"]
    hidden = cfg["training"]["model"]["hidden_size"]
    settings = layout_settings(auto, hidden, layout)
    out = [
        "parallelism=custom",
        f"parallelism.name={layout.name(cfg['training']['micro_batch_size'])}",
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
    if layout.micro_batch_size != cfg["training"]["micro_batch_size"]:
        out.append(f"training.micro_batch_size={layout.micro_batch_size}")
    return out


def _named_layouts(settings: Mapping[str, Any]) -> list[str]:
    """Named layouts (conf/parallelism/*.yaml) with the same TP/PP/CP/VP/asymmetric split."""
    common = _shared_defaults()
    names = []
    for path in sorted((CONF_DIR / "parallelism").glob("*.yaml")):
        if path.stem.startswith("_") or path.stem in ("auto", "custom"):
            continue
        raw = {**common, **(yaml.safe_load(path.read_text()) or {})}
        if all(raw.get(k) == settings[k] for k in ("tp", "pp", "cp", "vp", "asymmetric_pipeline")):
            names.append(path.stem)
    return names


def _without(par: Mapping[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in par.items() if k not in keys}


def pick_overrides(user: Sequence[str], ranked: Ranked, cfg: Mapping[str, Any]) -> tuple[list[str], dict[str, Any]]:
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
    if layout.micro_batch_size == cfg["training"]["micro_batch_size"] and not layout.recompute:
        for name in _named_layouts(final["parallelism"]):
            named = [*kept, f"parallelism={name}", f"parallelism.num_gpus={ranked.plan.num_gpus}"]
            candidate = compose(named)
            if _without(candidate["parallelism"], "name") == _without(final["parallelism"], "name"):
                return named, candidate
    return custom, final


def resolve(
    user_overrides: Sequence[str], cfg: Mapping[str, Any], local_gpus: LocalGpus | None = None, say: Say | None = print
) -> dict[str, Any]:
    """The config of the picked layout, exactly as its command line composes. Raises PlanError (one line each)."""
    problems = decided_problems(user_overrides)
    if problems:
        raise PlanError(problems)
    auto = cfg["parallelism"]["auto"]
    result = search(cfg, local_gpus)
    if not result.ranked:
        raise PlanError([no_fit_message(result, local_gpus)])
    pick = auto.get("pick", 0)
    if not isinstance(pick, int) or isinstance(pick, bool) or not 0 <= pick < len(result.ranked):
        raise PlanError(
            [
                f"parallelism.auto.pick={pick!r}: {len(result.ranked)} layouts fit; use a rank in "
                f"0..{len(result.ranked) - 1}"
            ]
        )
    chosen = result.ranked[pick]
    with hydra_state_kept():
        overrides, final = pick_overrides(user_overrides, chosen, cfg)
    _check_same_plan(build_plan(final, local_gpus), chosen.plan)
    if say:
        say(format_search(result, int(auto.get("top", 10)), pick))
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
