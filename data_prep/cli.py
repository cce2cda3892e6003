"""Command line: `python -m data_prep {run,download,list,verify,train-tokenizer} ...` (see --help)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
from typing import Any, Iterator, Optional, Sequence

from common.config import DataPreparationConfig
from data_prep.config import ConfigFile, load_config_file, settings_and_shards
from data_prep.shards import ConfigError, Shard, list_shards, parse_numbers
from data_prep.tokenizer import TokenizerError

EPILOG = """\
examples:
  python -m data_prep run --config results/<run>/config.yaml              # every shard (finished ones skipped)
  python -m data_prep run --config config.yaml --shard 3                 # one shard (Slurm: $SLURM_ARRAY_TASK_ID)
  python -m data_prep run --config config.yaml data_preparation.workers=8
  python -m data_prep download --config config.yaml                      # fetch only (login node with network)
  python -m data_prep list --config config.yaml [--prefixes|--json]
  python -m data_prep verify --config config.yaml
  python -m data_prep train-tokenizer --input corpus.jsonl --output tok/sp --vocab-size 32000
exit status: 0 when every selected shard is done, 1 when any failed (after the others ran), 2 for a bad
config, tokenizer or command line.
"""


class Stopped(KeyboardInterrupt):
    """The first SIGINT (Ctrl-C) or SIGTERM (a scheduler's stop): raised where the main thread is."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def stopped_by_signals() -> Iterator[None]:
    """Ctrl-C and SIGTERM, however many, however close together: the first raises Stopped, which ends the shard in
    progress (its workers killed, its temporary files removed, its lock released) and the run with one line; any
    later one, while that cleanup runs, kills the workers and exits at once. Either way no worker outlives this
    process and the next run redoes the unfinished shards."""
    me = os.getpid()
    first: list[int] = []

    def handle(signum: int, frame: Any) -> None:
        if os.getpid() != me:  # a worker forked before its initializer ignored the signal: the parent handles it
            return
        if not first:
            first.append(signum)
            raise Stopped(signum)
        from data_prep.pipeline import kill_workers

        kill_workers()
        os.write(2, b"data_prep: stopped at once; unfinished shards are redone on the next run\n")
        os._exit(128 + first[0])

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():  # once stopped, this process only exits: later signals change nothing
            signal.signal(sig, signal.SIG_IGN if first else handler)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        with stopped_by_signals():
            return args.func(args)
    except (ConfigError, TokenizerError) as e:
        for line in str(e).splitlines():  # a config can have several problems, one line each
            print(f"data_prep: error: {line}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as stop:
        print("data_prep: interrupted; unfinished shards are redone on the next run", file=sys.stderr, flush=True)
        sys.stdout.flush()
        # Not through the interpreter's exit handlers: concurrent.futures' would join the killed pool's threads,
        # one of which may wait forever on a pipe its dead workers no longer read.
        os._exit(128 + getattr(stop, "signum", signal.SIGINT))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m data_prep",
        description="Download, extract and tokenize corpora into megatron .bin/.idx files, one output pair per shard.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def with_config(p: argparse.ArgumentParser, shard: bool = True) -> None:
        p.add_argument(
            "--config",
            required=True,
            metavar="PATH",
            help="the resolved config.yaml of a run directory (its data_preparation section is used), "
            "or a file with just that section",
        )
        if shard:
            p.add_argument(
                "--shard",
                metavar="K",
                help="shard indices to process: 3, 0-2, 0,4 or all (default: $SLURM_ARRAY_TASK_ID when set, else all)",
            )
        p.add_argument(
            "overrides",
            nargs="*",
            metavar="KEY=VALUE",
            help="config overrides by dotted path, e.g. data_preparation.workers=8",
        )

    p = sub.add_parser("run", help="prepare shards: download, tokenize, write .bin/.idx (finished shards are skipped)")
    with_config(p)
    p.add_argument("--workers", type=int, help="tokenizer processes (overrides data_preparation.workers)")
    p.add_argument("--force", action="store_true", help="redo shards even when they are finished")
    p.add_argument("--no-progress", action="store_true", help="no progress bars (summaries still print)")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("download", help="only download the sources (and a hub tokenizer) of unfinished shards")
    with_config(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_download)

    p = sub.add_parser("list", help="list the shards, their outputs and whether they are done")
    with_config(p, shard=False)
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--prefixes", action="store_true", help="print only the output prefixes, one per line")
    fmt.add_argument("--json", action="store_true", help="print the shards as JSON")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser(
        "verify", help="check finished outputs: readable by megatron, counts match, EOD after every document"
    )
    with_config(p)
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("train-tokenizer", help="train a tokenizer on local files (offline use and tests)")
    p.add_argument(
        "--type",
        choices=["sentencepiece", "huggingface"],
        default="sentencepiece",
        help="sentencepiece: writes OUTPUT.model; huggingface: a byte-level BPE, writes OUTPUT/tokenizer.json",
    )
    p.add_argument(
        "--input",
        nargs="+",
        required=True,
        metavar="FILE",
        help=".jsonl/.json[.zst|.gz] (text under --text-key) or plain-text files",
    )
    p.add_argument("--output", required=True, help="sentencepiece: model prefix; huggingface: directory")
    p.add_argument("--vocab-size", type=int, required=True)
    p.add_argument("--text-key", default="text")
    p.add_argument("--model-type", default="bpe", choices=["bpe", "unigram"], help="sentencepiece model type")
    p.add_argument("--max-documents", type=int, default=None, help="train on the first N documents only")
    p.set_defaults(func=cmd_train_tokenizer)
    return parser


# -- commands ----------------------------------------------------------------------------------------------


def _check_stack(config: ConfigFile) -> None:
    """Exit 2 with one line when this interpreter lacks the declared torch or megatron-core (the run's `stack`
    section, or conf/stack.yaml for a file with just the data_preparation section), before any shard starts."""
    from common.stack import check_or_exit

    check_or_exit(config.run, precision=None, components=("torch", "megatron_core"))


def cmd_run(args) -> int:
    from data_prep.pipeline import Pipeline, Settings

    config = _read(args)
    _check_stack(config)
    dp, shards = _load(args, config, settings=True)
    settings = Settings.from_config(dp)
    pipeline = Pipeline(settings)
    tok = pipeline.tokenizer  # once, up front: a tokenizer problem is one error, not one per shard
    print(
        f"data_prep: {dp.name}: {len(shards)} shard(s), {settings.workers} worker(s), tokenizer "
        f"{settings.tokenizer_type}:{settings.tokenizer_path} (vocab {tok.vocab_size}, eod {tok.eod}), output "
        f"{os.path.dirname(shards[0].output_prefix)}",
        flush=True,
    )
    return _report(pipeline.run(shards, force=args.force, progress=not args.no_progress))


def cmd_download(args) -> int:
    from data_prep.pipeline import Pipeline, Settings

    dp, shards = _load(args, _read(args), settings=True)
    pipeline = Pipeline(Settings.from_config(dp, workers=1))
    _ = pipeline.tokenizer  # a hub tokenizer lands in the Hugging Face cache
    return _report(pipeline.fetch(shards, progress=not args.no_progress))


def cmd_list(args) -> int:
    from data_prep.pipeline import MARKER_SUFFIX, read_marker

    _, shards = _load(args, _read(args), select=False)
    if args.prefixes:
        print("\n".join(s.output_prefix for s in shards))
        return 0
    rows: list[dict[str, Any]] = []
    for s in shards:
        marker = read_marker(s.output_prefix)
        state = (
            "done"
            if marker
            else "incomplete"
            if any(os.path.exists(s.output_prefix + e) for e in (".bin.tmp", ".bin", MARKER_SUFFIX))
            else "pending"
        )
        rows.append(
            {
                "index": s.index,
                "name": s.name,
                "output_prefix": s.output_prefix,
                "state": state,
                "sources": [src.uri for src in s.sources],
                "max_documents": s.max_documents,
                "documents": marker.get("documents") if marker else None,
                "tokens": marker.get("tokens") if marker else None,
            }
        )
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'shard':>5}  {'state':<10}  {'sources':>7}  {'tokens':>15}  output prefix")
    for r in rows:
        tokens = f"{r['tokens']:,}" if r["tokens"] is not None else "-"
        print(f"{r['index']:>5}  {r['state']:<10}  {len(r['sources']):>7}  {tokens:>15}  {r['output_prefix']}")
    return 0


def cmd_verify(args) -> int:
    from data_prep.verify import verify_shard

    config = _read(args)
    _check_stack(config)
    _, shards = _load(args, config)
    failed = 0
    for s in shards:
        problems = verify_shard(s)
        print(f"{s.name}: " + ("OK" if not problems else "FAILED: " + "; ".join(problems)))
        failed += bool(problems)
    return 1 if failed else 0


def cmd_train_tokenizer(args) -> int:
    from data_prep.train_tokenizer import train_bpe, train_sentencepiece

    if args.type == "sentencepiece":
        path = train_sentencepiece(
            args.input,
            args.output,
            args.vocab_size,
            text_key=args.text_key,
            model_type=args.model_type,
            max_documents=args.max_documents,
        )
    else:
        path = train_bpe(
            args.input, args.output, args.vocab_size, text_key=args.text_key, max_documents=args.max_documents
        )
    print(path)
    return 0


# -- helpers -----------------------------------------------------------------------------------------------


def _read(args) -> ConfigFile:
    """--config with the KEY=VALUE overrides, and --workers as one more."""
    overrides = list(args.overrides)
    if getattr(args, "workers", None) is not None:
        if args.workers < 1:
            raise ConfigError(f"--workers={args.workers}: expected a positive integer (tokenizer processes)")
        overrides.append(f"data_preparation.workers={args.workers}")
    return load_config_file(args.config, overrides)


def _load(
    args, config: ConfigFile, select: bool = True, settings: bool = False
) -> tuple[DataPreparationConfig, list[Shard]]:
    """The config's section and its shards (those --shard selects). With `settings`, every problem of the
    settings the pipeline reads is reported too, all at once and before anything starts."""
    dp = config.section
    if settings:
        problems, shards = settings_and_shards(dp)
        if problems:
            raise ConfigError("\n".join(problems))
    else:
        shards = list_shards(dp)
    if select:
        shards = select_shards(shards, getattr(args, "shard", None))
    return dp, shards


def select_shards(shards: list[Shard], spec: Optional[str]) -> list[Shard]:
    """--shard, else $SLURM_ARRAY_TASK_ID (one array task per shard), else all."""
    source = "--shard"
    if spec is None and os.environ.get("SLURM_ARRAY_TASK_ID"):
        spec, source = os.environ["SLURM_ARRAY_TASK_ID"], "SLURM_ARRAY_TASK_ID"
    if spec is None or spec == "all":
        return shards
    try:
        wanted = parse_numbers(spec, "shard")
    except ConfigError:
        raise ConfigError(f"{source}={spec!r}: expected shard indices like 3, 0-2, 0,4 or all") from None
    missing = [k for k in wanted if k >= len(shards)]
    if missing:
        raise ConfigError(
            f"{source}={spec}: shard {missing[0]} does not exist (this config has {len(shards)} "
            f"shards, 0-{len(shards) - 1})"
        )
    return [shards[k] for k in wanted]


def _report(results) -> int:
    failed = [r for r in results if r.status == "failed"]
    counts: dict[str, int] = {}
    for r in results:
        counts[r.status] = counts.get(r.status, 0) + 1
    words = {
        "done": "done",
        "skipped": "already done",
        "downloaded": "downloaded",
        "failed": "failed",
        "not started": "not started",
    }
    print(
        "data_prep: "
        + ", ".join(f"{n} {words[s]}" for s, n in counts.items())
        + f" ({len(results)} shard{'s' if len(results) != 1 else ''})",
        flush=True,
    )
    for r in failed:
        print(f"data_prep: shard {r.index} ({r.name}) failed: {r.reason}", file=sys.stderr, flush=True)
    return 1 if failed else 0
