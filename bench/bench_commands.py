"""Wall time of everyday commands, each run in a fresh process, as a table (command, runs, median, min).

    python bench/bench_commands.py                          # this checkout, 3 timed runs of each command
    python bench/bench_commands.py --repo /tmp/before       # another checkout of the project (e.g. an older commit)
    python bench/bench_commands.py --runs 5 --only stack,dataprep-checks
    python bench/bench_commands.py --only help-main,help-export,help-import-fetch     # --help answers

Commands (run in the checkout under test, which is also put first on PYTHONPATH):
  stack               python -m recipes.stack (the table; its exit status 1 on a machine without the GPU stack
                      counts as a run)
  dataprep-checks     what `python -m data_prep run` does before its pipeline starts: the stack check and the
                      config load, on a tiny config made by `python main.py stages=[data_preparation] dry_run=true`
  dataprep-run        python -m data_prep run --force on that config: the whole stage for 200 short documents
  dry-run             python main.py dry_run=true
  sweep               python main.py -m training=llama31/8b cluster=bcm 'training.global_batch_size=16,...,160'
                      dry_run=true (10 points)
  help-*              --help of every tool a user runs: main.py, the report, data_prep, the stack table, the
                      export (llama31-export), the import's fetch and the hub's fetch (llama31-import)

Rounds are interleaved (every command once per round) so that a busy spell of the machine spreads over all rows;
one untimed warm-up round first (--warmup). The load average before and after is printed: on a shared machine,
compare medians taken under similar load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

HERE = Path(__file__).resolve().parent.parent
SWEEP = "training.global_batch_size=" + ",".join(str(16 * k) for k in range(1, 11))
# What cmd_run does before its pipeline starts (data_prep/cli.py), nothing more.
CHECKS = (
    "import sys\n"
    "from data_prep.cli import _check_stack, _load, _read, build_parser\n"
    "args = build_parser().parse_args(['run', '--config', sys.argv[1]])\n"
    "config = _read(args)\n"
    "_check_stack(config)\n"
    "_load(args, config, settings=True)\n"
)


@dataclass
class Command:
    name: str
    argv: list[str]
    ok: tuple[int, ...] = (0,)  # exit statuses that count as a run


# --help of each tool users run: it must answer before the tool loads torch, megatron or Hydra's config.
HELP = {
    "help-main": ["main.py", "--help"],
    "help-report": ["-m", "launcher.report", "--help"],
    "help-data-prep": ["-m", "data_prep", "--help"],
    "help-stack": ["-m", "recipes.stack", "--help"],
    "help-export": ["-m", "recipes.hf.exporter", "--help"],
    "help-import-fetch": ["-m", "recipes.hf.importer", "fetch", "--help"],
    "help-hub-fetch": ["-m", "recipes.hf.hub", "fetch", "--help"],
}


def commands(python: str, work: Path, config: Path) -> list[Command]:
    return [
        Command("stack", [python, "-m", "recipes.stack"], ok=(0, 1)),
        Command("dataprep-checks", [python, "-c", CHECKS, str(config)]),
        Command(
            "dataprep-run", [python, "-m", "data_prep", "run", "--config", str(config), "--force", "--no-progress"]
        ),
        Command("dry-run", [python, "main.py", "dry_run=true", f"results_dir={work / 'dry'}"]),
        Command(
            "sweep",
            [
                python,
                "main.py",
                "-m",
                "training=llama31/8b",
                "cluster=bcm",
                SWEEP,
                "dry_run=true",
                f"results_dir={work / 'sweep'}",
            ],
        ),
        *[Command(name, [python, *argv]) for name, argv in HELP.items()],
    ]


def run(argv: Sequence[str], repo: Path, ok: Sequence[int] = (0,)) -> float:
    """Seconds the command took; exits with its output when it failed."""
    # Python's default, bytecode written: the warm-up round leaves the caches a user's second command finds, also
    # where the shell sets PYTHONDONTWRITEBYTECODE (every run would compile the changed modules again).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"} | {"PYTHONPATH": str(repo)}
    start = time.perf_counter()
    result = subprocess.run(argv, cwd=repo, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if result.returncode not in ok:
        sys.exit(
            f"bench_commands: {' '.join(argv)} failed with exit status {result.returncode}:\n"
            f"{result.stdout[-2000:]}{result.stderr[-2000:]}"
        )
    return seconds


def tiny_config(python: str, repo: Path, work: Path) -> Path:
    """A run directory's config.yaml for the files dataset: 200 short documents and a sentencepiece tokenizer
    trained on them, made by the checkout under test."""
    corpus = work / "corpus.jsonl"
    words = [f"{stem}{k}" for stem in ("model", "token", "data", "layer", "batch", "step") for k in range(40)]
    corpus.write_text(
        "".join(
            json.dumps({"text": " ".join(words[(7 * i + 13 * k) % len(words)] for k in range(60))}) + "\n"
            for i in range(200)
        )
    )
    # byte fallback alone takes 256 pieces
    run(
        [
            python,
            "-m",
            "data_prep",
            "train-tokenizer",
            "--input",
            str(corpus),
            "--output",
            str(work / "tok" / "sp"),
            "--vocab-size",
            "400",
        ],
        repo,
    )
    run(
        [
            python,
            "main.py",
            "stages=[data_preparation]",
            "data_preparation=files",
            f"data_preparation.inputs=[{corpus}]",
            f"data_preparation.output_dir={work / 'out'}",
            "data_preparation.workers=1",
            "training.tokenizer.type=sentencepiece",
            f"training.tokenizer.path={work / 'tok' / 'sp.model'}",
            "dry_run=true",
            f"results_dir={work / 'runs'}",
            "run_name=tiny",
        ],
        repo,
    )
    return work / "runs" / "tiny" / "config.yaml"


def table(rows: list[tuple[str, list[float]]]) -> str:
    width = max([16, *(len(name) for name, _ in rows)])
    lines = [f"{'command':<{width}}  {'runs':>4}  {'median s':>8}  {'min s':>6}"]
    for name, seconds in rows:
        lines.append(f"{name:<{width}}  {len(seconds):>4}  {statistics.median(seconds):>8.2f}  {min(seconds):>6.2f}")
    return "\n".join(lines)


def describe(repo: Path) -> str:
    head = subprocess.run(["git", "-C", str(repo), "log", "-1", "--format=%h %s"], capture_output=True, text=True)
    return head.stdout.strip() or str(repo)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", type=Path, default=HERE, help="checkout to run the commands in (default: this one)")
    parser.add_argument("--runs", type=int, default=3, help="timed runs of each command")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    parser.add_argument("--only", help="comma-separated command names (default: all)")
    parser.add_argument("--python", default=sys.executable, help="interpreter to run them with")
    args = parser.parse_args(argv)
    repo = args.repo.resolve()
    names = [c.name for c in commands(args.python, Path(), Path())]
    wanted = args.only.split(",") if args.only else names
    unknown = [name for name in wanted if name not in names]
    if unknown:
        parser.error(f"--only: unknown command {unknown[0]}; choose from {', '.join(names)}")
    with tempfile.TemporaryDirectory(prefix="bench-commands-") as tmp:
        work = Path(tmp)
        chosen = [c for c in commands(args.python, work, tiny_config(args.python, repo, work)) if c.name in wanted]
        print(
            f"repo: {repo} ({describe(repo)}); python: {args.python}; load average before: {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        seconds: dict[str, list[float]] = {c.name: [] for c in chosen}
        for round_ in range(args.warmup + args.runs):
            for c in chosen:
                took = run(c.argv, repo, c.ok)
                if round_ >= args.warmup:
                    seconds[c.name].append(took)
    print(table(list(seconds.items())))
    print(f"load average after: {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
