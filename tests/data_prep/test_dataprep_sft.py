"""Fine-tuning sources (sft_jsonl, govreport_mlperf): tokens and loss masks against a plain computation from the
samples, byte-identical output after an interrupted and resumed run, MLPerf's GovReport rows from a local copy,
truncation and refusal of long samples, and bad samples as one line with nothing written."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from data_prep.shards import LOSS_MASK
from data_prep.tokenizer import load_tokenizer
from dataprep_helpers import REPO, make_docs, write_config
from test_dataprep_pipeline import read_documents, run_cli

SP = "sentencepiece"


def write_samples(path: Path, pairs: list[tuple[str, str]], prompt_key="prompt", response_key="response") -> Path:
    path.write_text("".join(json.dumps({prompt_key: p, response_key: r}) + "\n" for p, r in pairs), encoding="utf-8")
    return path


def make_pairs(n: int, seed: int, words_max: int = 40) -> list[tuple[str, str]]:
    prompts, responses = make_docs(n, seed, words_max), make_docs(n, seed + 1000, words_max)
    return list(zip(prompts, responses))


def sft_outputs(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.glob("*_sft_document*")) if p.suffix in (".bin", ".idx")}


def expected_sample(tok, prompt: str, response: str) -> tuple[list[int], list[int]]:
    """The plain computation: prompt ids, response ids, EOD; the mask is 1 on the response and the EOD."""
    p, r = list(tok.encode(prompt)), list(tok.encode(response))
    return p + r + [tok.eod], [0] * len(p) + [1] * (len(r) + 1)


def sft_config(tmp: Path, tokenizers_dir, inputs, out: Path, name="sft_jsonl", **overrides) -> Path:
    overrides.setdefault("workers", 1)
    overrides.setdefault("max_length", None)
    if inputs is not None:
        overrides["inputs"] = inputs
    return write_config(tmp / "c.yaml", name, (SP, tokenizers_dir[SP]), out, **overrides)


def test_tokens_masks_and_boundaries_match_a_plain_computation(tmp_path, capsys, tokenizers_dir):
    pairs = make_pairs(50, seed=1)
    src = write_samples(tmp_path / "train.jsonl", pairs, "question", "answer")
    out = tmp_path / "out"
    cfg = sft_config(tmp_path, tokenizers_dir, [str(src)], out, prompt_key="question", response_key="answer", workers=2)
    rc, stdout, stderr = run_cli(capsys, "run", "--config", cfg, "--no-progress")
    assert rc == 0, stdout + stderr
    prefix = str(out / "train_sft_document")
    tokens, masks = read_documents(prefix), read_documents(prefix + LOSS_MASK)
    tok = load_tokenizer(SP, tokenizers_dir[SP])
    assert len(tokens) == len(masks) == len(pairs)  # one document per sample, the same boundaries in both
    for (prompt, response), ids, mask in zip(pairs, tokens, masks):
        want_ids, want_mask = expected_sample(tok, prompt, response)
        assert ids.tolist() == want_ids and mask.tolist() == want_mask
    marker = json.loads(Path(prefix + ".done.json").read_text())
    assert marker["documents"] == 50 and set(marker["loss_mask"]) == {"bin_bytes", "idx_bytes"}
    assert run_cli(capsys, "verify", "--config", cfg)[0] == 0


def test_interrupted_run_resumes_byte_identical(tmp_path, capsys, tokenizers_dir):
    """Kill the process group while the second of three files is written, then run again."""
    inputs = [
        str(write_samples(tmp_path / "s0.jsonl", make_pairs(100, seed=1))),
        str(write_samples(tmp_path / "s1.jsonl", make_pairs(6000, seed=2, words_max=120))),
        str(write_samples(tmp_path / "s2.jsonl", make_pairs(100, seed=3))),
    ]
    ref = tmp_path / "reference"
    (tmp_path / "r").mkdir()
    cfg_ref = sft_config(tmp_path / "r", tokenizers_dir, inputs, ref, workers=2, chunk_bytes=65536)
    assert run_cli(capsys, "run", "--config", cfg_ref)[0] == 0

    out = tmp_path / "out"
    cfg = sft_config(tmp_path, tokenizers_dir, inputs, out, workers=2, chunk_bytes=65536)
    proc = subprocess.Popen(
        [sys.executable, "-m", "data_prep", "run", "--config", str(cfg), "--no-progress"],
        cwd=REPO,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    mask_tmp = out / f"s1_sft_document{LOSS_MASK}.bin.tmp"
    deadline = time.time() + 120
    while not ((out / "s0_sft_document.done.json").exists() and mask_tmp.exists() and mask_tmp.stat().st_size > 0):
        assert proc.poll() is None and time.time() < deadline, proc.stdout.read().decode() if proc.stdout else ""
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    if proc.stdout:
        proc.stdout.close()
    assert not (out / "s1_sft_document.done.json").exists() and not (out / "s1_sft_document.bin").exists()

    rc, stdout, _ = run_cli(capsys, "run", "--config", cfg)
    assert rc == 0 and "s0: already done" in stdout and "s1: done in" in stdout and "s2: done in" in stdout
    assert sft_outputs(out) == sft_outputs(ref) and len(sft_outputs(out)) == 12  # 3 x tokens and mask, .bin/.idx
    assert not list(out.glob("*.tmp")) and not list(out.glob("*.lock"))


def govreport_rows(seed: int, n: int, vocab: int, masked_prompt: bool) -> list[dict]:
    """Rows of MLPerf's schema (mlcommons/training llama2_70b_lora scripts/utils.py): input_ids; labels equal to
    them, or -100 over the prompt and the last token (its validation rows); attention_mask all ones."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        ids = rng.integers(3, vocab, size=int(rng.integers(20, 60))).tolist()
        labels = list(ids)
        if masked_prompt:
            cut = int(rng.integers(5, 15))
            labels[:cut] = [-100] * cut
            labels[-1] = -100
        rows.append({"input_ids": ids, "labels": labels, "attention_mask": [1] * len(ids)})
    return rows


def write_govreport(directory: Path, split: str, rows: list[dict], parquet: bool = False) -> str:
    directory.mkdir(exist_ok=True)
    if parquet:
        pa = pytest.importorskip("pyarrow")
        import pyarrow.parquet as pq

        name = f"{split}-00000-of-00001.parquet"
        pq.write_table(pa.Table.from_pylist(rows), directory / name)
        return name
    name = f"{split}.jsonl"
    (directory / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return name


@pytest.mark.parametrize("parquet", [False, True], ids=["json", "parquet"])
def test_govreport_rows_from_a_local_copy(tmp_path, capsys, tokenizers_dir, parquet):
    copy = tmp_path / "scrolls_gov_report_8k"
    train, valid = govreport_rows(1, 12, 400, False), govreport_rows(2, 5, 400, True)
    # A padded row: attention_mask 0 marks padding, which is dropped.
    valid[0] = {**valid[0], "input_ids": valid[0]["input_ids"] + [0, 0], "labels": valid[0]["labels"] + [-100] * 2}
    valid[0]["attention_mask"] = [1] * (len(valid[0]["input_ids"]) - 2) + [0, 0]
    files = {"train_files": [write_govreport(copy, "train", train, parquet)]}
    files["validation_files"] = [write_govreport(copy, "validation", valid, parquet)]
    out = tmp_path / "out"
    cfg = sft_config(tmp_path, tokenizers_dir, None, out, name="govreport_mlperf", base_url=str(copy), **files)
    rc, stdout, stderr = run_cli(capsys, "run", "--config", cfg, "--no-progress")
    assert rc == 0, stdout + stderr
    for split, rows in (("train", train), ("validation", valid)):
        prefix = str(out / f"govreport_{split}_sft_document")
        tokens, masks = read_documents(prefix), read_documents(prefix + LOSS_MASK)
        assert len(tokens) == len(rows)
        for row, ids, mask in zip(rows, tokens, masks):
            keep = np.asarray(row["attention_mask"]) == 1
            assert ids.tolist() == np.asarray(row["input_ids"])[keep].tolist()
            assert mask.tolist() == (np.asarray(row["labels"])[keep] != -100).astype(int).tolist()


def long_and_short(tmp_path: Path) -> Path:
    return write_samples(tmp_path / "a.jsonl", [("short", "answer"), ("a long prompt " * 40, "and its answer " * 40)])


def test_long_samples_are_truncated_when_asked(tmp_path, capsys, tokenizers_dir):
    out = tmp_path / "out"
    cfg = sft_config(tmp_path, tokenizers_dir, [str(long_and_short(tmp_path))], out, max_length=32, truncate=True)
    assert run_cli(capsys, "run", "--config", cfg, "--no-progress")[0] == 0
    tok = load_tokenizer(SP, tokenizers_dir[SP])
    tokens, masks = read_documents(str(out / "a_sft_document")), read_documents(str(out / f"a_sft_document{LOSS_MASK}"))
    want = [
        expected_sample(tok, "short", "answer"),
        expected_sample(tok, "a long prompt " * 40, "and its answer " * 40),
    ]
    assert len(want[1][0]) > 32  # the second really is cut
    assert [t.tolist() for t in tokens] == [want[0][0], want[1][0][:32]]
    assert [m.tolist() for m in masks] == [want[0][1], want[1][1][:32]]


BAD_SAMPLES = [
    # (the second sample's line, extra overrides, what the one line says)
    ('{"prompt": "hi", "answer": "no response key"}', {}, "a.jsonl:2: sample 1 has no 'response' field"),
    ('{"prompt": "hi", "response": "   "}', {}, "a.jsonl:2: sample 1 has an empty response"),
    (
        json.dumps({"prompt": "a long prompt " * 40, "response": "x"}),
        {"max_length": 32, "truncate": False},
        "a.jsonl:2: sample 1 has",
    ),
    ("not json", {}, "a.jsonl:2: sample 1 is not a JSON object"),
]


@pytest.mark.parametrize("line,overrides,says", BAD_SAMPLES, ids=["missing field", "empty", "too long", "not json"])
def test_a_bad_sample_is_one_line_and_nothing_is_written(tmp_path, capsys, tokenizers_dir, line, overrides, says):
    src = tmp_path / "a.jsonl"
    src.write_text(json.dumps({"prompt": "fine", "response": "fine"}) + "\n" + line + "\n")
    out = tmp_path / "out"
    cfg = sft_config(tmp_path, tokenizers_dir, [str(src)], out, **overrides)
    rc, stdout, stderr = run_cli(capsys, "run", "--config", cfg, "--no-progress")
    assert rc == 1
    failures = [x for x in (stdout + stderr).splitlines() if "FAILED" in x or "failed" in x]
    assert failures and all(says in x for x in failures[:1]), stdout + stderr
    assert "Traceback" not in stdout + stderr
    assert not [p for p in out.iterdir()] if out.exists() else True


def test_chat_template_the_tokenizer_lacks_is_one_line(tmp_path, capsys, tokenizers_dir):
    src = write_samples(tmp_path / "a.jsonl", make_pairs(2, seed=1))
    out = tmp_path / "out"
    cfg = write_config(
        tmp_path / "c.yaml",
        "sft_jsonl",
        ("huggingface", tokenizers_dir["huggingface"]),
        out,
        inputs=[str(src)],
        chat_template=True,
        workers=1,
    )
    rc, stdout, stderr = run_cli(capsys, "run", "--config", cfg)
    assert rc == 2 and len(stderr.splitlines()) == 1 and "data_preparation.chat_template=true: tokenizer" in stderr
    assert "has no chat_template" in stderr and not out.exists()


def test_chat_template_masks_the_prompt_turn(tmp_path, capsys, tokenizers_dir):
    pytest.importorskip("transformers")
    tok_dir = tmp_path / "tok"
    tok_dir.mkdir()
    (tok_dir / "tokenizer.json").write_bytes((Path(tokenizers_dir["huggingface"]) / "tokenizer.json").read_bytes())
    template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</s>{% endfor %}"
    template += "{% if add_generation_prompt %}<assistant>{% endif %}"
    config = json.loads((Path(tokenizers_dir["huggingface"]) / "tokenizer_config.json").read_text())
    (tok_dir / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": template}))
    pairs = make_pairs(3, seed=4)
    src = write_samples(tmp_path / "a.jsonl", pairs)
    out = tmp_path / "out"
    cfg = write_config(
        tmp_path / "c.yaml", "sft_jsonl", ("huggingface", str(tok_dir)), out, inputs=[str(src)], chat_template=True
    )
    rc, stdout, stderr = run_cli(capsys, "run", "--config", cfg, "data_preparation.workers=1", "--no-progress")
    assert rc == 0, stdout + stderr
    tok = load_tokenizer("huggingface", str(tok_dir))
    tokens, masks = read_documents(str(out / "a_sft_document")), read_documents(str(out / f"a_sft_document{LOSS_MASK}"))
    for (prompt, response), ids, mask in zip(pairs, tokens, masks):
        head = list(tok.encode(f"<user>{prompt}</s><assistant>"))
        tail = list(tok.encode(f"{response}</s>"))
        assert ids.tolist() == head + tail  # no EOD: the template ends the turn
        assert mask.tolist() == [0] * len(head) + [1] * len(tail)
