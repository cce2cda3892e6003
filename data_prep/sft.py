"""Fine-tuning samples: tokens with a loss mask, one document per sample.

Two sources feed this module's encoder (run in the tokenizer workers like data_prep.encode's): prompt/response
JSON lines (sft_jsonl: the prompt, then the response and EOD, only the response trained on; optionally through the
tokenizer's chat template) and pre-tokenized rows (govreport_mlperf: MLPerf's `input_ids` and `labels`, -100
where masked). Unlike a pretraining corpus, where a bad line is skipped and counted, fine-tuning data is curated:
a sample without its fields, with an empty response or (truncation off) longer than max_length stops the shard
with one line naming it, and nothing is written.

The loss mask holds one byte per token: 1 where the token is a target (predicted from the tokens before it), 0 for
prompt tokens. It is written as a second megatron indexed dataset, `<prefix>.loss_mask.{bin,idx}`, with the same
sequence lengths as the tokens' (data_prep.pipeline).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass
from typing import Any, Optional, Union

import numpy as np

from common.config import DataPreparationConfig, GovReportData, SftData, SftJsonlData
from data_prep.encode import Encoded
from data_prep.readers import Chunk


MASK_DTYPE = np.uint8
IGNORE_INDEX = -100  # Hugging Face's label for "no loss here", as MLPerf's rows carry it


class SampleError(ValueError):
    """A sample that cannot be trained on as configured; the message names it (file:line, sample index)."""


@dataclass(frozen=True)
class SftSettings:
    """The keys of a fine-tuning source the encoder reads (hashed into the shard's fingerprint)."""

    kind: str  # prompt_response (sft_jsonl) | pretokenized (govreport_mlperf)
    prompt_key: str = ""
    response_key: str = ""
    chat_template: bool = False
    max_length: Optional[int] = None
    truncate: bool = False


def sft_settings(dp: DataPreparationConfig) -> Optional[SftSettings]:
    """The fine-tuning settings of a data_preparation section; None for a pretraining source."""
    if isinstance(dp, SftJsonlData):
        return SftSettings(
            "prompt_response", dp.prompt_key, dp.response_key, dp.chat_template, dp.max_length, dp.truncate
        )
    if isinstance(dp, GovReportData):
        return SftSettings("pretokenized", max_length=dp.max_length, truncate=dp.truncate)
    assert not isinstance(dp, SftData), f"{type(dp).__name__} has no encoder settings"
    return None


class SftEncoder:
    """Chunks of JSON lines (or of rows, as data_prep.readers hands parquet on) into samples with loss masks.
    Built in the parent and inherited by forked workers, like data_prep.encode.ChunkEncoder."""

    def __init__(self, tokenizer, dtype: Union[str, type], settings: SftSettings, append_eod: bool = True):
        self.tokenizer = tokenizer
        self.eod = int(tokenizer.eod)
        self.vocab_size = int(tokenizer.vocab_size)
        self.dtype = np.dtype(dtype)
        self.s = settings
        self.append_eod = append_eod
        self._chat: Any = None

    def __call__(self, chunk: Chunk) -> Encoded:
        skipped: Counter = Counter()
        examples: dict[str, list[str]] = {}
        samples: list[tuple[np.ndarray, np.ndarray]] = []
        rows: list[tuple[int, dict]] = []
        for i, raw in enumerate(chunk.data.split(b"\n")):
            line = chunk.first_line + i
            if not raw.strip():
                if i < chunk.lines:  # not the newline ending the chunk
                    skipped["blank_line"] += 1
                    examples.setdefault("blank_line", []).append(f"{chunk.source}:{line}")
                continue
            rows.append((line, _json_object(raw, chunk.source, line)))
        if self.s.kind == "pretokenized":
            samples = [self._row(obj, f"{chunk.source}:{line}", line - 1) for line, obj in rows]
        else:
            samples = self._prompt_response(rows, chunk.source)
        lengths = np.fromiter((len(t) for t, _ in samples), dtype=np.int64, count=len(samples))
        tokens = np.concatenate([t for t, _ in samples]).astype(self.dtype) if samples else np.zeros(0, self.dtype)
        mask = np.concatenate([m for _, m in samples]) if samples else np.zeros(0, MASK_DTYPE)
        return Encoded(tokens, lengths, chunk.lines, skipped, examples, loss_mask=mask)

    # -- prompt/response JSON lines ----------------------------------------------------------------------------

    def _prompt_response(self, rows: list[tuple[int, dict]], source: str) -> list[tuple[np.ndarray, np.ndarray]]:
        prompts, responses = [], []
        for line, obj in rows:
            where = f"{source}:{line}"
            prompt = self._field(obj, self.s.prompt_key, "prompt_key", where, line - 1)
            response = self._field(obj, self.s.response_key, "response_key", where, line - 1)
            if not response.strip():
                raise SampleError(
                    f"{where}: sample {line - 1} has an empty response (data_preparation.response_key="
                    f"{self.s.response_key}): nothing to train on; remove it or fix the field"
                )
            if self.s.chat_template:
                prompt, response = self._chat_texts(prompt, response, where)
            prompts.append(prompt)
            responses.append(response)
        prompt_ids = self.tokenizer.encode_batch(prompts) if prompts else []
        response_ids = self.tokenizer.encode_batch(responses) if responses else []
        samples = []
        for (line, _), p, r in zip(rows, prompt_ids, response_ids):
            end = [self.eod] if self.append_eod else []
            tokens = np.concatenate([np.asarray(p, np.int64), np.asarray(r, np.int64), np.asarray(end, np.int64)])
            mask = np.zeros(len(tokens), MASK_DTYPE)
            mask[len(p) :] = 1
            samples.append(self._limit(tokens, mask, f"{source}:{line}", line - 1))
        return samples

    def _field(self, obj: dict, key: str, setting: str, where: str, index: int) -> str:
        if key not in obj:
            keys = ", ".join(sorted(obj)) or "none"
            raise SampleError(
                f"{where}: sample {index} has no {key!r} field (its fields: {keys}); set "
                f"data_preparation.{setting} to the field that holds it"
            )
        value = obj[key]
        if not isinstance(value, str):
            raise SampleError(f"{where}: sample {index}: {key!r} is {type(value).__name__}, not a string")
        return value

    def _chat_texts(self, prompt: str, response: str, where: str) -> tuple[str, str]:
        """The prompt turn (with the generation prompt that opens the answer) and the rest of the conversation,
        as the tokenizer's chat template renders them; the rest is what the model is trained to write."""
        if self._chat is None:
            from transformers import AutoTokenizer

            self._chat = AutoTokenizer.from_pretrained(os.path.dirname(self.tokenizer.path))
            if not self._chat.chat_template:  # a hub tokenizer the plan could not look into
                raise SampleError(
                    f"data_preparation.chat_template=true: tokenizer {self.tokenizer.name} has no chat template; "
                    "set data_preparation.chat_template=false, or use a tokenizer that has one"
                )
        user = [{"role": "user", "content": prompt}]
        head = self._chat.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
        full = self._chat.apply_chat_template(user + [{"role": "assistant", "content": response}], tokenize=False)
        if not full.startswith(head):
            raise SampleError(
                f"{where}: the chat template renders the conversation without the prompt turn as its start, so the "
                "response cannot be told apart; set data_preparation.chat_template=false"
            )
        return head, full[len(head) :]

    # -- pre-tokenized rows (MLPerf's GovReport) -----------------------------------------------------------------

    def _row(self, obj: dict, where: str, index: int) -> tuple[np.ndarray, np.ndarray]:
        missing = [k for k in ("input_ids", "labels") if k not in obj]
        if missing:
            keys = ", ".join(sorted(obj)) or "none"
            raise SampleError(f"{where}: sample {index} has no {' or '.join(missing)} (its fields: {keys})")
        ids, labels = np.asarray(obj["input_ids"], np.int64), np.asarray(obj["labels"], np.int64)
        if ids.ndim != 1 or ids.shape != labels.shape:
            raise SampleError(f"{where}: sample {index}: input_ids and labels are not lists of the same length")
        if "attention_mask" in obj and obj["attention_mask"] is not None:
            keep = np.asarray(obj["attention_mask"], np.int64) != 0  # 0: padding, never a token of the sample
            if keep.shape != ids.shape:
                raise SampleError(f"{where}: sample {index}: attention_mask and input_ids differ in length")
            ids, labels = ids[keep], labels[keep]
        mask = labels != IGNORE_INDEX
        if np.any(labels[mask] != ids[mask]):
            raise SampleError(
                f"{where}: sample {index}: labels differ from input_ids where not {IGNORE_INDEX} (MLPerf's rows "
                "carry the unshifted input ids as labels)"
            )
        if not mask.any():
            raise SampleError(f"{where}: sample {index} has an empty response: every label is {IGNORE_INDEX}")
        if len(ids) and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise SampleError(
                f"{where}: sample {index} has token id {int(ids.max())}, outside the tokenizer's {self.vocab_size} "
                "(the rows need Llama 2's tokenizer: set data_preparation.tokenizer)"
            )
        return self._limit(ids, mask.astype(MASK_DTYPE), where, index)

    # -- both ----------------------------------------------------------------------------------------------------

    def _limit(self, tokens: np.ndarray, mask: np.ndarray, where: str, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Samples longer than max_length: cut, or refused with the sample named."""
        limit = self.s.max_length
        if limit is None or len(tokens) <= limit:
            return tokens, mask
        if not self.s.truncate:
            raise SampleError(
                f"{where}: sample {index} has {len(tokens):,} tokens, more than data_preparation.max_length="
                f"{limit}; set data_preparation.truncate=true (training.data.truncate) to cut it, or shorten it"
            )
        return tokens[:limit], mask[:limit]


def _json_object(raw: bytes, source: str, line: int) -> dict:
    try:
        obj = json.loads(raw)
    except ValueError:
        obj = None
    if not isinstance(obj, dict):
        raise SampleError(f"{source}:{line}: sample {line - 1} is not a JSON object")
    return obj
