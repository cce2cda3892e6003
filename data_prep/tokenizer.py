"""One tokenizer interface for data preparation and training: Hugging Face `tokenizers` or sentencepiece.

    tok = load_tokenizer("huggingface", "meta-llama/Llama-3.1-8B")   # hub id (HF_TOKEN), local dir or tokenizer.json
    tok = load_tokenizer("sentencepiece", "/models/tokenizer.model")   # .model file, dir holding one, or hub id
    tok.encode(text) -> list[int]; tok.decode(ids) -> str; tok.vocab_size; tok.eod

Documents are encoded without BOS; data preparation appends `eod` after each one. megatron's GPTDataset reads
`vocab_size` and `eod` from this object. It deliberately has no `pad`: megatron masks labels equal to the pad id
out of the loss, and every id a tokenizer owns can occur in real data, so megatron's own sentinel (-1) is the
safe choice. Imports only the tokenizer libraries (lazily), never torch or Hydra.
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Callable, Optional, Sequence, Union

# The id appended after each document, by preference: Llama 3's end-of-text token, then the tokenizer's
# declared eos token, then common spellings of it.
_EOD_CANDIDATES = ("<|end_of_text|>",)
_EOS_FALLBACKS = ("<|endoftext|>", "</s>", "<eos>", "<|eos|>")


class TokenizerError(RuntimeError):
    """The tokenizer cannot be found or used; the message says what to change."""


class _Identified:
    """megatron's datasets hash `tokenizer.unique_identifiers` into their cache keys (index files built for one
    tokenizer must not be reused with another)."""

    @property
    def unique_identifiers(self) -> dict:
        if getattr(self, "_unique", None) is None:
            self._unique = {"class": type(self).__name__, "name": self.name, "vocab_size": self.vocab_size,
                            "eod": self.eod, "sha256": tokenizer_digest(self)}
        return self._unique


def _pick_eod(name: str, eod: Union[int, str, None], declared_eos: list, token_id: Callable[[str], Optional[int]],
              hint: str = "") -> int:
    """The end-of-document id: `eod` itself when an id, its id when a token, else the first known end token
    the vocabulary has (Llama 3's, then what the tokenizer declares as EOS, then common ones)."""
    if isinstance(eod, int):
        return eod
    candidates = [eod] if eod else [t for t in (*_EOD_CANDIDATES, *declared_eos, *_EOS_FALLBACKS) if t]
    for token in candidates:
        found = token_id(token)
        if found is not None:
            return found
    raise TokenizerError(f"tokenizer {name}: no end-of-document token (tried {', '.join(candidates)}){hint}")


class HFTokenizer(_Identified):
    """A Hugging Face fast tokenizer (tokenizer.json) through the `tokenizers` library."""

    type = "huggingface"

    def __init__(self, tokenizer_json: str, eod: Union[int, str, None] = None, name: Optional[str] = None):
        from tokenizers import Tokenizer

        self.path = os.path.abspath(tokenizer_json)
        self.name = name or self.path
        self._tok = Tokenizer.from_file(self.path)
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.eod = _pick_eod(self.name, eod, _declared_eos(os.path.dirname(self.path)), self._tok.token_to_id,
                             "; add eos_token to tokenizer_config.json next to tokenizer.json")

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        # Offsets are not needed: encode_batch_fast skips computing them.
        return [e.ids for e in self._tok.encode_batch_fast(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)

    @property
    def files(self) -> list[str]:
        return [self.path]


class SentencePieceTokenizer(_Identified):
    """A sentencepiece model (Llama 2 / Mixtral style .model files); eod is the model's EOS."""

    type = "sentencepiece"

    def __init__(self, model_file: str, eod: Union[int, str, None] = None, name: Optional[str] = None):
        import sentencepiece

        self.path = os.path.abspath(model_file)
        self.name = name or self.path
        self._sp = sentencepiece.SentencePieceProcessor(model_file=self.path)
        self.vocab_size = self._sp.get_piece_size()
        self._numpy_batches = True
        if isinstance(eod, int):
            self.eod = eod
        elif eod:
            self.eod = self._sp.piece_to_id(eod)
            if self.eod == self._sp.unk_id():
                raise TokenizerError(f"tokenizer {self.name}: eod token {eod!r} is not in the vocabulary")
        else:
            self.eod = self._sp.eos_id()
            if self.eod < 0:
                raise TokenizerError(f"tokenizer {self.name}: the model has no EOS piece to end documents with "
                                     "(train it with eos_id >= 0)")

    def encode(self, text: str) -> list[int]:
        return self._sp.encode(text)

    def encode_batch(self, texts: Sequence[str]) -> list:
        """Ids per text, as numpy arrays where this sentencepiece can return them (no Python int per token),
        else lists. One thread: parallelism comes from data preparation's worker processes."""
        if self._numpy_batches:
            try:
                return self._sp.encode(list(texts), num_threads=1, return_type="numpy")
            except (TypeError, ValueError):  # an older sentencepiece without numpy output
                self._numpy_batches = False
        return self._sp.encode(list(texts), num_threads=1)

    def decode(self, ids: Sequence[int]) -> str:
        return self._sp.decode([int(i) for i in ids])

    @property
    def files(self) -> list[str]:
        return [self.path]


class TransformersTokenizer(_Identified):
    """Fallback for Hugging Face tokenizer directories without tokenizer.json (needs `transformers`)."""

    type = "huggingface"

    def __init__(self, directory: str, eod: Union[int, str, None] = None, name: Optional[str] = None):
        from transformers import AutoTokenizer

        self.path = os.path.abspath(directory)
        self.name = name or self.path
        self._tok = AutoTokenizer.from_pretrained(self.path)
        self.vocab_size = len(self._tok)
        self.eod = _pick_eod(self.name, eod, [self._tok.eos_token], self._tok.get_vocab().get)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self._tok(list(texts), add_special_tokens=False)["input_ids"]

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    @property
    def files(self) -> list[str]:
        return sorted(os.path.join(self.path, f) for f in os.listdir(self.path)
                      if os.path.isfile(os.path.join(self.path, f)))


Tokenizer = Union[HFTokenizer, SentencePieceTokenizer, TransformersTokenizer]


def load_tokenizer(type: str, path: str, eod: Union[int, str, None] = None) -> Tokenizer:
    """Load a tokenizer: type huggingface|sentencepiece; path a hub id, a local directory or file."""
    if not path:
        raise TokenizerError("tokenizer path is empty: set training.tokenizer.path "
                             "(or data_preparation.tokenizer.path)")
    path = str(path)
    local = os.path.abspath(os.path.expanduser(path))
    if type == "huggingface":
        if os.path.isfile(local):
            return HFTokenizer(local, eod, name=path)
        if os.path.isdir(local):
            if os.path.isfile(os.path.join(local, "tokenizer.json")):
                return HFTokenizer(os.path.join(local, "tokenizer.json"), eod, name=path)
            return _transformers_or_fail(local, eod, path)
        return HFTokenizer(_hub_file(path, "tokenizer.json", also=("tokenizer_config.json",)), eod, name=path)
    if type == "sentencepiece":
        if os.path.isfile(local):
            return SentencePieceTokenizer(local, eod, name=path)
        if os.path.isdir(local):
            model = os.path.join(local, "tokenizer.model")
            if not os.path.isfile(model):
                raise TokenizerError(f"tokenizer directory {path} has no tokenizer.model")
            return SentencePieceTokenizer(model, eod, name=path)
        return SentencePieceTokenizer(_hub_file(path, "tokenizer.model"), eod, name=path)
    raise TokenizerError(f"tokenizer type {type!r} is not one of huggingface, sentencepiece")


def tokenizer_digest(tok: Tokenizer) -> str:
    """sha256 over the tokenizer's files and eod: changes when the tokenizer would produce other ids."""
    h = hashlib.sha256(f"{tok.type}:{tok.eod}:{tok.vocab_size}".encode())
    for path in tok.files:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def _declared_eos(directory: str) -> list[str]:
    """eos_token from tokenizer_config.json next to tokenizer.json, if there is one."""
    try:
        with open(os.path.join(directory, "tokenizer_config.json"), encoding="utf-8") as f:
            eos = json.load(f).get("eos_token")
    except (OSError, ValueError, AttributeError):
        return []
    if isinstance(eos, dict):
        eos = eos.get("content")
    return [eos] if isinstance(eos, str) and eos else []


def _transformers_or_fail(directory: str, eod, name: str) -> Tokenizer:
    try:
        import transformers  # noqa: F401
    except ImportError:
        hint = (f"; or use tokenizer type=sentencepiece with {directory}/tokenizer.model"
                if os.path.isfile(os.path.join(directory, "tokenizer.model")) else "")
        raise TokenizerError(f"tokenizer directory {name} has no tokenizer.json and transformers is not "
                             f"installed{hint}")
    return TransformersTokenizer(directory, eod, name=name)


def _hub_file(repo_id: str, filename: str, also: Sequence[str] = ()) -> str:
    """Download one file of a hub repository into the Hugging Face cache (HF_TOKEN for gated repositories)."""
    if repo_id.count("/") != 1 or repo_id.startswith((".", "/", "~")):
        raise TokenizerError(f"tokenizer path {repo_id} does not exist (and is not a hub id like org/name)")
    try:
        from huggingface_hub import hf_hub_download
        try:
            from huggingface_hub.errors import (EntryNotFoundError, GatedRepoError, HfHubHTTPError,
                                                LocalEntryNotFoundError, RepositoryNotFoundError)
        except ImportError:  # older huggingface_hub
            from huggingface_hub.utils import (EntryNotFoundError, GatedRepoError, HfHubHTTPError,
                                               LocalEntryNotFoundError, RepositoryNotFoundError)
    except ImportError:
        raise TokenizerError(f"tokenizer {repo_id} is not a local path and huggingface_hub is not installed")
    token = os.environ.get("HF_TOKEN") or None
    try:
        path = hf_hub_download(repo_id, filename, token=token)
    except GatedRepoError:
        fix = ("export HF_TOKEN=<your token>" if token is None else "HF_TOKEN was rejected: check it")
        raise TokenizerError(f"tokenizer {repo_id} is gated on the Hugging Face hub: accept its license at "
                             f"https://huggingface.co/{repo_id} and {fix}, or point the tokenizer path at a local copy")
    except RepositoryNotFoundError:
        fix = "export HF_TOKEN=<your token> if it is private" if token is None else "check the name and HF_TOKEN"
        raise TokenizerError(f"tokenizer {repo_id}: no such repository on the Hugging Face hub ({fix})")
    except LocalEntryNotFoundError:  # (a subclass of EntryNotFoundError: test it first)
        raise TokenizerError(f"tokenizer {repo_id}: the hub cannot be reached and no cached copy exists; fetch "
                             "it where there is network (python -m data_prep download ...) or use a local path")
    except EntryNotFoundError:
        raise TokenizerError(f"tokenizer {repo_id} has no {filename} on the hub: use the other tokenizer type "
                             "or a local directory")
    except HfHubHTTPError as e:
        fix = "; export HF_TOKEN=<your token>" if token is None else ""
        raise TokenizerError(f"tokenizer {repo_id}: the Hugging Face hub refused {filename}: "
                             f"{str(e).splitlines()[0]}{fix}")
    for extra in also:
        try:
            hf_hub_download(repo_id, extra, token=token)
        except Exception:  # optional files (tokenizer_config.json only refines the eod choice)
            pass
    return path
