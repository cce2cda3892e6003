"""Downloads against a local HTTP server: resume, restart, retries, checksums, clear failures."""

from __future__ import annotations

import hashlib
import os
import time

import pytest

from data_prep.download import DownloadError, DownloadOptions, _http_error, download, read_checksums

FAST = DownloadOptions(retries=3, backoff_s=0.01, max_backoff_s=0.05, timeout_s=10)


@pytest.fixture
def payload(http_server):
    data = os.urandom(3 * (1 << 20) + 12345)  # a few blocks, not a whole number of them
    (http_server.root / "f.bin").write_bytes(data)
    return data


def get(http_server, tmp_path, name="f.bin", **kw):
    dest = tmp_path / "dl" / name
    download(http_server.url(name), str(dest), kw.pop("options", FAST), progress=False, **kw)
    return dest


def test_download_and_skip_when_present(http_server, tmp_path, payload):
    dest = get(http_server, tmp_path)
    assert dest.read_bytes() == payload and not (tmp_path / "dl" / "f.bin.part").exists()
    n = len(http_server.requests)
    get(http_server, tmp_path)  # a finished file is never fetched again
    assert len(http_server.requests) == n


def test_dropped_connection_resumes_with_range(http_server, tmp_path, payload):
    http_server.behavior["f.bin"] = {"drop_after": 1_500_000}
    dest = get(http_server, tmp_path)
    assert dest.read_bytes() == payload
    assert http_server.requests[0] == ("f.bin", None)
    assert http_server.requests[1] == ("f.bin", "bytes=1500000-")


def test_interrupted_part_file_resumes_on_the_next_run(http_server, tmp_path, payload):
    part = tmp_path / "dl" / "f.bin.part"
    part.parent.mkdir()
    part.write_bytes(payload[:2_000_000])  # what a killed run leaves behind
    assert get(http_server, tmp_path).read_bytes() == payload
    assert http_server.requests == [("f.bin", "bytes=2000000-")]


def test_server_ignoring_range_restarts_cleanly(http_server, tmp_path, payload):
    http_server.behavior["f.bin"] = {"ignore_range": True}
    part = tmp_path / "dl" / "f.bin.part"
    part.parent.mkdir()
    part.write_bytes(b"x" * 1000)  # junk that must not end up in front of the real bytes
    assert get(http_server, tmp_path).read_bytes() == payload
    assert len(http_server.requests) == 1  # restarted within the same response, no retry needed


def test_part_longer_than_the_file_restarts(http_server, tmp_path, payload):
    part = tmp_path / "dl" / "f.bin.part"
    part.parent.mkdir()
    part.write_bytes(payload + b"extra")  # server answers 416
    assert get(http_server, tmp_path).read_bytes() == payload


def test_transient_errors_are_retried(http_server, tmp_path, payload):
    http_server.behavior["f.bin"] = {"fail": 2}
    assert get(http_server, tmp_path).read_bytes() == payload
    assert len(http_server.requests) == 3


def test_retries_run_out_with_a_clear_error(http_server, tmp_path, payload):
    http_server.behavior["f.bin"] = {"fail": 10}
    t0 = time.time()
    with pytest.raises(DownloadError, match=r"failed after 4 attempts: HTTP 503"):
        get(http_server, tmp_path)
    assert len(http_server.requests) == 4 and time.time() - t0 < 5


@pytest.mark.parametrize(
    "code, message",
    [
        (404, "HTTP 404 Not Found: .*check data_preparation.base_url"),
        (401, "HTTP 401 .*access denied"),
        (403, "HTTP 403 .*access denied"),
    ],
)
def test_permanent_errors_fail_at_once(http_server, tmp_path, code, message):
    if code != 404:
        http_server.behavior["f.bin"] = {"status": code}
    with pytest.raises(DownloadError, match=message):
        get(http_server, tmp_path)
    assert len(http_server.requests) == 1
    assert not (tmp_path / "dl" / "f.bin").exists()


def test_hub_access_denied_asks_for_hf_token(monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    err = _http_error("https://huggingface.co/datasets/x/resolve/main/a.json.gz", 401, "Unauthorized")
    assert isinstance(err, DownloadError) and "export HF_TOKEN" in str(err)


def test_published_sha256_is_checked(http_server, tmp_path, payload):
    good = hashlib.sha256(payload).hexdigest()
    http_server.behavior["ok.bin"] = {"redirect_to": "f.bin", "linked_etag": good}
    assert get(http_server, tmp_path, "ok.bin").read_bytes() == payload
    http_server.behavior["bad.bin"] = {"redirect_to": "f.bin", "linked_etag": "0" * 64}
    with pytest.raises(DownloadError, match="sha256 mismatch .*twice"):
        get(http_server, tmp_path, "bad.bin")
    assert [r[0] for r in http_server.requests].count("bad.bin") == 2  # one fresh try, then give up
    assert not (tmp_path / "dl" / "bad.bin").exists() and not (tmp_path / "dl" / "bad.bin.part").exists()


def test_checksums_file(http_server, tmp_path, payload):
    good = hashlib.sha256(payload).hexdigest()
    (http_server.root / "SHA256SUMS").write_text(f"{good}  f.bin\n{'1' * 64} *other.bin\nnot a line\n")
    sums = read_checksums(http_server.url("SHA256SUMS"), str(tmp_path / "dl"), FAST)
    assert sums == {"f.bin": good, "other.bin": "1" * 64}
    assert get(http_server, tmp_path, sha256=sums["f.bin"]).read_bytes() == payload
    with pytest.raises(DownloadError, match="sha256 mismatch"):
        download(http_server.url("f.bin"), str(tmp_path / "dl2" / "f.bin"), FAST, sha256="1" * 64, progress=False)
