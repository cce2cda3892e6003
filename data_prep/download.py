"""Resumable HTTP downloads: `<dest>.part` grows until complete and verified, then is renamed to `<dest>`.

- Resume: an existing `.part` continues with an HTTP Range request; a server that ignores Range (200 instead of
  206) or disagrees about the offset makes the download restart from zero, never append misaligned bytes.
- Verify: size against Content-Length / Content-Range, sha256 against a `checksums_file` entry or the sha256 a
  Hugging Face resolve URL publishes (X-Linked-Etag on its redirect).
- Retries with exponential backoff on network errors, timeouts, 429 and 5xx; 401/403/404 fail at once.
Standard library only (plus tqdm for the progress bar).
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from http.client import HTTPException
from typing import Optional
from urllib.parse import urlparse

from common.config import DownloadConfig
from data_prep.progress import progress_bar
from data_prep.shards import is_url

_BLOCK = 1 << 20
_HF_HOSTS = ("huggingface.co", "hf.co")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class DownloadError(RuntimeError):
    """A download that failed for good; the message names the URL and what to do."""


class _Retry(Exception):
    """A failure worth another attempt."""


class _Mismatch(_Retry):
    """The complete file has the wrong sha256: worth one fresh download, not a dozen."""


@dataclass(frozen=True)
class DownloadOptions:
    retries: int
    backoff_s: float
    max_backoff_s: float
    timeout_s: float

    @classmethod
    def from_config(cls, download: DownloadConfig) -> "DownloadOptions":
        return cls(download.retries, download.backoff_s, download.max_backoff_s, download.timeout_s)


def download(url: str, dest: str, options: DownloadOptions, sha256: Optional[str] = None, progress: bool = True) -> str:
    """Fetch `url` to `dest` (skipped when `dest` exists: it only ever appears complete and verified)."""
    if os.path.exists(dest):
        return dest
    os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
    part = dest + ".part"
    last: Optional[BaseException] = None
    mismatches = 0
    for attempt in range(options.retries + 1):
        if attempt:
            delay = min(options.max_backoff_s, options.backoff_s * 2 ** (attempt - 1))
            print(
                f"download {os.path.basename(dest)}: {last}; retry {attempt}/{options.retries} in {delay:.0f} s",
                file=sys.stderr,
                flush=True,
            )
            time.sleep(delay)
        try:
            published = _fetch(url, part, options.timeout_s, progress)
            _verify(part, url, sha256 or published)
            os.replace(part, dest)
            return dest
        except _Mismatch as e:
            mismatches += 1
            if mismatches == 2:
                raise DownloadError(f"{e} (twice: the source or the expected checksum is wrong)") from None
            last = e
        except _Retry as e:
            last = e
    raise DownloadError(f"download {url} failed after {options.retries + 1} attempts: {last}")


def read_checksums(path_or_url: str, download_dir: str, options: DownloadOptions) -> dict[str, str]:
    """A `sha256sum`-format list (`<hex>  <name>` per line) -> {file name: sha256}."""
    path = os.path.expanduser(path_or_url)
    fetched = is_url(path_or_url)
    if fetched:
        # A name of this process's own: array tasks read the same list at the same time.
        name = os.path.basename(urlparse(path_or_url).path) or "checksums.txt"
        path = download(path_or_url, os.path.join(download_dir, f".{name}.{os.getpid()}"), options, progress=False)
    sums: dict[str, str] = {}
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                parts = line.strip().split(maxsplit=1)
                if len(parts) == 2 and _SHA256.match(parts[0].lower()):
                    sums[os.path.basename(parts[1].lstrip("*"))] = parts[0].lower()
    finally:
        if fetched:
            os.remove(path)
    return sums


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_BLOCK), b""):
            h.update(block)
    return h.hexdigest()


def _fetch(url: str, part: str, timeout: float, progress: bool) -> Optional[str]:
    """One attempt: continue `part` from where it stops; returns the sha256 the server published, if any."""
    offset = os.path.getsize(part) if os.path.exists(part) else 0
    redirect = _RecordingRedirects()
    opener = urllib.request.build_opener(redirect)
    headers = {"User-Agent": "llama31-recipes-data-prep", "Accept-Encoding": "identity"}
    token = os.environ.get("HF_TOKEN")
    if token and _is_hf(url):
        headers["Authorization"] = f"Bearer {token}"
    if offset:
        headers["Range"] = f"bytes={offset}-"
    try:
        resp = opener.open(urllib.request.Request(url, headers=headers), timeout=timeout)
    except urllib.error.HTTPError as e:
        if e.code == 416 and offset:
            # Our partial file is not a prefix the server can continue (e.g. the file changed): start over.
            os.remove(part)
            raise _Retry(f"HTTP 416 resuming at byte {offset}; restarting from zero") from None
        raise _http_error(url, e.code, e.reason) from None
    except (urllib.error.URLError, socket.timeout, ConnectionError, HTTPException, OSError) as e:
        raise _Retry(_reason(e)) from None
    with resp:
        total = None
        if offset and resp.status == 206:
            m = re.match(r"bytes (\d+)-\d+/(\d+|\*)", resp.headers.get("Content-Range", ""))
            if not m or int(m.group(1)) != offset:
                os.remove(part)
                raise _Retry(
                    f"server answered the range request with {resp.headers.get('Content-Range')!r}; "
                    "restarting from zero"
                )
            total = int(m.group(2)) if m.group(2) != "*" else None
            mode = "ab"
        else:
            if offset:
                print(
                    f"download {os.path.basename(part[:-5])}: the server ignores range requests; restarting from zero",
                    file=sys.stderr,
                    flush=True,
                )
            offset, mode = 0, "wb"
            length = resp.headers.get("Content-Length")
            total = int(length) if length and length.isdigit() else None
        total = total or redirect.linked_size
        name = os.path.basename(part[:-5])
        with (
            open(part, mode) as out,
            progress_bar(
                total=total,
                initial=offset,
                desc=f"download {name}",
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                disable=not progress,
            ) as bar,
        ):
            try:
                for block in iter(lambda: resp.read(_BLOCK), b""):
                    out.write(block)
                    bar.update(len(block))
            except (socket.timeout, ConnectionError, HTTPException, OSError) as e:
                raise _Retry(f"connection lost after {out.tell()} bytes ({_reason(e)}); resuming") from None
    size = os.path.getsize(part)
    if total is not None and size != total:
        if size > total:
            os.remove(part)
        raise _Retry(f"got {size} of {total} bytes")
    return redirect.linked_sha256


def _verify(part: str, url: str, sha256: Optional[str]) -> None:
    if not sha256:
        return
    actual = sha256_file(part)
    if actual != sha256.lower():
        os.remove(part)
        raise _Mismatch(f"sha256 mismatch for {url}: expected {sha256}, got {actual}")


def _http_error(url: str, code: int, reason: str) -> Exception:
    if code in (401, 403):
        hint = (
            "export HF_TOKEN=<your token> (and accept the dataset's terms on huggingface.co)"
            if _is_hf(url) and not os.environ.get("HF_TOKEN")
            else "check the credentials and the URL"
        )
        return DownloadError(f"HTTP {code} {reason} for {url}: access denied; {hint}")
    if code == 404:
        return DownloadError(f"HTTP 404 Not Found: {url} (check data_preparation.base_url and the file numbers)")
    if code in (408, 425, 429) or code >= 500:
        return _Retry(f"HTTP {code} {reason}")
    return DownloadError(f"HTTP {code} {reason} for {url}")


def _reason(e: BaseException) -> str:
    reason = getattr(e, "reason", None)
    return f"{type(e).__name__}: {reason if reason is not None else e}"


def _is_hf(url: str) -> bool:
    host = urlparse(url).hostname or ""
    return any(host == h or host.endswith("." + h) for h in _HF_HOSTS)


class _RecordingRedirects(urllib.request.HTTPRedirectHandler):
    """Follows redirects, keeping what Hugging Face publishes on them (X-Linked-Etag is the file's sha256 for
    LFS files) and never sending the hub token on to another host (the CDN)."""

    def __init__(self):
        self.linked_sha256: Optional[str] = None
        self.linked_size: Optional[int] = None

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        etag = (headers.get("X-Linked-Etag") or "").strip('"').lower()
        if _SHA256.match(etag):
            self.linked_sha256 = etag
        size = headers.get("X-Linked-Size")
        if size and size.isdigit():
            self.linked_size = int(size)
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and urlparse(newurl).hostname != urlparse(req.full_url).hostname:
            new.remove_header("Authorization")
        return new
