"""Train a tokenizer on local files, for offline use (the Llama 3 tokenizer is gated) and for tests.

sentencepiece: a BPE (or unigram) model in the Llama 2 / Mixtral style: byte fallback (no unknown characters),
identity normalization and kept whitespace, so decode(encode(text)) == text. huggingface: a byte-level BPE
like Llama 3's, with <|begin_of_text|> / <|end_of_text|> special tokens. Both end documents with their EOS.
"""

from __future__ import annotations

import json
import os
from typing import Iterator, Optional, Sequence

from data_prep.readers import iter_chunks
from data_prep.shards import Source, detect_format

EOD_TOKEN = "<|end_of_text|>"
BOS_TOKEN = "<|begin_of_text|>"


def iter_texts(paths: Sequence[str], text_key: str = "text", max_documents: Optional[int] = None) -> Iterator[str]:
    """Documents of .jsonl/.json[.zst|.gz] (under `text_key`) or plain-text files (one per line); lines that
    are not usable documents are left out."""
    sources = []
    for path in paths:
        compression, kind = detect_format(path)
        sources.append(Source(uri=path, local_path=os.path.abspath(path), compression=compression, kind=kind))
    n = 0
    for chunk in iter_chunks(sources, 1 << 20, "line"):
        for raw in chunk.data.split(b"\n"):
            try:
                text = raw.decode("utf-8")
                if chunk.kind == "jsonl":
                    text = json.loads(text)[text_key] if text.strip() else ""
                if isinstance(text, str):
                    text.encode("utf-8")  # lone surrogates from JSON escapes are not text
            except (ValueError, KeyError, TypeError):  # (UnicodeError is a ValueError)
                continue
            if isinstance(text, str) and text.strip():
                yield text
                n += 1
                if max_documents is not None and n >= max_documents:
                    return


def train_sentencepiece(
    inputs: Sequence[str],
    model_prefix: str,
    vocab_size: int,
    text_key: str = "text",
    model_type: str = "bpe",
    max_documents: Optional[int] = None,
) -> str:
    """Writes `<model_prefix>.model` (and .vocab); returns the .model path."""
    import sentencepiece as spm

    def sentences() -> Iterator[str]:
        # sentencepiece learns from lines; a document's newlines are encoded through byte fallback.
        for text in iter_texts(inputs, text_key, max_documents):
            for line in text.split("\n"):
                if line.strip():
                    yield line

    os.makedirs(os.path.dirname(os.path.abspath(model_prefix)), exist_ok=True)
    spm.SentencePieceTrainer.train(
        sentence_iterator=sentences(),
        model_prefix=model_prefix,
        vocab_size=vocab_size,
        model_type=model_type,
        byte_fallback=True,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        split_digits=True,
        allow_whitespace_only_pieces=True,
        character_coverage=0.9995,
        hard_vocab_limit=False,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        num_threads=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1,
        minloglevel=2,
    )
    return model_prefix + ".model"


def train_bpe(
    inputs: Sequence[str], directory: str, vocab_size: int, text_key: str = "text", max_documents: Optional[int] = None
) -> str:
    """Writes `<directory>/tokenizer.json` (+ tokenizer_config.json naming the EOS); returns the directory."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BOS_TOKEN, EOD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(iter_texts(inputs, text_key, max_documents), trainer)
    os.makedirs(directory, exist_ok=True)
    tok.save(os.path.join(directory, "tokenizer.json"))
    with open(os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"bos_token": BOS_TOKEN, "eos_token": EOD_TOKEN}, f, indent=2)
    return directory
