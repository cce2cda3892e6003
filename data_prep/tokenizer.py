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

import codecs
import hashlib
import json
import os
from typing import Callable, Optional, Sequence, Union

# The id appended after each document, by preference: Llama 3's end-of-text token, then the tokenizer's
# declared eos token, then common spellings of it.
_EOD_CANDIDATES = ("<|end_of_text|>",)
_EOS_FALLBACKS = ("<|endoftext|>", "</s>", "<eos>", "<|eos|>")


TOKENIZER_TYPES = ("huggingface", "sentencepiece")


class TokenizerError(RuntimeError):
    """The tokenizer cannot be found or used; the message says what to change."""


class _Identified:
    """megatron's datasets hash `tokenizer.unique_identifiers` into their cache keys (index files built for one
    tokenizer must not be reused with another)."""

    # What every tokenizer class has: its kind (a class attribute) and, once loaded, these.
    type: str
    name: str
    vocab_size: int
    eod: int

    @property
    def files(self) -> list[str]:
        """The files its ids depend on (each tokenizer class names its own)."""
        raise NotImplementedError

    @property
    def unique_identifiers(self) -> dict:
        if getattr(self, "_unique", None) is None:
            self._unique = {
                "class": type(self).__name__,
                "name": self.name,
                "vocab_size": self.vocab_size,
                "eod": self.eod,
                "sha256": tokenizer_digest(self),
            }
        return self._unique


def _pick_eod(
    name: str, eod: Union[int, str, None], declared_eos: list, token_id: Callable[[str], Optional[int]], hint: str = ""
) -> int:
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
        try:
            self._tok = Tokenizer.from_file(self.path)
        except Exception as e:  # the tokenizers library raises plain Exceptions for unreadable files
            raise TokenizerError(
                f"tokenizer {self.name}: {self.path} cannot be read as a Hugging Face tokenizer.json ({_first_line(e)})"
            ) from None
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.eod = _pick_eod(
            self.name,
            eod,
            _declared_eos(os.path.dirname(self.path)),
            self._tok.token_to_id,
            "; add eos_token to tokenizer_config.json next to tokenizer.json",
        )

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
        try:
            self._sp = sentencepiece.SentencePieceProcessor(model_file=self.path)
        except (RuntimeError, OSError) as e:
            raise TokenizerError(
                f"tokenizer {self.name}: {self.path} cannot be read as a sentencepiece model ({_first_line(e)})"
            ) from None
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
                raise TokenizerError(
                    f"tokenizer {self.name}: the model has no EOS piece to end documents with "
                    "(train it with eos_id >= 0)"
                )

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
        try:
            self._tok = AutoTokenizer.from_pretrained(self.path)
        except Exception as e:  # OSError, ValueError, ImportError ... depending on what the directory lacks
            raise TokenizerError(
                f"tokenizer directory {self.name} has no tokenizer.json and transformers cannot "
                f"load it either ({_first_line(e)})"
            ) from None
        self.vocab_size = len(self._tok)
        self.eod = _pick_eod(self.name, eod, [self._tok.eos_token], self._tok.get_vocab().get)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self._tok(list(texts), add_special_tokens=False)["input_ids"]

    def decode(self, ids: Sequence[int]) -> str:
        # transformers types decode's result as str | list[str]; a flat list of ids decodes to one str.
        return self._tok.decode(  # type: ignore[return-value]
            list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False
        )

    @property
    def files(self) -> list[str]:
        return sorted(
            os.path.join(self.path, f) for f in os.listdir(self.path) if os.path.isfile(os.path.join(self.path, f))
        )


Tokenizer = Union[HFTokenizer, SentencePieceTokenizer, TransformersTokenizer]


def load_tokenizer(type: str, path: str, eod: Union[int, str, None] = None, key: str = "tokenizer") -> Tokenizer:
    """Load a tokenizer: type huggingface|sentencepiece; path a hub id, a local directory or file. `key` is the
    config section the two came from, for the messages (e.g. training.tokenizer)."""
    if not path:
        raise TokenizerError(
            "tokenizer path is empty: set training.tokenizer.path (or data_preparation.tokenizer.path)"
        )
    path = str(path)
    local = os.path.abspath(os.path.expanduser(path))
    if os.path.exists(local):
        # A file of the other kind (or not a tokenizer at all) is one line saying what it is, not a parser's
        # traceback.
        problem = tokenizer_problem(type, path, key)
        if problem:
            raise TokenizerError(problem)
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
            return SentencePieceTokenizer(os.path.join(local, "tokenizer.model"), eod, name=path)
        return SentencePieceTokenizer(_hub_file(path, "tokenizer.model"), eod, name=path)
    raise TokenizerError(f"tokenizer type {type!r} is not one of huggingface, sentencepiece")


# -- telling what a tokenizer path holds, without loading it -----------------------------------------------

_KINDS = {
    "sentencepiece": "a sentencepiece model",
    "tokenizer.json": "a Hugging Face tokenizer.json",
    "json lines": "a JSON lines file (a corpus?)",
    "json": "a JSON file",
    "text": "a text file",
    "binary": "a binary file",
}
# What each type accepts: "json" and "binary" where the first bytes cannot tell (the loader still checks).
_ACCEPTS = {"huggingface": ("tokenizer.json", "json"), "sentencepiece": ("sentencepiece", "binary")}
_OTHER = {"huggingface": ("sentencepiece", "sentencepiece"), "sentencepiece": ("tokenizer.json", "huggingface")}
_WANTED = {
    "huggingface": ("a Hugging Face tokenizer", "a tokenizer.json or the directory holding it"),
    "sentencepiece": ("a sentencepiece model", "a .model file or the directory holding tokenizer.model"),
}
_SNIFF_BYTES = 1 << 16


def tokenizer_problem(type: str, path: str, key: str = "tokenizer") -> Optional[str]:
    """What makes `type`/`path` unusable, as one line naming `key` (a config section such as
    data_preparation.tokenizer), or None. Reads at most a directory listing and a file's first bytes; hub ids
    are not looked up (the hub may be out of reach from here)."""
    if type not in TOKENIZER_TYPES:
        return f"{key}.type={type!r} is not one of huggingface, sentencepiece"
    if not path:
        return f"{key}.path is not set: a hub id, a tokenizer directory or a tokenizer file"
    local = os.path.abspath(os.path.expanduser(str(path)))
    try:
        if os.path.isdir(local):
            return _directory_problem(type, set(os.listdir(local)), path, key)
        if os.path.isfile(local):
            return _file_problem(type, file_kind(local), path, key)
    except OSError as e:
        return f"{key}.path={path} cannot be read ({e.strerror}); check its permissions"
    if os.path.exists(local) or is_hub_id(str(path)):
        return None
    return f"{key}.path={path} does not exist (and is not a hub id like org/name)"


def vocabulary_size(type: str, path: str) -> Optional[int]:
    """How many token ids a local tokenizer uses (its largest id + 1), read without the tokenizer libraries: the
    pieces of a sentencepiece model, the vocabulary and added tokens of a tokenizer.json. None where that cannot
    be told from here (a hub id, a directory for transformers' AutoTokenizer, an unreadable file)."""
    local = os.path.abspath(os.path.expanduser(str(path)))
    if os.path.isdir(local):
        local = os.path.join(local, "tokenizer.model" if type == "sentencepiece" else "tokenizer.json")
    try:
        with open(local, "rb") as f:
            data = f.read()
    except OSError:
        return None
    return _sentencepiece_pieces(data) if type == "sentencepiece" else _tokenizer_json_size(data)


def _sentencepiece_pieces(data: bytes) -> Optional[int]:
    """The pieces of a serialized ModelProto: its repeated field 1."""
    pieces, pos = 0, 0
    while pos < len(data):
        tag, after_tag = _varint(data, pos)
        if after_tag is None:
            return None
        pos, wire = after_tag, tag & 7
        if wire == 2:
            length, after_length = _varint(data, pos)
            if after_length is None:
                return None
            pos = after_length + length
            pieces += tag >> 3 == 1
        elif wire == 0:
            _, after_value = _varint(data, pos)
            if after_value is None:
                return None
            pos = after_value
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        else:
            return None
    return pieces or None


def _tokenizer_json_size(data: bytes) -> Optional[int]:
    try:
        tokenizer = json.loads(data)
        vocab = tokenizer["model"]["vocab"]
        ids = list(vocab.values()) if isinstance(vocab, dict) else list(range(len(vocab)))  # Unigram: a list
        ids += [token["id"] for token in tokenizer.get("added_tokens") or []]
        return max(ids) + 1 if ids else None
    except (ValueError, KeyError, TypeError):
        return None


def is_hub_id(path: str) -> bool:
    """org/name, as the Hugging Face hub names repositories (not a path that merely has one slash)."""
    return path.count("/") == 1 and not path.startswith((".", "/", "~")) and all(path.split("/"))


def file_kind(path: str) -> str:
    """What a file looks like from its first bytes: 'sentencepiece' (a serialized model), 'tokenizer.json',
    'json lines', 'json', 'text' or 'binary'."""
    with open(path, "rb") as f:
        head = f.read(_SNIFF_BYTES)
    if _looks_like_sentencepiece(head):
        return "sentencepiece"
    body = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if body.startswith(b"{"):
        return _json_kind(body)
    try:
        text = codecs.getincrementaldecoder("utf-8")().decode(head, final=False)  # the head may cut a character
    except UnicodeDecodeError:
        return "binary"
    return "binary" if "\x00" in text else "text"


def _directory_problem(type: str, names: set, path: str, key: str) -> Optional[str]:
    if type == "huggingface":
        # tokenizer_config.json alone: the loader falls back to transformers' AutoTokenizer.
        if {"tokenizer.json", "tokenizer_config.json"} & names:
            return None
        fix = (
            f"it holds a sentencepiece tokenizer.model: set {key}.type=sentencepiece"
            if "tokenizer.model" in names
            else f"point {key}.path at a directory holding tokenizer.json, or at the file"
        )
        return f"{key}.path={path} is a directory without tokenizer.json; {fix}"
    if "tokenizer.model" in names:
        return None
    fix = (
        f"it holds a Hugging Face tokenizer.json: set {key}.type=huggingface"
        if "tokenizer.json" in names
        else f"point {key}.path at the .model file, or at a directory holding tokenizer.model"
    )
    return f"{key}.path={path} is a directory without tokenizer.model; {fix}"


def _file_problem(type: str, kind: str, path: str, key: str) -> Optional[str]:
    if kind in _ACCEPTS[type]:
        return None
    wanted, where = _WANTED[type]
    other_kind, other_type = _OTHER[type]
    fix = f"set {key}.type={other_type}" if kind == other_kind else f"point {key}.path at {where}"
    return f"{key}.path={path} is {_KINDS[kind]}, not {wanted}: {fix}"


def _looks_like_sentencepiece(head: bytes) -> bool:
    """A serialized ModelProto starts with its first piece: field 1 (length-delimited), whose own first fields
    are the piece text (field 1, length-delimited) and its score (field 2, a float: tag 0x15) or type (0x18)."""
    if head[:1] != b"\x0a":
        return False
    _, pos = _varint(head, 1)
    if pos is None or head[pos : pos + 1] != b"\x0a":
        return False
    length, pos = _varint(head, pos + 1)
    return pos is not None and head[pos + length : pos + length + 1] in (b"\x15", b"\x18")


def _varint(data: bytes, pos: int) -> tuple[int, Optional[int]]:
    """A protobuf varint at `pos`: (value, position after it), or (0, None) where there is none."""
    value = 0
    for shift in range(0, 35, 7):
        if pos >= len(data):
            return 0, None
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        pos += 1
        if not byte & 0x80:
            return value, pos
    return 0, None


def _json_kind(body: bytes) -> str:
    """A tokenizer.json (one object, its parts named near the top) or JSON lines (an object per line)."""
    try:
        first = json.loads(body.split(b"\n", 1)[0])
    except ValueError:  # (UnicodeDecodeError is one) a pretty-printed object, or a line longer than the head
        first = None
    if isinstance(first, dict):
        return "tokenizer.json" if {"model", "added_tokens"} <= first.keys() else "json lines"
    if b'"added_tokens"' in body or b'"pre_tokenizer"' in body:
        return "tokenizer.json"
    return "json"


def tokenizer_digest(tok: _Identified) -> str:
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
        hint = (
            f"; or use tokenizer type=sentencepiece with {directory}/tokenizer.model"
            if os.path.isfile(os.path.join(directory, "tokenizer.model"))
            else ""
        )
        raise TokenizerError(
            f"tokenizer directory {name} has no tokenizer.json and transformers is not installed{hint}"
        ) from None
    return TransformersTokenizer(directory, eod, name=name)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _hub_file(repo_id: str, filename: str, also: Sequence[str] = ()) -> str:
    """Download one file of a hub repository into the Hugging Face cache (HF_TOKEN for gated repositories)."""
    if not is_hub_id(repo_id):
        raise TokenizerError(f"tokenizer path {repo_id} does not exist (and is not a hub id like org/name)")
    try:
        from huggingface_hub import hf_hub_download

        try:
            from huggingface_hub.errors import (
                EntryNotFoundError,
                GatedRepoError,
                HfHubHTTPError,
                LocalEntryNotFoundError,
                RepositoryNotFoundError,
            )
        except ImportError:  # older huggingface_hub
            from huggingface_hub.utils import (
                EntryNotFoundError,
                GatedRepoError,
                HfHubHTTPError,
                LocalEntryNotFoundError,
                RepositoryNotFoundError,
            )
    except ImportError:
        raise TokenizerError(f"tokenizer {repo_id} is not a local path and huggingface_hub is not installed") from None
    token = os.environ.get("HF_TOKEN") or None
    try:
        path = hf_hub_download(repo_id, filename, token=token)
    except GatedRepoError:
        fix = "export HF_TOKEN=<your token>" if token is None else "HF_TOKEN was rejected: check it"
        raise TokenizerError(
            f"tokenizer {repo_id} is gated on the Hugging Face hub: accept its license at "
            f"https://huggingface.co/{repo_id} and {fix}, or point the tokenizer path at a local copy"
        ) from None
    except RepositoryNotFoundError:
        fix = "export HF_TOKEN=<your token> if it is private" if token is None else "check the name and HF_TOKEN"
        raise TokenizerError(f"tokenizer {repo_id}: no such repository on the Hugging Face hub ({fix})") from None
    except LocalEntryNotFoundError:  # (a subclass of EntryNotFoundError: test it first)
        raise TokenizerError(
            f"tokenizer {repo_id}: the hub cannot be reached and no cached copy exists; fetch "
            "it where there is network (python -m data_prep download ...) or use a local path"
        ) from None
    except EntryNotFoundError:
        raise TokenizerError(
            f"tokenizer {repo_id} has no {filename} on the hub: use the other tokenizer type or a local directory"
        ) from None
    except HfHubHTTPError as e:
        fix = "; export HF_TOKEN=<your token>" if token is None else ""
        raise TokenizerError(
            f"tokenizer {repo_id}: the Hugging Face hub refused {filename}: {str(e).splitlines()[0]}{fix}"
        ) from None
    for extra in also:
        try:
            hf_hub_download(repo_id, extra, token=token)
        except Exception:  # optional files (tokenizer_config.json only refines the eod choice)
            pass
    return path
