"""The four-GPU measurements: seq 8192, MBS 1, mock data, the current defaults, each group one
bench/bench_train.py run of its cases on 4 GPUs. `--list` plans every case of a group on 4 H200 (no GPU: a bad
override fails here in seconds) and prints its memory estimate, whether it fits an H100 too, and the estimated wall
time (start-up plus the step-time model's step on H200 x steps; a guess until measured).

Groups (python bench/four_gpu.py GROUP --out OUT [bench_train.py arguments, e.g. --repeat, --previous]):

  table-8b        the full 8B, GBS 32, 12 steps (last 6 averaged): bf16 DP4 (the search's pick on 4 H200), fp8 DP4,
                  bf16 CP2 x DP2 (the model's default layout): the "best layout" row.          3 runs, ~7 min, H200
  table-70b       70B shape, 10 layers, TP4 + SP + userbuffer overlap (the preset parallelism=auto gives TP4 at hidden
                  8192: h8192_tp4), bf16 and fp8, GBS 32.                                     2 runs, ~5 min
  table-405b      405B shape, 4 layers, TP4 + SP + overlap (preset h16384_tp4_cp2, as the search sets TP4 at hidden
                  16384), bf16 and fp8, GBS 32. ~82 GiB a GPU: H200 only.                     2 runs, ~6 min, H200
  param-gather    FP8 param gather at DP4 (the plan leaves it off below 8 optimizer shards where bf16 weights fit):
                  the 8B shape with 16 layers, fp8, DP4, GBS 16, 8 steps (last 3), off (default) / on, 2 runs
                  each.                                                                        4 runs, ~6 min
  ub-fp8          the TP4 userbuffer settings for FP8 (h8192_tp4 is tuned for bf16): 70B, 10 layers, fp8, TP4, GBS 8,
                  8 steps: the preset (default) / Transformer Engine's defaults / the preset with bf16 reduce-scatter
                  buffers (dtype.userbuffers_fp8_buf=false), 2 runs each.                     6 runs, ~8 min
  graphs-overlap  CUDA graphs with TP comm overlap: 70B, 10 layers, bf16, TP4 + overlap, GBS 8, 8 steps: graphs none
                  (default) / per layer / full iteration, 2 runs each.                        6 runs, ~9 min
  rank-order      data-parallel-last rank order: 70B, 10 layers, bf16, PP2 VP5 x DP2 (the only 4-GPU split of the
                  proxy where the order changes which ranks pair), GBS 8, 8 steps: pp_last (default) / dp_last,
                  2 runs each. ~89 GiB a GPU: H200 only.                                      4 runs, ~6 min

`--profile` (bench_train.py's) traces step 4 of every run, outside the timing window, and prints the
bench/bench_kernels.py --trace command per run: the account of a row that misses its target (communication and
what of it is exposed, the FP8 casts, each kernel class against its ceiling).

The minutes are `--list`'s estimates. The variant groups (all but table-*) run their cases --repeat times
interleaved, with a table of medians against the first case, the defaults (a larger --repeat and --previous of the
first command's --json adds runs without repeating the ones done). Every command below fits a 10-minute device call:
--budget-s starts no run that would end past it (the longest run so far as the guess), --timeout-s kills a hung
one (the last run starts by budget minus a run and ends by the timeout after), and the --json file is written after
every run; a command that lists runs "not run within --budget-s" goes on with the same command plus --previous
OUT/GROUP.json of the cut one (bring the file back into the checkout first where the machine went back: the run
directories are gone then):

    python bench/four_gpu.py table-8b --list         # (no GPU) the cases, planned on 4 H200, with estimates
    python bench/four_gpu.py table-8b --out OUT      # = --results OUT/table-8b --json OUT/table-8b.json
    python bench/four_gpu.py table-70b --out OUT
    python bench/four_gpu.py table-405b --out OUT
    python bench/four_gpu.py param-gather --out OUT
    python bench/four_gpu.py ub-fp8 --out OUT
    python bench/four_gpu.py graphs-overlap --out OUT
    python bench/four_gpu.py rank-order --out OUT
    # cut short: the same command, another --out, and --previous OLD/GROUP.json

Each group's --budget-s and --timeout-s are set here (table-*: 450 s and 210 / 230 / 290 s, param-gather 460 and
180 s, the others 470 and 180 s; given on the command line they win).

table-8b and table-405b need H200 (the full 8B at DP4 and the 405B proxy at TP4 estimate 86-93 and 82 GiB a GPU);
the other groups fit H100 as well. The auto-configurator's 4-GPU ranking is bench/autoconf_cases.py --gpus 4; the GPU
tests at 4 GPUs are tests/recipes/test_gpu_training.py's 4-GPU layouts.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
import sys

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_train  # noqa: E402

GPUS = 4
# TP4 with sequence parallelism and userbuffer overlap, as parallelism=auto writes the layout (search.layout_overrides)
# with the userbuffer preset it gives TP4 at the hidden size (parallelism.auto.tuned).
TP4 = "parallelism=custom parallelism.tp=4 parallelism.sequence_parallel=true parallelism.tp_comm_overlap=true"
UB = "+userbuffers@parallelism.tp_comm_overlap_cfg="
TP4_70B = f"training.model.num_layers=10 {TP4} {UB}h8192_tp4"
TP4_405B = f"training.model.num_layers=4 {TP4} {UB}h16384_tp4_cp2"
# PP2 VP5 x DP2 of the 70B proxy with the settings the search adds to a pipeline at hidden 8192.
PP2_70B = (
    "training.model.num_layers=10 parallelism=custom parallelism.pp=2 parallelism.vp=5 "
    "parallelism.defer_embedding_wgrad_compute=true parallelism.wgrad_deferral_limit=22"
)
PROXY_8B = "training.model.num_layers=16 parallelism=tp1"
# Wall time of a run besides its steps (processes, NCCL and userbuffer set-up, model build, the first steps' warm-up),
# for the estimates only: on 4 H200, unprofiled, the param-gather runs took 75 s beyond their steps (8B proxy), the
# ub-fp8, graphs-overlap and rank-order ones 72-76 s (70B proxy); the profiled 405B table runs 73 s.
STARTUP_S = {"llama31/8b": 75, "llama31/70b": 72, "llama31/405b": 75}


@dataclass(frozen=True)
class Group:
    model: str
    gbs: int
    steps: int
    window: int
    repeat: int
    cases: dict[str, str]  # name -> main.py overrides after the model; the first is what the others compare with
    h200_only: bool = False  # some case's estimate exceeds an H100
    budget_s: int = 470  # start no run that would end past this ...
    timeout_s: int = 180  # ... and kill a run after this: budget - a run + timeout stays under 10 minutes


GROUPS: dict[str, Group] = {
    "table-8b": Group(
        "llama31/8b",
        32,
        12,
        6,
        1,
        {
            "8b-bf16-dp4": "parallelism=tp1 dtype=bf16",
            "8b-fp8-dp4": "parallelism=tp1 dtype=fp8",
            "8b-bf16-cp2": "parallelism=tp1_cp2 dtype=bf16",
        },
        h200_only=True,
        budget_s=450,
        timeout_s=210,
    ),
    "table-70b": Group(
        "llama31/70b",
        32,
        12,
        6,
        1,
        {"70b10-bf16-tp4": f"{TP4_70B} dtype=bf16", "70b10-fp8-tp4": f"{TP4_70B} dtype=fp8"},
        budget_s=450,
        timeout_s=230,
    ),
    "table-405b": Group(
        "llama31/405b",
        32,
        12,
        6,
        1,
        {"405b4-bf16-tp4": f"{TP4_405B} dtype=bf16", "405b4-fp8-tp4": f"{TP4_405B} dtype=fp8"},
        h200_only=True,
        budget_s=450,
        timeout_s=290,
    ),
    "param-gather": Group(
        "llama31/8b",
        16,
        8,
        3,
        2,
        {
            "8b16-fp8-dp4": f"{PROXY_8B} dtype=fp8",
            "8b16-fp8-dp4-param-gather-on": f"{PROXY_8B} dtype=fp8 dtype.fp8_param_gather=true",
        },
        budget_s=460,  # its shortest run is estimated at 85 s: the last starts by 375 s, ends by 555 s
    ),
    "ub-fp8": Group(
        "llama31/70b",
        8,
        8,
        3,
        2,
        {
            "70b10-fp8-tp4": f"{TP4_70B} dtype=fp8",
            "70b10-fp8-tp4-te-ub": f"training.model.num_layers=10 {TP4} dtype=fp8",
            "70b10-fp8-tp4-bf16-buf": f"{TP4_70B} dtype=fp8 dtype.userbuffers_fp8_buf=false",
        },
    ),
    "graphs-overlap": Group(
        "llama31/70b",
        8,
        8,
        3,
        2,
        {
            "70b10-bf16-tp4": f"{TP4_70B} dtype=bf16",
            "70b10-bf16-tp4-graphs-per-layer": f"{TP4_70B} dtype=bf16 training.cuda_graphs=per_layer",
            "70b10-bf16-tp4-graphs-full": f"{TP4_70B} dtype=bf16 training.cuda_graphs=full_iteration",
        },
    ),
    "rank-order": Group(
        "llama31/70b",
        8,
        8,
        3,
        2,
        {
            "70b10-bf16-pp2-dp2": f"{PP2_70B} dtype=bf16",
            "70b10-bf16-pp2-dp2-dp-last": f"{PP2_70B} dtype=bf16 parallelism.rank_order=dp_last",
        },
        # 88.5 GiB estimated (launcher/plan/memory.py), 89.2 measured: H200 only
        h200_only=True,
    ),
}


def bench_argv(which: str, rest: list[str], out: str | None = None) -> list[str]:
    """bench_train.py's arguments: the group's model, batch, steps and cases, its default repeat, budget and timeout
    (the same option in `rest` wins: argparse keeps the last); `out`: --results OUT/GROUP --json OUT/GROUP.json."""
    group = GROUPS[which]
    argv = ["--model", group.model, "--gpus", str(GPUS), "--gbs", str(group.gbs), "--steps", str(group.steps)]
    argv += ["--window", str(group.window), "--repeat", str(group.repeat)]
    argv += ["--budget-s", str(group.budget_s), "--timeout-s", str(group.timeout_s)]
    if out:
        argv += ["--results", str(Path(out) / which), "--json", str(Path(out) / f"{which}.json")]
    for name, overrides in group.cases.items():
        argv += ["--case", name, overrides]
    return argv + rest


def case_config(group: Group, overrides: str, gpu: str = "h200"):
    """The config main.py composes for a case as bench_train.run_case gives it, on one node of 4 `gpu`s (bcm, so
    that no GPU need be visible)."""
    from launcher.config.compose import compose

    return compose(
        [
            f"training={group.model}",
            "cluster=bcm",
            f"cluster.gpu_type={gpu}",
            f"cluster.gpus_per_node={GPUS}",
            f"parallelism.num_gpus={GPUS}",
            f"training.global_batch_size={group.gbs}",
            f"training.train_steps={group.steps}",
            "training.val_interval=0",
            "training.checkpoint.interval=0",
            "training.checkpoint.save_at_end=false",
            "training.data.mock=true",
            *overrides.split(),
        ]
    )


@dataclass(frozen=True)
class Planned:
    name: str
    layout: str
    memory_gib: float
    fits_h100: bool
    step_s: float  # the step-time model's prediction on H200
    run_s: float  # estimated wall time of one run


def plan_cases(which: str) -> list[Planned]:
    """Every case of the group through the plan's checks on 4 H200 (a refused override raises PlanError), with its
    memory estimate and estimated run time."""
    from launcher.autoconf.steptime import predict
    from launcher.config.compose import compose
    from launcher.plan.hardware import gpu_spec
    from launcher.plan.table import layout
    from launcher.plan.validate import validate

    group = GROUPS[which]
    constants = compose(["parallelism=auto"]).parallelism.auto.step_time
    out = []
    for name, overrides in group.cases.items():
        cfg = case_config(group, overrides)
        plan = validate(cfg, None).plan
        step = predict(cfg, plan, constants).total_s
        out.append(
            Planned(
                name,
                f"{layout(plan.tp, plan.pp, plan.cp, plan.vp, plan.dp)} MBS{plan.micro_batch_size}",
                plan.est_memory_gib_per_gpu,
                plan.est_memory_gib_per_gpu <= gpu_spec("h100").memory_gib,
                step,
                STARTUP_S[group.model] + group.steps * step,
            )
        )
    return out


def estimate_s(which: str) -> float:
    """The whole group's estimated wall time (every case --repeat times)."""
    return GROUPS[which].repeat * sum(p.run_s for p in plan_cases(which))


def format_list(which: str) -> str:
    group = GROUPS[which]
    planned = plan_cases(which)
    lines = [
        f"{which}: {group.model}, {GPUS} GPUs, GBS {group.gbs}, {group.steps} steps (last {group.window} averaged), "
        f"{group.repeat} run(s) per case",
        f"{'case':<34} {'layout':<22} {'est GiB':>8} {'H100':>5} {'step s':>7} {'run s':>6}",
    ]
    for p in planned:
        lines.append(
            f"{p.name:<34} {p.layout:<22} {p.memory_gib:>8.1f} {'yes' if p.fits_h100 else 'no':>5} "
            f"{p.step_s:>7.2f} {p.run_s:>6.0f}"
        )
    total = group.repeat * sum(p.run_s for p in planned)
    lines.append(
        f"about {total / 60:.1f} min in all (H200 step-time model + {STARTUP_S[group.model]} s start-up a run)"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("which", choices=list(GROUPS))
    parser.add_argument("--list", action="store_true", help="plan the cases on 4 H200 and print them (no GPU)")
    parser.add_argument("--out", default=None, help="--results OUT/GROUP and --json OUT/GROUP.json")
    args, rest = parser.parse_known_args(argv)
    if args.list:
        print(format_list(args.which))
        return 0
    bench_train.main(bench_argv(args.which, rest, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
