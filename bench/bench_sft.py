"""Fine-tuning throughput, packed against padded: each case is a `python main.py ... cluster=local` run on synthetic
fine-tuning samples (training.data.format=sft), once with training.data.packing=false (one sample per sequence,
padded) and once with packing=true (samples packed into each sequence, THD with cu_seqlens). One table row per run:
step time (mean over the last steps), all tokens/s (every position, padding included), non-padding tokens/s, trained
tokens/s (the loss mask's: responses only, as the trainer logs them), samples/s, and the packed run's speed-up in
trained tokens/s over the padded one.

The samples: lengths drawn log-uniformly from [--min-length, --max-length] tokens (defaults: seq_length / 64 to
seq_length / 2, so a padded sequence is about 14% samples), the first 30-90% of each (uniform) a prompt that does not
count in the loss; token ids uniform below the tokenizer's vocabulary. They are written as data preparation writes
fine-tuning samples (tokens and a loss mask, megatron's .bin/.idx), with a small sentencepiece tokenizer trained here
unless --tokenizer names one.

    python bench/bench_sft.py                        # the tiny model and the 8B 16-layer proxy, 1 GPU each
    python bench/bench_sft.py --models tiny --steps 30 --window 15
    python bench/bench_sft.py --dry-run              # plan every run (no GPU): the commands and their plans
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
import shlex
import subprocess
import sys
import tempfile

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from data_prep.indexed import IndexWriter  # noqa: E402
from data_prep.shards import LOSS_MASK  # noqa: E402
from data_prep.sft import MASK_DTYPE  # noqa: E402

# name -> (overrides, sequence length, global batch size in sequences)
MODELS = {
    "tiny": (["training=llama31/tiny", "parallelism=tp1", "training.micro_batch_size=1"], 2048, 8),
    "8b16": (
        ["training=llama31/8b", "training.model.num_layers=16", "parallelism=tp1", "training.micro_batch_size=1"],
        8192,
        8,
    ),
}
PROMPT_SHARE = (0.3, 0.9)
WORDS = "the model reads packed samples and each one attends only to itself while padding trains nothing".split()


def sample_lengths(count: int, shortest: int, longest: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(lengths, prompt lengths): log-uniform lengths, each with a prompt of 30-90% of it (at least one response
    token)."""
    rng = np.random.default_rng(seed)
    lengths = np.exp(rng.uniform(math.log(shortest), math.log(longest), count)).astype(np.int64)
    prompts = np.minimum((lengths * rng.uniform(*PROMPT_SHARE, count)).astype(np.int64), lengths - 1)
    return lengths, prompts


def write_samples(prefix: str, lengths: np.ndarray, prompts: np.ndarray, vocab: int, seed: int) -> None:
    """Tokens and loss mask as data preparation writes fine-tuning samples: one indexed sequence per sample."""
    rng = np.random.default_rng(seed + 1)
    tokens = rng.integers(0, vocab, int(lengths.sum()), dtype=np.int32)
    mask = np.concatenate(
        [np.r_[np.zeros(p, MASK_DTYPE), np.ones(n - p, MASK_DTYPE)] for n, p in zip(lengths, prompts)]
    )
    for path, values in ((prefix, tokens), (prefix + LOSS_MASK, mask)):
        writer = IndexWriter(path + ".bin", values.dtype)
        writer.add_documents(values, lengths)
        writer.finalize(path + ".idx")


def train_tokenizer(directory: Path) -> tuple[str, str]:
    """A small sentencepiece tokenizer (its vocabulary only bounds the synthetic token ids)."""
    corpus = directory / "corpus.txt"
    rng = np.random.default_rng(0)
    corpus.write_text("\n".join(" ".join(rng.choice(WORDS, 12)) for _ in range(2000)) + "\n")
    command = [sys.executable, "-m", "data_prep", "train-tokenizer", "--type", "sentencepiece", "--input"]
    command += [str(corpus), "--output", str(directory / "sp"), "--vocab-size", "400"]
    subprocess.run(command, cwd=REPO, check=True, capture_output=True, text=True, timeout=900)
    return "sentencepiece", str(directory / "sp.model")


def tokenizer_vocab(kind: str, path: str) -> int:
    from data_prep.tokenizer import load_tokenizer

    return int(load_tokenizer(kind, path).vocab_size)


def run_overrides(model: str, packing: bool, prefix: str, tokenizer: tuple[str, str], args, results: Path):
    overrides, seq, gbs = MODELS[model]
    return [
        *overrides,
        "cluster=local",
        f"training.seq_length={seq}",
        f"training.global_batch_size={gbs}",
        f"training.train_steps={args.steps}",
        "training.scheduler.warmup_steps=2",
        "training.val_interval=0",
        "training.checkpoint.interval=0",
        "training.checkpoint.save_at_end=false",
        "training.data.format=sft",
        "training.data.mock=false",
        f"training.data.blend=[{prefix}]",
        "training.data.split='100,0,0'",
        f"training.data.packing={str(packing).lower()}",
        f"training.tokenizer.type={tokenizer[0]}",
        f"training.tokenizer.path={tokenizer[1]}",
        f"results_dir={results}",
        f"run_name={model}_{'packed' if packing else 'padded'}",
        *shlex.split(args.extra),
    ]


def step_samples(prefix: str, seq: int, gbs: int, steps: int, packing: bool) -> tuple[np.ndarray, np.ndarray]:
    """(samples, non-padding tokens) of each training step, from the trainer's own sequence plan."""
    from recipes.trainer.sft import SftSamples, epochs, fitted_lengths, split_samples

    samples = SftSamples([prefix])
    lengths = fitted_lengths(samples, seq, truncate=True)
    part, _ = split_samples(len(samples), "100,0,0", seed=1234)
    plan = epochs(part, 1234, steps * gbs, lengths, seq, packing)
    counts = np.array([len(s) for s in plan]).reshape(steps, gbs).sum(axis=1)
    tokens = np.array([int(lengths[s].sum()) for s in plan]).reshape(steps, gbs).sum(axis=1)
    return counts, tokens


def row(model: str, packing: bool, run_dir: Path, prefix: str, window: int) -> dict:
    plan = json.loads((run_dir / "plan.json").read_text())
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    records = [r for r in records if "step_time_s" in r]
    last = records[-window:]
    seq, gbs = plan["seq_length"], plan["global_batch_size"]
    counts, tokens = step_samples(prefix, seq, gbs, len(records), packing)
    chosen = [r["step"] - 1 for r in last]
    time = sum(r["step_time_s"] for r in last)
    return {
        "case": f"{model} {'packed' if packing else 'padded'}",
        "gpus": plan["num_gpus"],
        "seq": seq,
        "gbs": gbs,
        "step_time_s": time / len(last),
        "tokens_per_s": seq * gbs * len(last) / time,
        "non_padding_tokens_per_s": float(tokens[chosen].sum()) / time,
        "trained_tokens_per_s": sum(r["trained_tokens"] for r in last) / time,
        "samples_per_s": float(counts[chosen].sum()) / time,
        "final_loss": records[-1]["loss"],
    }


def print_table(rows: list[dict]) -> None:
    header = (
        f"{'case':<13} {'GPUs':>4} {'seq':>5} {'GBS':>4} {'step s':>7} {'tokens/s':>10} {'non-pad tok/s':>13} "
        f"{'trained tok/s':>13} {'samples/s':>9} {'speed-up':>8}"
    )
    print(header)
    print("-" * len(header))
    padded = {r["case"].split()[0]: r for r in rows if r["case"].endswith("padded") and "error" not in r}
    for r in rows:
        if "error" in r:
            print(f"{r['case']:<13} {r['error']}")
            continue
        base = padded.get(r["case"].split()[0])
        speedup = f"{r['trained_tokens_per_s'] / base['trained_tokens_per_s']:.2f}x" if base else "-"
        print(
            f"{r['case']:<13} {r['gpus']:>4} {r['seq']:>5} {r['gbs']:>4} {r['step_time_s']:>7.3f} "
            f"{r['tokens_per_s']:>10,.0f} {r['non_padding_tokens_per_s']:>13,.0f} {r['trained_tokens_per_s']:>13,.0f} "
            f"{r['samples_per_s']:>9,.1f} {speedup:>8}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="tiny,8b16", help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--window", type=int, default=10, help="average over the last N steps")
    parser.add_argument("--samples", type=int, default=4000, help="synthetic samples per model")
    parser.add_argument("--min-length", type=int, default=None, help="shortest sample (default seq_length / 64)")
    parser.add_argument("--max-length", type=int, default=None, help="longest sample (default seq_length / 2)")
    parser.add_argument("--tokenizer", default=None, help="TYPE:PATH of a tokenizer (default: one trained here)")
    parser.add_argument("--extra", default="", help="more Hydra overrides for every run, space-separated")
    parser.add_argument("--results", default=None, help="where data and run directories go (default: a temp dir)")
    parser.add_argument("--dry-run", action="store_true", help="plan every run (dry_run=true) and stop")
    parser.add_argument("--json", default=None, help="also write the rows to this JSON file")
    args = parser.parse_args()
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in MODELS]
    if unknown or args.window < 1 or args.window > args.steps:
        parser.error(f"--models takes {', '.join(MODELS)} and --window 1..--steps; got {args.models}, {args.window}")
    results = Path(args.results or tempfile.mkdtemp(prefix="bench_sft_"))
    results.mkdir(parents=True, exist_ok=True)
    tokenizer = tuple(args.tokenizer.split(":", 1)) if args.tokenizer else train_tokenizer(results)
    vocab = tokenizer_vocab(*tokenizer)
    rows = []
    for model in models:
        _, seq, _ = MODELS[model]
        shortest, longest = args.min_length or seq // 64, args.max_length or seq // 2
        lengths, prompts = sample_lengths(args.samples, shortest, longest, seed=0)
        prefix = str(results / f"{model}_sft_document")
        write_samples(prefix, lengths, prompts, vocab, seed=0)
        print(
            f"{model}: {args.samples} samples of {shortest}..{longest} tokens (log-uniform; mean {lengths.mean():.0f}, "
            f"median {np.median(lengths):.0f}), prompts {PROMPT_SHARE[0]:.0%}-{PROMPT_SHARE[1]:.0%} of each; "
            f"seq_length {seq}",
            flush=True,
        )
        for packing in (False, True):
            overrides = run_overrides(model, packing, prefix, tokenizer, args, results)
            command = [sys.executable, str(REPO / "main.py"), *overrides, *(["dry_run=true"] if args.dry_run else [])]
            print("$", " ".join(shlex.quote(c) for c in command), flush=True)
            done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
            name = f"{model}_{'packed' if packing else 'padded'}"
            (results / f"{name}.out").write_text(done.stdout + done.stderr)
            if done.returncode != 0:
                rows.append(
                    {"case": f"{model} {'packed' if packing else 'padded'}", "error": f"exit {done.returncode}"}
                )
                print((done.stdout + done.stderr)[-3000:], flush=True)
                continue
            if not args.dry_run:
                rows.append(row(model, packing, results / name, prefix, args.window))
                print_table(rows[-1:])
    if args.dry_run:
        print(f"planned {2 * len(models)} runs under {results}" if not rows else "some runs were refused")
        sys.exit(1 if rows else 0)
    print()
    print_table(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
