"""The tokenizer interface shared with training: encode/decode, vocab_size, eod; clear errors."""

from __future__ import annotations

import json

import pytest

from data_prep.tokenizer import TokenizerError, file_kind, load_tokenizer, tokenizer_digest, tokenizer_problem
from dataprep_helpers import make_docs


def test_round_trip_vocab_and_eod(tokenizer_spec):
    kind, path = tokenizer_spec
    tok = load_tokenizer(kind, path)
    assert tok.type == kind and isinstance(tok.vocab_size, int) and 256 < tok.vocab_size <= 400
    if kind == "sentencepiece":
        assert tok.eod == 2  # the model's EOS
    else:
        assert tok.eod == tok._tok.token_to_id("<|end_of_text|>")
    for text in make_docs(50, seed=5) + ["  leading and trailing  ", "tabs\tand\nnewlines\n\n", "ünï 東京 🙂"]:
        ids = tok.encode(text)
        assert ids and all(0 <= i < tok.vocab_size for i in ids) and tok.eod not in ids
        assert tok.decode(ids) == text
    batch = ["one text", "another, longer text", "東京"]
    assert [list(ids) for ids in tok.encode_batch(batch)] == [tok.encode(t) for t in batch]
    assert not hasattr(tok, "pad")  # megatron then keeps its own pad sentinel, which never collides with data


def test_directory_file_and_hub_style_paths(tokenizers_dir, tmp_path):
    sp = load_tokenizer("sentencepiece", tokenizers_dir["sentencepiece"])
    hf_dir = load_tokenizer("huggingface", tokenizers_dir["huggingface"])
    hf_file = load_tokenizer("huggingface", tokenizers_dir["huggingface"] + "/tokenizer.json")
    assert hf_dir.encode("the data") == hf_file.encode("the data")
    assert tokenizer_digest(hf_dir) == tokenizer_digest(hf_file) != tokenizer_digest(sp)
    with pytest.raises(TokenizerError, match="is a directory without tokenizer.model"):
        load_tokenizer("sentencepiece", str(tmp_path))
    with pytest.raises(TokenizerError, match="is a directory without tokenizer.json"):
        load_tokenizer("huggingface", str(tmp_path))
    with pytest.raises(TokenizerError, match="does not exist"):
        load_tokenizer("huggingface", str(tmp_path / "missing" / "dir"))
    with pytest.raises(TokenizerError, match="not one of huggingface, sentencepiece"):
        load_tokenizer("tiktoken", "x")


def _wordlevel(tmp_path, eos: str, config_eos):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "hello": 1, "world": 2, eos: 3}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    if config_eos is not None:
        (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": config_eos}))
    return str(tmp_path)


def test_eod_from_tokenizer_config(tmp_path):
    path = _wordlevel(tmp_path, "<my_eos>", {"content": "<my_eos>"})
    assert load_tokenizer("huggingface", path).eod == 3


def test_no_end_of_document_token_is_an_error(tmp_path):
    with pytest.raises(TokenizerError, match="no end-of-document token"):
        load_tokenizer("huggingface", _wordlevel(tmp_path, "<other>", None))


def test_gated_hub_tokenizer_without_token(monkeypatch):
    import huggingface_hub
    from huggingface_hub.errors import GatedRepoError

    def gated(*args, **kwargs):
        err = GatedRepoError.__new__(GatedRepoError)  # its constructor wants an HTTP response object
        Exception.__init__(err, "401 Client Error: gated repo")
        raise err

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", gated)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with pytest.raises(TokenizerError, match="meta-llama/Llama-3.1-8B is gated .*export HF_TOKEN"):
        load_tokenizer("huggingface", "meta-llama/Llama-3.1-8B")
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    with pytest.raises(TokenizerError, match="HF_TOKEN was rejected"):
        load_tokenizer("huggingface", "meta-llama/Llama-3.1-8B")


def test_hub_unreachable_without_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(c, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(TokenizerError, match="cannot be reached and no cached copy"):
        load_tokenizer("huggingface", "some-org/some-model")


@pytest.fixture
def files(tmp_path, tokenizers_dir):
    """A tokenizer of each kind and files that are not tokenizers, as a user might point at them."""
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in make_docs(5, seed=1)))
    (tmp_path / "notes.txt").write_text("just some text\n\nand more\n")
    (tmp_path / "data.bin").write_bytes(bytes(range(256)) * 4)
    (tmp_path / "empty").mkdir()
    (tmp_path / "sp_dir").mkdir()
    (tmp_path / "sp_dir" / "tokenizer.model").write_bytes(open(tokenizers_dir["sentencepiece"], "rb").read())
    return {
        "sp": tokenizers_dir["sentencepiece"],
        "json": tokenizers_dir["huggingface"] + "/tokenizer.json",
        "hf_dir": tokenizers_dir["huggingface"],
        "corpus": str(tmp_path / "corpus.jsonl"),
        "text": str(tmp_path / "notes.txt"),
        "binary": str(tmp_path / "data.bin"),
        "empty": str(tmp_path / "empty"),
        "sp_dir": str(tmp_path / "sp_dir"),
    }


def test_file_kind_from_the_first_bytes(files):
    kinds = {name: file_kind(files[name]) for name in ("sp", "json", "corpus", "text", "binary")}
    assert kinds == {
        "sp": "sentencepiece",
        "json": "tokenizer.json",
        "corpus": "json lines",
        "text": "text",
        "binary": "binary",
    }


KEY = "data_preparation.tokenizer"


@pytest.mark.parametrize(
    "kind, name, expected",
    [
        ("huggingface", "sp", "is a sentencepiece model, not a Hugging Face tokenizer: set {key}.type=sentencepiece"),
        (
            "huggingface",
            "sp_dir",
            "is a directory without tokenizer.json; it holds a sentencepiece tokenizer.model: "
            "set {key}.type=sentencepiece",
        ),
        (
            "huggingface",
            "empty",
            "is a directory without tokenizer.json; point {key}.path at a directory holding "
            "tokenizer.json, or at the file",
        ),
        (
            "huggingface",
            "corpus",
            "is a JSON lines file (a corpus?), not a Hugging Face tokenizer: point {key}.path at "
            "a tokenizer.json or the directory holding it",
        ),
        ("huggingface", "binary", "is a binary file, not a Hugging Face tokenizer"),
        (
            "sentencepiece",
            "json",
            "is a Hugging Face tokenizer.json, not a sentencepiece model: set {key}.type=huggingface",
        ),
        (
            "sentencepiece",
            "hf_dir",
            "is a directory without tokenizer.model; it holds a Hugging Face tokenizer.json: "
            "set {key}.type=huggingface",
        ),
        (
            "sentencepiece",
            "corpus",
            "is a JSON lines file (a corpus?), not a sentencepiece model: point {key}.path at "
            "a .model file or the directory holding tokenizer.model",
        ),
        ("sentencepiece", "text", "is a text file, not a sentencepiece model"),
    ],
)
def test_a_path_of_the_wrong_kind_is_one_line_naming_the_key_and_the_fix(files, kind, name, expected):
    line = tokenizer_problem(kind, files[name], KEY)
    assert line.startswith(f"{KEY}.path={files[name]} ") and expected.format(key=KEY) in line
    with pytest.raises(TokenizerError) as err:  # the loader says the same, instead of a parser's traceback
        load_tokenizer(kind, files[name], key=KEY)
    assert str(err.value) == line


@pytest.mark.parametrize(
    "kind, name",
    [("huggingface", "json"), ("huggingface", "hf_dir"), ("sentencepiece", "sp"), ("sentencepiece", "sp_dir")],
)
def test_usable_paths_have_no_problem(files, kind, name):
    assert tokenizer_problem(kind, files[name], KEY) is None
    assert load_tokenizer(kind, files[name]).vocab_size > 256


def test_other_paths_and_types(tmp_path):
    assert tokenizer_problem("huggingface", "meta-llama/Llama-3.1-8B", KEY) is None  # not looked up
    assert tokenizer_problem("sentencepiece", str(tmp_path / "gone.model"), KEY) == (
        f"{KEY}.path={tmp_path / 'gone.model'} does not exist (and is not a hub id like org/name)"
    )
    assert tokenizer_problem("tiktoken", "x", KEY) == f"{KEY}.type='tiktoken' is not one of huggingface, sentencepiece"
    assert tokenizer_problem("huggingface", "", KEY).startswith(f"{KEY}.path is not set")


def test_damaged_tokenizer_files_are_one_line(tmp_path, tokenizers_dir):
    """Files whose first bytes look right but that do not parse: the library's error, in one line."""
    model = open(tokenizers_dir["sentencepiece"], "rb").read()
    (tmp_path / "cut.model").write_bytes(model[: len(model) // 2])
    text = open(tokenizers_dir["huggingface"] + "/tokenizer.json", encoding="utf-8").read()
    (tmp_path / "cut.json").write_text(text[: len(text) // 2], encoding="utf-8")
    with pytest.raises(TokenizerError, match=r"cut.model cannot be read as a sentencepiece model \(") as err:
        load_tokenizer("sentencepiece", str(tmp_path / "cut.model"))
    assert "\n" not in str(err.value)
    with pytest.raises(TokenizerError, match=r"cut.json cannot be read as a Hugging Face tokenizer.json \(") as err:
        load_tokenizer("huggingface", str(tmp_path / "cut.json"))
    assert "\n" not in str(err.value)


def test_directory_transformers_cannot_load_either(tmp_path):
    pytest.importorskip("transformers")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    assert tokenizer_problem("huggingface", str(tmp_path), KEY) is None  # transformers' layout: left to it
    with pytest.raises(TokenizerError, match="has no tokenizer.json and transformers cannot load it either"):
        load_tokenizer("huggingface", str(tmp_path))
