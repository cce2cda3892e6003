"""The evaluation stage on this machine's GPU, through `python main.py ... cluster=local`: the tiny model trained
300 steps on Python's standard library sources, with documents held out of training.

- evaluation.blends on the run's own validation blend gives the validation loss the trainer logged at that
  checkpoint (the same weights, the same sequences, the same reduction).
- A two-choice task written from the held-out documents (a context, then its real continuation against the same
  words shuffled) through lm-eval: the trained model scores at least 85%, the random-init one (the run's
  iter_0000000) between 40% and 60%.
- The held-out perplexity task (evaluation.heldout) on those documents: the trained model's word perplexity under
  half the random-init one's; its wall time per million tokens printed (the docs' cost).

The lm-eval tests need lm-eval installed (pip install 'lm-eval[hf]==0.4.13'); they skip without it."""

import json
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from corpora import write_stdlib_corpus

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.gpu, pytest.mark.timeout(3600)]
HELD_OUT = 300  # documents kept out of training
STEPS = 300
ITEMS = 200
CONTEXT_WORDS, CONTINUATION_WORDS = 48, 16


def main_py(*overrides: str, timeout: int = 1800) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(REPO / "main.py"), *overrides]
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stdout[-6000:]}\n{result.stderr[-6000:]}"
        )
    return result


def rows(run_dir: Path, name: str) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "evaluation" / name).read_text().splitlines()]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict:
    """Training and held-out documents, a byte-level BPE trained on the training ones, both prepared into
    .bin/.idx; the tiny model trained STEPS steps with the held-out documents as its validation blend, its
    random-init weights kept (iter_0000000), exported to Hugging Face format."""
    root = tmp_path_factory.mktemp("evaluation")
    corpus = write_stdlib_corpus(root / "all.jsonl", 14_000_000, document_chars=8_000).read_text().splitlines()
    assert len(corpus) > HELD_OUT * 3, len(corpus)
    (root / "train.jsonl").write_text("\n".join(corpus[:-HELD_OUT]) + "\n")
    (root / "heldout.jsonl").write_text("\n".join(corpus[-HELD_OUT:]) + "\n")
    tokenizer = root / "tokenizer"
    subprocess.run(
        [sys.executable, "-m", "data_prep", "train-tokenizer", "--type", "huggingface", "--input"]
        + [str(root / "train.jsonl"), "--output", str(tokenizer), "--vocab-size", "8000", "--max-documents", "2000"],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=900,
    )
    config = json.loads((tokenizer / "tokenizer_config.json").read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"  # what transformers loads the export's copy with
    (tokenizer / "tokenizer_config.json").write_text(json.dumps(config))
    tok = ["training.tokenizer.type=huggingface", f"training.tokenizer.path={tokenizer}"]
    main_py(
        "stages=[data_preparation]",
        "data_preparation=files",
        f"data_preparation.inputs=[{root / 'train.jsonl'},{root / 'heldout.jsonl'}]",
        f"data_preparation.output_dir={root / 'data'}",
        f"results_dir={root / 'runs'}",
        *tok,
    )
    train, heldout = root / "data" / "train_text_document", root / "data" / "heldout_text_document"
    common = [
        "training=llama31/tiny",
        "cluster=local",
        f"results_dir={root / 'runs'}",
        "run_name=tiny",
        *tok,
        "training.model.vocab_size=8192",
        "training.data.mock=false",
        f"training.data.blend=[{train}]",
        f"training.data.valid_blend=[{heldout}]",
        "training.val_samples=16",
    ]
    main_py(
        *common,
        "stages=[training,export]",
        f"training.train_steps={STEPS}",
        f"training.val_interval={STEPS // 3}",
        f"training.checkpoint.interval={STEPS}",
        "training.checkpoint.save_initial=true",
        "training.checkpoint.keep_last=0",
    )
    run_dir = root / "runs" / "tiny"
    assert (run_dir / "hf" / "config.json").is_file() and (run_dir / "checkpoints" / "iter_0000000").is_dir()
    return {"root": root, "run_dir": run_dir, "common": common, "heldout": root / "heldout.jsonl", "prefix": heldout}


def test_blends_loss_is_the_validation_loss_the_trainer_logged(trained):
    run_dir = trained["run_dir"]
    logged = {
        r["step"]: r["val_loss"]
        for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
        if r.get("val_loss") is not None
    }
    assert STEPS in logged, sorted(logged)
    main_py(
        *trained["common"],
        "stages=[evaluation]",
        "evaluation.tasks=[]",
        f"evaluation.blends=[{{name: val, prefixes: [{trained['prefix']}]}}]",
    )
    (row,) = rows(run_dir, "blends.jsonl")
    assert (row["task"], row["metric"], row["step"]) == ("blend:val", "loss", STEPS)
    print(f"\nheld-out loss at step {STEPS}: trainer {logged[STEPS]:.5f}, evaluation.blends {row['value']:.5f}")
    assert abs(row["value"] - logged[STEPS]) < 1e-3
    # A model that learnt something: the validation loss fell since the first evaluation.
    assert row["value"] < logged[min(logged)]


def two_choice_task(heldout: Path, directory: Path) -> str:
    """ITEMS items from the held-out documents: CONTEXT_WORDS words, then the next CONTINUATION_WORDS words
    against the same words shuffled, the real one first or second at random; the task's YAML beside them."""
    rng = random.Random(0)
    items = []
    for line in heldout.read_text().splitlines():
        words = json.loads(line)["text"].split()
        for start in range(0, len(words) - CONTEXT_WORDS - CONTINUATION_WORDS, 400):
            real = words[start + CONTEXT_WORDS : start + CONTEXT_WORDS + CONTINUATION_WORDS]
            shuffled = list(real)
            for _ in range(10):
                rng.shuffle(shuffled)
                if shuffled != real:
                    break
            if shuffled == real:
                continue
            label = rng.randrange(2)
            choices = [" ".join(real), " ".join(shuffled)] if label == 0 else [" ".join(shuffled), " ".join(real)]
            items.append(
                {"context": " ".join(words[start : start + CONTEXT_WORDS]), "choices": choices, "label": label}
            )
            break  # one item per document
        if len(items) == ITEMS:
            break
    assert len(items) == ITEMS, len(items)
    directory.mkdir(parents=True, exist_ok=True)
    data = directory / "two_choice.jsonl"
    data.write_text("".join(json.dumps(item) + "\n" for item in items))
    task = {
        "task": "heldout_two_choice",
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(data)}},
        "test_split": "test",
        "output_type": "multiple_choice",
        "doc_to_text": "{{context}}",
        "doc_to_choice": "{{choices}}",
        "doc_to_target": "{{label}}",
        "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}],
    }
    (directory / "two_choice.yaml").write_text(json.dumps(task, indent=2) + "\n")  # JSON is YAML
    return "heldout_two_choice"


def evaluate(trained, run_name: str, *overrides: str) -> dict[tuple[str, str], float]:
    """The evaluation stage with the run's own settings and `overrides`, in the run directory run_name; its rows by
    (task, metric)."""
    common = [o for o in trained["common"] if not o.startswith("run_name=")]
    main_py(*common, f"run_name={run_name}", "stages=[evaluation]", *overrides)
    return {(r["task"], r["metric"]): r["value"] for r in rows(trained["root"] / "runs" / run_name, "tasks.jsonl")}


def no_hub_data(trained) -> str:
    return f"evaluation.data_dir={trained['root'] / 'no_hub_data'}"  # a local task needs none


def accuracy(trained, directory: Path, run_name: str, *overrides: str) -> float:
    """The two-choice task's accuracy through the evaluation stage, in the run directory run_name."""
    task = two_choice_task(trained["heldout"], directory)
    found = evaluate(
        trained,
        run_name,
        f"evaluation.tasks=[{task}]",
        f"evaluation.include_path={directory}",
        no_hub_data(trained),
        *overrides,
    )
    return found[(task, "acc")]


@pytest.fixture(scope="module")
def random_hf(trained) -> Path:
    """The random-init weights of the same run (iter_0000000), exported by our exporter."""
    out = trained["root"] / "random_hf"
    subprocess.run(
        [sys.executable, "-m", "recipes.hf.exporter"]
        + ["--checkpoint", str(trained["run_dir"] / "checkpoints" / "iter_0000000")]
        + ["--out", str(out), "--no-progress"],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=600,
    )
    return out


def test_a_two_choice_task_from_held_out_documents_tells_trained_from_random(trained, random_hf):
    pytest.importorskip("lm_eval")
    acc = accuracy(trained, trained["root"] / "tasks", "tiny")
    print(f"\ntwo-choice accuracy after {STEPS} steps: {acc:.3f}")
    assert acc >= 0.85
    acc = accuracy(trained, trained["root"] / "tasks_random", "random", f"evaluation.model={random_hf}")
    print(f"two-choice accuracy of the random-init model: {acc:.3f}")
    assert 0.40 <= acc <= 0.60


def heldout_perplexity(trained, run_name: str, model: Path) -> tuple[float, float]:
    """The held-out task (evaluation.heldout: rolling log-likelihood over the held-out documents) on `model`: its
    word perplexity, and the stage's wall time (a fresh process: start, model load, scoring)."""
    started = time.perf_counter()
    found = evaluate(
        trained,
        run_name,
        "evaluation.tasks=[]",
        f"evaluation.heldout=[{trained['heldout']}]",
        f"evaluation.model={model}",
        no_hub_data(trained),
    )
    return found[("heldout", "word_perplexity")], time.perf_counter() - started


def test_held_out_perplexity_tells_trained_from_random_and_what_it_costs(trained, random_hf):
    """The cost is printed for docs/evaluation.md ("What it costs"): seconds per million held-out tokens, the
    tokens counted with the export's tokenizer."""
    pytest.importorskip("lm_eval")
    from transformers import AutoTokenizer

    model = trained["run_dir"] / "hf"
    texts = [json.loads(line)["text"] for line in trained["heldout"].read_text().splitlines()]
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    tokens = sum(len(tokenizer(text)["input_ids"]) for text in texts)
    ours, seconds = heldout_perplexity(trained, "heldout_trained", model)
    rand, _ = heldout_perplexity(trained, "heldout_random", random_hf)
    print(
        f"\nheld-out word perplexity: trained {ours:.2f}, random-init {rand:.2f}; {len(texts)} documents, "
        f"{tokens:,} tokens in {seconds:.1f} s: {seconds / tokens * 1e6:.1f} s per million tokens"
    )
    assert ours < rand / 2
