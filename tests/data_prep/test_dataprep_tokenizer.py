"""The tokenizer interface shared with training: encode/decode, vocab_size, eod; clear errors."""
from __future__ import annotations

import json

import pytest

from data_prep.tokenizer import TokenizerError, load_tokenizer, tokenizer_digest
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
    with pytest.raises(TokenizerError, match="has no tokenizer.model"):
        load_tokenizer("sentencepiece", str(tmp_path))
    try:
        import transformers  # noqa: F401  (with it, such a directory loads through AutoTokenizer)
    except ImportError:
        with pytest.raises(TokenizerError, match="no tokenizer.json and transformers is not installed"):
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
