"""Tokenization throughput: a plain single-process loop vs the data-preparation pipeline with N workers.

    bash dev.sh python bench/bench_tokenize.py                       # both tokenizer kinds, workers 1 and 2
    bash dev.sh python bench/bench_tokenize.py --tokenizer huggingface --tokenizer-path /models/llama3 --workers 1,2,4

The corpus is fixed: generated from a seed (Zipf-distributed pseudo-words in sentences and paragraphs) into one
.jsonl file. Without --tokenizer-path, a byte-level BPE (huggingface) and a sentencepiece BPE are trained on its
first documents. The plain loop reads the file line by line, parses JSON and calls the tokenizer library
directly, appending EOD (no output written); "2 loops in parallel" runs it on the two halves of the corpus in two
independent processes at once, the ceiling this machine offers two busy processes. The pipeline rows run
`data_prep`'s shard processing end to end
(worker start-up, parsing, tokenization, writing .bin/.idx) on the same file. Each row is the best of --repeat
interleaved rounds; speedups are against the plain loop and against the pipeline's 1-worker row. The last
column shows how busy the rest of the machine was during that round (other processes take CPUs the workers need).
Below the table, the same speedups round by round (median and range): on machines whose speed drifts (shared
VMs), the modes of one round ran under the most similar conditions.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import yaml  # noqa: E402

from common.config import VARIANTS, DataPreparationConfig  # noqa: E402
from common.typed import from_plain  # noqa: E402
from data_prep.pipeline import Pipeline, Settings  # noqa: E402
from data_prep.shards import Shard, Source  # noqa: E402
from data_prep.tokenizer import load_tokenizer  # noqa: E402
from data_prep.train_tokenizer import train_bpe, train_sentencepiece  # noqa: E402

# The pipeline runs with the files dataset's own settings (its chunk size among them).
FILES_YAML = os.path.join(REPO, "conf", "data_preparation", "files.yaml")
with open(FILES_YAML) as _f:
    FILES_SETTINGS = yaml.safe_load(_f)  # unresolved: pipeline_settings replaces what is not
CHUNK_BYTES = int(FILES_SETTINGS["chunk_bytes"])


def make_corpus(path: str, docs: int, seed: int) -> int:
    """Writes `docs` JSON lines; returns the file size."""
    rng = random.Random(seed)
    syllables = ["ka", "lo", "mi", "ne", "ru", "sa", "te", "vi", "on", "er", "an", "is", "qu", "th", "ing", "é", "ß"]
    vocab = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(20000)]
    weights = [1.0 / (rank + 1) for rank in range(len(vocab))]  # Zipf, like natural text
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(docs):
            paragraphs = []
            for _ in range(rng.randint(1, 6)):
                sentences = []
                for _ in range(rng.randint(1, 8)):
                    words = rng.choices(vocab, weights, k=rng.randint(4, 30))
                    if rng.random() < 0.2:
                        words.insert(rng.randrange(len(words)), str(rng.randint(0, 100000)))
                    sentences.append(" ".join(words).capitalize() + rng.choice([".", ".", ".", "?", "!", ";"]))
                paragraphs.append(" ".join(sentences))
            f.write(json.dumps({"text": "\n\n".join(paragraphs), "meta": {"id": rng.randint(0, 1 << 30)}}) + "\n")
    return os.path.getsize(path)


def plain_loop(corpus: str, tok_type: str, tok_path: str) -> tuple[int, int]:
    """The baseline: one process, one document at a time, straight into the tokenizer library."""
    tok = load_tokenizer(tok_type, tok_path)
    if tok_type == "huggingface":
        raw = tok._tok

        def encode(text):
            return raw.encode(text, add_special_tokens=False).ids
    else:
        encode = tok._sp.encode
    docs = tokens = 0
    with open(corpus, "rb") as f:
        for line in f:
            ids = encode(json.loads(line)["text"])
            ids.append(tok.eod)
            docs += 1
            tokens += len(ids)
    return docs, tokens


def _loop_half(args) -> tuple[int, int]:
    return plain_loop(*args)


def parallel_loops(halves: list[str], tok_type: str, tok_path: str) -> tuple[int, int]:
    """The machine's own ceiling for 2-way parallelism: two independent plain loops, one per half of the corpus,
    in two processes at once. Nothing is shared, so nothing can do better."""
    import multiprocessing

    with multiprocessing.get_context("fork").Pool(len(halves)) as pool:
        counts = pool.map(_loop_half, [(h, tok_type, tok_path) for h in halves])
    return sum(c[0] for c in counts), sum(c[1] for c in counts)


def split_corpus(corpus: str, parts: int) -> list[str]:
    with open(corpus, "rb") as f:
        lines = f.readlines()
    paths = []
    for k in range(parts):
        path = f"{corpus}.part{k}"
        with open(path, "wb") as f:
            f.writelines(lines[k * len(lines) // parts : (k + 1) * len(lines) // parts])
        paths.append(path)
    return paths


def pipeline_settings(out_dir: str, tok_type: str, tok_path: str, workers: int) -> Settings:
    """files.yaml's settings through Settings.from_config, as `python -m data_prep run` builds them: a setting
    added to the pipeline reaches the benchmark with its default instead of breaking it."""
    plain = {key: value for key, value in FILES_SETTINGS.items() if key != "defaults"}  # Hydra's list, not a key
    plain.update(
        output_dir=out_dir, download_dir=out_dir, workers=workers, tokenizer={"type": tok_type, "path": tok_path}
    )
    return Settings.from_config(from_plain(DataPreparationConfig, plain, VARIANTS, "data_preparation"))


def pipeline(corpus: str, out_dir: str, tok_type: str, tok_path: str, workers: int) -> tuple[int, int]:
    settings = pipeline_settings(out_dir, tok_type, tok_path, workers)
    shard = Shard(
        0,
        "bench",
        os.path.join(out_dir, f"bench_{tok_type}_{workers}_text_document"),
        (Source(corpus, corpus, "none", "jsonl"),),
    )
    (result,) = Pipeline(settings, log=lambda _: None).run([shard], force=True, progress=False)
    if result.status != "done":
        raise SystemExit(f"pipeline failed: {result.reason}")
    return result.documents, result.tokens


def _busy_seconds() -> float:
    """CPU time the whole machine spent busy (all processes), from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _own_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)  # worker processes, once joined
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def timed(fn, *args) -> tuple[float, int, int, float]:
    """(seconds, documents, tokens, share of the machine's CPUs other processes used meanwhile)."""
    busy0, own0, t0 = _busy_seconds(), _own_seconds(), time.perf_counter()
    docs, tokens = fn(*args)
    seconds = time.perf_counter() - t0
    other = (_busy_seconds() - busy0) - (_own_seconds() - own0)
    return seconds, docs, tokens, max(0.0, other) / (seconds * len(os.sched_getaffinity(0)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=12000, help="documents in the generated corpus")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--tokenizer", choices=["huggingface", "sentencepiece", "both"], default="both")
    parser.add_argument("--tokenizer-path", help="use this tokenizer instead of training one (with one --tokenizer)")
    parser.add_argument("--vocab-size", type=int, default=16000, help="vocabulary of the trained tokenizers")
    parser.add_argument("--workers", default="1,2", help="pipeline worker counts, comma separated")
    parser.add_argument("--repeat", type=int, default=5, help="rounds; each row shows its fastest")
    parser.add_argument("--workdir", help="keep corpus, tokenizers and outputs here (default: a temporary dir)")
    args = parser.parse_args()
    if args.tokenizer_path and args.tokenizer == "both":
        parser.error("--tokenizer-path needs --tokenizer huggingface or sentencepiece")
    workers = [int(w) for w in args.workers.split(",")]

    with tempfile.TemporaryDirectory() as tmp:
        work = args.workdir or tmp
        os.makedirs(work, exist_ok=True)
        corpus = os.path.join(work, "corpus.jsonl")
        size = make_corpus(corpus, args.docs, args.seed)
        halves = split_corpus(corpus, 2)
        kinds = ["huggingface", "sentencepiece"] if args.tokenizer == "both" else [args.tokenizer]
        print(
            f"corpus: {args.docs:,} documents, {size / 1e6:.1f} MB (seed {args.seed}); chunk_bytes {CHUNK_BYTES}; "
            f"CPUs: {len(os.sched_getaffinity(0))}; best of {args.repeat} interleaved rounds; load average "
            f"{os.getloadavg()[0]:.2f}"
        )
        header = (
            f"{'tokenizer':<14} {'mode':<20} {'seconds':>8} {'docs/s':>9} {'tokens/s':>11} {'MB/s':>6} "
            f"{'vs loop':>8} {'vs 1 worker':>11} {'other load':>10}"
        )
        rows, paired = [], []
        for kind in kinds:
            path = args.tokenizer_path
            if not path:
                if kind == "huggingface":
                    path = train_bpe([corpus], os.path.join(work, "bpe"), args.vocab_size, max_documents=2000)
                else:
                    path = train_sentencepiece(
                        [corpus], os.path.join(work, "sp", "sp"), args.vocab_size, max_documents=2000
                    )
            # Rounds interleave the modes, so a burst of other load on the machine hits them alike; the table
            # shows each mode's fastest round.
            modes = [
                ("plain loop", plain_loop, (corpus, kind, path)),
                ("2 loops in parallel", parallel_loops, (halves, kind, path)),
            ]
            modes += [
                (f"pipeline {w} worker{'s' if w > 1 else ''}", pipeline, (corpus, work, kind, path, w)) for w in workers
            ]
            runs: dict[str, list[tuple[float, int, int, float]]] = {mode: [] for mode, _, _ in modes}
            for _ in range(args.repeat):
                for mode, fn, fn_args in modes:
                    runs[mode].append(timed(fn, *fn_args))
            best = {mode: min(r) for mode, r in runs.items()}
            base = best["plain loop"]
            for mode, r in best.items():
                if r[1:3] != base[1:3]:
                    raise SystemExit(f"{mode} counted {r[1:3]} documents/tokens, the plain loop {base[1:3]}")
            one = best.get("pipeline 1 worker")
            rows += [(kind, mode, r, one if mode.startswith("pipeline") else None) for mode, r in best.items()]
            # Speedups round by round (the modes of a round ran back to back, under the same conditions).
            for slow, fast in [("plain loop", "pipeline 1 worker")] + [
                ("pipeline 1 worker", f"pipeline {w} workers") for w in workers if w > 1
            ]:
                if slow in runs and fast in runs:
                    ratios = sorted(a[0] / b[0] for a, b in zip(runs[slow], runs[fast]))
                    paired.append(
                        f"{kind}: {fast} vs {slow}: median {statistics.median(ratios):.2f}x over "
                        f"{len(ratios)} rounds (range {ratios[0]:.2f}-{ratios[-1]:.2f}x)"
                    )
            name = os.path.basename(os.path.normpath(path))
            print(f"{kind}: {name}, vocab {load_tokenizer(kind, path).vocab_size}")
        print()
        print(header)
        print("-" * len(header))
        loop_time = {}
        for kind, mode, (seconds, docs, tokens, other), one in rows:
            if mode == "plain loop":
                loop_time[kind] = seconds
            vs_one = f"{one[0] / seconds:.2f}x" if one is not None else "-"
            print(
                f"{kind:<14} {mode:<20} {seconds:>8.2f} {docs / seconds:>9,.0f} {tokens / seconds:>11,.0f} "
                f"{size / seconds / 1e6:>6.2f} {loop_time[kind] / seconds:>7.2f}x {vs_one:>11} {other:>9.0%}"
            )
        print(
            "\n2 loops in parallel: the plain loop on each half of the corpus in two independent processes at "
            "once: what\nthis machine gives two busy processes (the ceiling for 2 workers). other load: the share "
            "of the machine's\nCPUs other processes used during the row's fastest round.\n"
        )
        print("\n".join(paired))


if __name__ == "__main__":
    main()
