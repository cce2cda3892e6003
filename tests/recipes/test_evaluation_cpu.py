"""The held-out perplexity task on the CPU: a small random-init Llama built by megatron-core, saved as training
saves and exported by our exporter, evaluated through lm-eval (recipes/evaluation/harness.py), gives the word
perplexity that a plain transformers loop computes on the same text with the same rolling windows."""

import functools
import json
import math
import re
from pathlib import Path

import pytest
import yaml

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")
transformers = pytest.importorskip("transformers")
pytest.importorskip("lm_eval")

import cpu_megatron  # noqa: E402
from common.evaluation import HELDOUT_TASK, RESULTS_DIR, TASK_ROWS, read_rows  # noqa: E402
from common.typed import to_plain  # noqa: E402
from launcher.config.compose import compose  # noqa: E402
from launcher.plan.build import build_plan  # noqa: E402
from launcher.plan.hardware import LocalGpus  # noqa: E402
from recipes.evaluation.harness import run_harness  # noqa: E402
from recipes.hf import exporter  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(600)
WINDOW = 24  # tokens per rolling window: several windows per document

SMALL = [
    "training=llama31/tiny",
    "training.model.vocab_size=320",
    "training.model.num_layers=2",
    "training.model.hidden_size=64",
    "training.model.ffn_hidden_size=96",
    "training.model.num_attention_heads=4",
    "training.model.num_query_groups=2",
    "training.model.kv_channels=16",
    # Large random weights: predictions depend on the context, so a window placed differently changes the result.
    "training.model.init_method_std=0.1",
    "training.seq_length=32",
    "training.micro_batch_size=1",
    "training.global_batch_size=1",
    "parallelism=tp1",
]
TEXT = (
    "The lazy dog sleeps under the old oak tree while the quick brown fox runs across the field. "
    "Rain falls on the roof of the farmhouse, and the farmer counts his sheep before the night comes. "
)


def write_tokenizer(directory: Path) -> None:
    """A byte-level BPE with Llama 3's special tokens (an export copies it)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    directory.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([TEXT] * 20, trainer=trainer)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "bos_token": "<|begin_of_text|>",
                "eos_token": "<|end_of_text|>",
                "tokenizer_class": "PreTrainedTokenizerFast",
            }
        )
    )


def init_and_save(rank: int, cfg, plan, run_dir: str) -> str:
    torch.manual_seed(0)
    chunks = cpu_megatron.build_chunks(cfg, plan)
    return cpu_megatron.save_checkpoint(rank, chunks, run_dir, step=1)


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict:
    """A run directory with a random-init checkpoint, exported to Hugging Face format by our exporter."""
    root = tmp_path_factory.mktemp("evaluation")
    write_tokenizer(root / "tokenizer")
    cfg = compose([*SMALL, "training.tokenizer.type=huggingface", f"training.tokenizer.path={root / 'tokenizer'}"])
    plan = build_plan(cfg, LocalGpus(1, "h100", ("gpu",)))
    run_dir = root / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(yaml.safe_dump(to_plain(cfg)))
    cpu_megatron.run_ranks(init_and_save, 1, cfg, plan, str(run_dir))
    # Our exporter, as `python -m recipes.hf.exporter --checkpoint RUN/checkpoints --out RUN/hf` runs it.
    assert (
        exporter.main(
            ["--checkpoint", str(run_dir / "checkpoints"), "--out", str(run_dir / "hf")]
            + ["--dtype", "float32", "--no-progress"]
        )
        == 0
    )
    docs = [TEXT * (i + 1) + f"Document {i} ends here." for i in range(4)] + ["Short one."]
    heldout = root / "heldout.jsonl"
    heldout.write_text("".join(json.dumps({"text": doc}) + "\n" for doc in docs))
    return {"root": root, "run_dir": run_dir, "hf": run_dir / "hf", "docs": docs, "heldout": heldout}


def windows(tokens: list[int], prefix: int, length: int) -> list[tuple[list[int], int]]:
    """Rolling windows of `length` tokens over a document: (the window's input tokens, how many of its last
    positions are scored). The first window predicts the first `length` tokens after the prefix token; each next
    one predicts the next `length` tokens (fewer at the end), seeing as many tokens before them as fit."""
    first = min(length, len(tokens))
    out = [([prefix] + tokens[: first - 1], first)]
    done = first
    while done < len(tokens):
        end = min(done + length, len(tokens))
        out.append((tokens[end - length - 1 : end - 1], end - done))
        done = end
    return out


def reference_word_perplexity(hf_dir: Path, docs: list[str], length: int) -> float:
    """exp(-(sum of every token's log-likelihood) / (words)), token by token in plain transformers."""
    model, tokenizer = loaded(str(hf_dir))
    total, words = 0.0, 0
    for doc in docs:
        tokens = tokenizer(doc, add_special_tokens=False)["input_ids"]
        targets = list(tokens)
        scored = []
        for inputs, count in windows(tokens, tokenizer.bos_token_id, length):
            with torch.no_grad():
                logits = model(torch.tensor([inputs])).logits[0].double()
            logprobs = torch.log_softmax(logits, dim=-1)
            # position p predicts the token after inputs[p]; the window's last `count` positions are scored.
            predicted = list(range(len(inputs) - count, len(inputs)))
            scored += [(p, inputs, logprobs) for p in predicted]
        assert len(scored) == len(targets)
        for target, (p, _, logprobs) in zip(targets, scored):
            total += logprobs[p, target].item()
        words += len(re.split(r"\s+", doc))
    return math.exp(-total / words)


@functools.lru_cache(maxsize=1)
def loaded(hf_dir: str):
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    return model, transformers.AutoTokenizer.from_pretrained(hf_dir)


def test_heldout_perplexity_through_lm_eval_equals_a_plain_transformers_loop(exported):
    cfg = compose(
        [
            *SMALL,
            "evaluation.tasks=[]",
            f"evaluation.heldout=[{exported['heldout']}]",
            f"evaluation.model={exported['hf']}",
            "evaluation.dtype=float32",
            f"evaluation.heldout_max_length={WINDOW}",
            f"evaluation.data_dir={exported['root'] / 'data'}",
        ]
    )
    run_harness(cfg, str(exported["run_dir"]), device="cpu", say=lambda line: None)
    rows = {(r.task, r.metric): r.value for r in read_rows(str(exported["run_dir"]))}
    assert (exported["run_dir"] / RESULTS_DIR / TASK_ROWS).is_file()
    assert set(rows) == {(HELDOUT_TASK, m) for m in ("word_perplexity", "byte_perplexity", "bits_per_byte")}
    ours = rows[(HELDOUT_TASK, "word_perplexity")]
    reference = reference_word_perplexity(exported["hf"], exported["docs"], WINDOW)
    print(f"\nheld-out word perplexity: lm-eval {ours:.4f}, transformers loop {reference:.4f}")
    assert abs(ours / reference - 1) < 0.005
    # A window of another length gives another perplexity: the comparison sees where the windows fall.
    assert abs(reference_word_perplexity(exported["hf"], exported["docs"], WINDOW // 2) / reference - 1) > 0.005
    # bits per byte and byte perplexity are the same log-likelihood over the bytes.
    assert rows[(HELDOUT_TASK, "bits_per_byte")] == pytest.approx(math.log2(rows[(HELDOUT_TASK, "byte_perplexity")]))
