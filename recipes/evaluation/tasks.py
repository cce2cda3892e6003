"""The held-out perplexity task: the user's JSON-lines or text files as one lm-eval task with rolling
log-likelihood (word perplexity, byte perplexity, bits per byte), read by `dataset_path: json` from a local file,
so no hub is involved."""

from __future__ import annotations

import json
import os
from pathlib import Path

from common.evaluation import HELDOUT_TASK
from common.files import atomic_write

# metric -> lm-eval's aggregation over documents (sums of log-likelihoods over sums of words or bytes).
METRICS = {
    "word_perplexity": "weighted_perplexity",
    "byte_perplexity": "weighted_perplexity",
    "bits_per_byte": "bits_per_byte",
}


class HeldoutError(ValueError):
    """A held-out file that cannot be read; str() is one line naming it."""


def heldout_documents(files: list[str], text_key: str) -> list[str]:
    """The documents of the files in order: each line of a .jsonl/.json/.ndjson file holds one (its text_key),
    any other file is one document."""
    docs: list[str] = []
    for name in files:
        path = Path(name)
        if not path.is_file():
            raise HeldoutError(f"evaluation.heldout: {name} is not a file")
        if path.suffix in (".jsonl", ".json", ".ndjson"):
            with open(path, encoding="utf-8") as f:
                for number, line in enumerate(f, start=1):
                    if not line.strip():
                        continue
                    try:
                        text = json.loads(line)[text_key]
                    except (ValueError, KeyError, TypeError):
                        raise HeldoutError(
                            f"evaluation.heldout: {name} line {number} is not a JSON object with the key "
                            f"{text_key!r} (evaluation.heldout_text_key)"
                        ) from None
                    if text:
                        docs.append(str(text))
        else:
            text = path.read_text(encoding="utf-8")
            if text:
                docs.append(text)
    if not docs:
        raise HeldoutError(f"evaluation.heldout: {', '.join(files)} hold no documents")
    return docs


def task_yaml(data_file: str) -> str:
    """The task, as lm-eval's wikitext is built: the whole document is the target of one rolling log-likelihood
    request, scored in windows of the model's max_length."""
    config = {
        "task": HELDOUT_TASK,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": data_file}},
        "test_split": "test",
        "output_type": "loglikelihood_rolling",
        "doc_to_text": "",
        "doc_to_target": "{{text}}",
        "should_decontaminate": False,
        "metric_list": [
            {"metric": metric, "aggregation": aggregation, "higher_is_better": False}
            for metric, aggregation in METRICS.items()
        ],
        "metadata": {"version": 1.0},
    }
    return json.dumps(config, indent=2) + "\n"  # JSON is YAML


def write_heldout_task(files: list[str], text_key: str, directory: str) -> str:
    """The task's YAML and its data (one JSON line per document) in `directory`; returns the directory, for
    lm-eval's include_path."""
    docs = heldout_documents(files, text_key)
    os.makedirs(directory, exist_ok=True)
    data_file = os.path.join(os.path.abspath(directory), f"{HELDOUT_TASK}.jsonl")
    atomic_write(data_file, "".join(json.dumps({"text": doc}) + "\n" for doc in docs))
    atomic_write(os.path.join(directory, f"{HELDOUT_TASK}.yaml"), task_yaml(data_file))
    return directory
