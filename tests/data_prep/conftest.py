"""Fixtures for the data-preparation tests (helpers live in dataprep_helpers.py)."""

from __future__ import annotations

import http.server
import json
import threading
from pathlib import Path

import pytest

from data_prep.config import load_config_file
from data_prep.pipeline import Pipeline, Settings
from data_prep.shards import list_shards
from dataprep_helpers import Server, make_docs, make_handler, write_config, write_shard


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


@pytest.fixture(scope="session")
def prepared(tmp_path_factory, tokenizers_dir) -> Path:
    """Two finished shards, a (40 documents) and b (30), made by the pipeline with the sentencepiece model."""
    d = tmp_path_factory.mktemp("prepared")
    inputs = [
        str(write_shard(d / "a.jsonl", make_docs(40, seed=1)).path),
        str(write_shard(d / "b.jsonl.gz", make_docs(30, seed=2)).path),
    ]
    cfg = write_config(
        d / "c.yaml", "files", ("sentencepiece", tokenizers_dir["sentencepiece"]), d / "out", inputs=inputs, workers=1
    )
    dp = load_config_file(str(cfg)).section
    results = Pipeline(Settings.from_config(dp), log=lambda _: None).run(list_shards(dp), progress=False)
    assert [r.status for r in results] == ["done", "done"]
    return d / "out"
