"""Fixtures for the data-preparation tests (helpers live in dataprep_helpers.py)."""
from __future__ import annotations

import http.server
import json
import threading

import pytest

from dataprep_helpers import Server, make_docs, make_handler


@pytest.fixture
def http_server(tmp_path):
    root = tmp_path / "www"
    root.mkdir()
    server = Server(root)
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), make_handler(server))
    server.port = httpd.server_address[1]
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield server
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="session")
def tokenizers_dir(tmp_path_factory):
    """A sentencepiece model and a Hugging Face byte-level BPE, both trained on the corpus vocabulary."""
    from data_prep.train_tokenizer import train_bpe, train_sentencepiece

    d = tmp_path_factory.mktemp("tok")
    corpus = d / "train.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in make_docs(400, seed=99)), encoding="utf-8")
    sp = train_sentencepiece([str(corpus)], str(d / "sp" / "sp"), vocab_size=400)
    hf = train_bpe([str(corpus)], str(d / "hf"), vocab_size=400)
    return {"sentencepiece": sp, "huggingface": hf}


@pytest.fixture(params=["sentencepiece", "huggingface"])
def tokenizer_spec(request, tokenizers_dir):
    return request.param, tokenizers_dir[request.param]


