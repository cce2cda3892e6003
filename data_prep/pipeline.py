"""Prepare shards: download, tokenize in parallel, write `.bin/.idx` atomically, record a done marker.

A shard's outputs are written as `<prefix>.bin.tmp` / `<prefix>.idx.tmp`, renamed to their final names once
complete, and only then `<prefix>.done.json` (the summary, and the proof of completion) is written. A shard
counts as finished when the marker exists, matches the outputs' sizes and was made with the same tokenizer and
settings; anything else is redone from scratch. Document order follows the input whatever the number of
workers, so a rerun after an interruption gives byte-identical files.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import sys
import time
import traceback
from collections import Counter, deque
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from common.config import DataPreparationConfig, SftJsonlData
from common.files import atomic_write
from data_prep.config import resolve_workers, settings_problems
from data_prep.download import DownloadError, DownloadOptions, download, read_checksums
from data_prep.encode import EXAMPLES_PER_REASON
from data_prep.indexed import IndexWriter, optimal_dtype
from data_prep.progress import human, progress_bar
from data_prep.readers import SourceError, iter_chunks
from data_prep.sft import MASK_DTYPE, SampleError, SftSettings, sft_settings
from data_prep.shards import LOSS_MASK, MARKER_SUFFIX, ConfigError, Shard
from data_prep.tokenizer import Tokenizer, TokenizerError, load_tokenizer

FORMAT_VERSION = 1
# Errors whose message is the whole story; anything else also prints a traceback.
EXPECTED_ERRORS = (ConfigError, DownloadError, SourceError, TokenizerError, SampleError, OSError)


class ShardBusy(RuntimeError):
    pass


@dataclass
class ShardResult:
    index: int
    name: str
    output_prefix: str
    status: str  # done | skipped (already done) | failed | downloaded
    reason: str = ""
    documents: int = 0
    tokens: int = 0
    lines: int = 0
    skipped: dict = field(default_factory=dict)
    examples: dict = field(default_factory=dict)
    seconds: float = 0.0  # reading, tokenizing and writing
    download_seconds: float = 0.0
    disk_full: bool = False  # the file system refused a write (ENOSPC): the run stops after this shard

    @property
    def skipped_total(self) -> int:
        return sum(self.skipped.values())


@dataclass
class Settings:
    """The data_preparation keys the pipeline uses, read once."""

    text_key: str
    format: str
    text_document: str
    append_eod: bool
    workers: int
    chunk_bytes: int
    keep_downloads: bool
    checksums_file: Optional[str]
    download_dir: str
    download: DownloadOptions
    tokenizer_type: str
    tokenizer_path: str
    sft: Optional[SftSettings] = None  # fine-tuning sources: samples with a loss mask (data_prep.sft)

    @classmethod
    def from_config(cls, dp: DataPreparationConfig, workers: Optional[int] = None) -> "Settings":
        """The settings of a data_preparation section; ConfigError with every problem, one per line."""
        if workers is not None:
            dp = dataclasses.replace(dp, workers=workers)
        problems = settings_problems(dp)
        if problems:
            raise ConfigError("\n".join(problems))
        return cls(
            text_key=dp.text_key,
            format=dp.format.value,
            text_document=dp.text_document.value,
            # A chat template ends the assistant's turn itself: no EOD after it.
            append_eod=dp.append_eod and not (isinstance(dp, SftJsonlData) and dp.chat_template),
            workers=resolve_workers(dp.workers),
            chunk_bytes=dp.chunk_bytes,
            keep_downloads=dp.keep_downloads,
            checksums_file=dp.checksums_file,
            download_dir=os.path.abspath(os.path.expanduser(dp.download_dir)),
            download=DownloadOptions.from_config(dp.download),
            tokenizer_type=dp.tokenizer.type.value,
            tokenizer_path=dp.tokenizer.path,
            sft=sft_settings(dp),
        )


class Pipeline:
    """Runs shards one after another, sharing one tokenizer and one pool of worker processes."""

    def __init__(self, settings: Settings, log: Callable[[str], None] = print):
        self.s = settings
        self.log = log
        self._tokenizer: Optional[Tokenizer] = None
        self._dtype: Optional[type] = None
        self._pool: Optional[ProcessPoolExecutor] = None
        self._checksums: Optional[dict[str, str]] = None

    # -- public ----------------------------------------------------------------------------------------------

    def run(self, shards: Sequence[Shard], force: bool = False, progress: bool = True) -> list[ShardResult]:
        results = []
        try:
            for k, shard in enumerate(shards):
                result = self._guarded(shard, lambda shard=shard: self.process(shard, force, progress))
                self.log(f"[{k + 1}/{len(shards)}] {format_result(result)}")
                results.append(result)
                if result.disk_full:  # every shard after it would fail the same way, each after its download
                    results += [ShardResult(s.index, s.name, s.output_prefix, "not started") for s in shards[k + 1 :]]
                    break
        except BaseException:  # a stop signal (data_prep/cli.py): the workers' chunks are thrown away anyway
            self.close(kill=True)
            raise
        self.close()
        return results

    def fetch(self, shards: Sequence[Shard], progress: bool = True) -> list[ShardResult]:
        """Download every remote source (and a hub tokenizer) without tokenizing: for login nodes with network
        when compute nodes have none."""
        results = []
        for shard in shards:
            result = self._guarded(shard, lambda shard=shard: self._fetch_only(shard, progress))
            self.log(format_result(result))
            results.append(result)
        return results

    def close(self, kill: bool = False) -> None:
        """Stop the workers: once their chunks are done, or with `kill` at once. A killed pool is not waited for:
        its feeder thread may be stuck writing chunks into a pipe no worker reads any more (the process exits
        right after, without the interpreter's exit handlers that would join it)."""
        if self._pool is not None:
            if kill:
                kill_workers()
            self._pool.shutdown(wait=not kill, cancel_futures=True)
            self._pool = None

    def is_done(self, shard: Shard) -> bool:
        return read_marker(shard.output_prefix, self.fingerprint(shard)) is not None

    # -- one shard -------------------------------------------------------------------------------------------

    def process(self, shard: Shard, force: bool = False, progress: bool = True) -> ShardResult:
        prefix = shard.output_prefix
        fingerprint = self.fingerprint(shard)
        if not force:
            marker = read_marker(prefix, fingerprint)
            if marker is not None:
                return _result_from_marker(shard, marker, "skipped")
            stale = _read_json(prefix + MARKER_SUFFIX)
            if stale is not None:
                self.log(f"{shard.name}: outputs exist but were made with other settings or are incomplete; redoing")
        os.makedirs(os.path.dirname(prefix), exist_ok=True)
        with shard_lock(prefix):
            if not force:  # another process may have finished it between our first look and the lock
                marker = read_marker(prefix, fingerprint)
                if marker is not None:
                    return _result_from_marker(shard, marker, "skipped")
            # Nothing of an earlier attempt may survive: the marker first, so the outputs never look finished.
            _remove(prefix + MARKER_SUFFIX)
            for path in self._outputs(prefix):
                _remove(path)
                _remove(path + ".tmp")
            t0 = time.time()
            self._ensure_sources(shard, progress)
            fetched = time.time() - t0
            try:
                result = self._tokenize(shard, progress)
            except BaseException:  # failed or stopped: nothing left behind (a process killed hard can't clean up)
                for path in self._outputs(prefix):
                    _remove(path + ".tmp")
                raise
            result.download_seconds = fetched
            self._finalize(shard, result, fingerprint)
            if not self.s.keep_downloads:
                for src in shard.sources:
                    if src.remote:
                        _remove(src.local_path)
        return result

    def _outputs(self, prefix: str) -> list[str]:
        """A shard's output files: the tokens' .bin/.idx, and for fine-tuning samples the loss mask's."""
        prefixes = [prefix] + ([prefix + LOSS_MASK] if self.s.sft else [])
        return [p + ext for p in prefixes for ext in (".bin", ".idx")]

    def _fetch_only(self, shard: Shard, progress: bool) -> ShardResult:
        if self.is_done(shard):  # its fingerprint loads the tokenizer: a hub one lands in the HF cache
            return ShardResult(shard.index, shard.name, shard.output_prefix, "skipped")
        t0 = time.time()
        self._ensure_sources(shard, progress)
        return ShardResult(shard.index, shard.name, shard.output_prefix, "downloaded", seconds=time.time() - t0)

    def _ensure_sources(self, shard: Shard, progress: bool) -> None:
        for src in shard.sources:
            if not src.remote:
                if not os.path.isfile(src.local_path):
                    raise SourceError(f"input {src.local_path} does not exist")
                continue
            if os.path.exists(src.local_path):
                continue
            sums = self._load_checksums()
            download(src.uri, src.local_path, self.s.download, sha256=sums.get(src.file_name), progress=progress)

    def _tokenize(self, shard: Shard, progress: bool) -> ShardResult:
        prefix = shard.output_prefix
        result = ShardResult(shard.index, shard.name, prefix, "done")
        skipped: Counter = Counter()
        examples: dict[str, list[str]] = {}
        t0 = time.time()
        limited = shard.max_documents is not None
        total = shard.max_documents if limited else sum(os.path.getsize(s.local_path) for s in shard.sources)
        bar = progress_bar(
            total=total,
            desc=shard.name,
            unit="line" if limited else "B",
            unit_scale=True,
            unit_divisor=1000 if limited else 1024,
            disable=not progress,
        )
        builder = IndexWriter(prefix + ".bin.tmp", self.dtype)
        # The loss mask: a second indexed dataset whose sequences have the tokens' lengths, one byte per token.
        mask_builder = IndexWriter(prefix + LOSS_MASK + ".bin.tmp", MASK_DTYPE) if self.s.sft else None
        done_pos = 0
        try:
            chunks = iter_chunks(shard.sources, self.s.chunk_bytes, self.s.text_document, shard.max_documents)
            for chunk, enc in self._encoded(chunks):
                builder.add_documents(enc.tokens, enc.lengths)
                if mask_builder is not None:
                    assert enc.loss_mask is not None and len(enc.loss_mask) == len(enc.tokens)
                    mask_builder.add_documents(enc.loss_mask, enc.lengths)
                result.documents += len(enc.lengths)
                result.tokens += len(enc.tokens)
                result.lines += enc.lines
                skipped.update(enc.skipped)
                for reason, where in enc.examples.items():
                    have = examples.setdefault(reason, [])
                    have.extend(where[: EXAMPLES_PER_REASON - len(have)])
                step = enc.lines if limited else chunk.raw_pos - done_pos
                done_pos = chunk.raw_pos
                elapsed = max(time.time() - t0, 1e-9)
                bar.set_postfix_str(
                    f"docs {human(result.documents)} ({human(result.documents / elapsed)}/s), "
                    f"tokens {human(result.tokens)} ({human(result.tokens / elapsed)}/s), "
                    f"skipped {sum(skipped.values())}",
                    refresh=False,
                )
                bar.update(step)
        except BaseException:
            builder.data_file.close()
            if mask_builder is not None:
                mask_builder.data_file.close()
            raise
        finally:
            bar.close()
        builder.finalize(prefix + ".idx.tmp")
        if mask_builder is not None:
            mask_builder.finalize(prefix + LOSS_MASK + ".idx.tmp")
        if result.documents == 0:
            # An empty .bin/.idx would only fail later, inside training; most often the text key is wrong.
            why = ", ".join(f"{k} {v}" for k, v in sorted(skipped.items())) or "the sources are empty"
            raise SourceError(
                f"no documents in {result.lines} input lines ({why}); check data_preparation.text_key and the inputs"
            )
        result.skipped, result.examples = dict(sorted(skipped.items())), examples
        result.seconds = time.time() - t0
        return result

    def _encoded(self, chunks):
        """(chunk, Encoded) in input order; at most a few chunks in flight per worker to bound memory."""
        from data_prep.encode import encode_in_worker, single_thread_tokenizers

        if self.s.workers == 1:
            single_thread_tokenizers()
            encoder = self._make_encoder()(self.tokenizer)
            for chunk in chunks:
                yield chunk, encoder(chunk)
            return
        pool = self._get_pool()
        pending: deque = deque()
        try:
            for chunk in chunks:
                pending.append((chunk, pool.submit(encode_in_worker, chunk)))
                if len(pending) >= 2 * self.s.workers + 2:
                    chunk_done, fut = pending.popleft()
                    yield chunk_done, fut.result()
            while pending:
                chunk_done, fut = pending.popleft()
                yield chunk_done, fut.result()
        except BrokenProcessPool:
            self._pool = None  # a worker died (out of memory?): the next shard starts a fresh pool
            raise RuntimeError("a tokenizer worker process died (out of memory? see the system log)") from None
        finally:
            for _, fut in pending:
                fut.cancel()

    def _finalize(self, shard: Shard, result: ShardResult, fingerprint: str) -> None:
        prefix = shard.output_prefix
        for path in self._outputs(prefix):
            _fsync(path + ".tmp")
        for path in self._outputs(prefix):
            os.replace(path + ".tmp", path)
        marker = {
            "format_version": FORMAT_VERSION,
            "shard": shard.name,
            "index": shard.index,
            "output_prefix": prefix,
            "documents": result.documents,
            "tokens": result.tokens,
            "lines": result.lines,
            "skipped": result.skipped,
            "skipped_examples": result.examples,
            "seconds": round(result.seconds, 3),
            "download_seconds": round(result.download_seconds, 3),
            "bin_bytes": os.path.getsize(prefix + ".bin"),
            "idx_bytes": os.path.getsize(prefix + ".idx"),
            "dtype": self.dtype.__name__,
            "append_eod": self.s.append_eod,
            "tokenizer": {
                "type": self.tokenizer.type,
                "path": self.s.tokenizer_path,
                "vocab_size": self.tokenizer.vocab_size,
                "eod": self.tokenizer.eod,
            },
            "sources": [s.uri for s in shard.sources],
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "fingerprint": fingerprint,
        }
        if self.s.sft:
            marker["loss_mask"] = {
                ext[1:] + "_bytes": os.path.getsize(prefix + LOSS_MASK + ext) for ext in (".bin", ".idx")
            }
        _write_json_atomic(prefix + MARKER_SUFFIX, marker)
        _fsync_dir(os.path.dirname(prefix))

    # -- shared state ----------------------------------------------------------------------------------------

    @property
    def tokenizer(self) -> Tokenizer:
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(
                self.s.tokenizer_type, self.s.tokenizer_path, key="data_preparation.tokenizer"
            )
        return self._tokenizer

    @property
    def dtype(self) -> type:
        if self._dtype is None:
            self._dtype = optimal_dtype(self.tokenizer.vocab_size)
        return self._dtype

    def fingerprint(self, shard: Shard) -> str:
        """What the outputs depend on; a finished shard with another fingerprint is redone."""
        key = {
            "v": FORMAT_VERSION,
            "tokenizer": self.tokenizer.unique_identifiers["sha256"],
            "text_key": self.s.text_key,
            "format": self.s.format,
            "text_document": self.s.text_document,
            "max_documents": shard.max_documents,
            "sources": [(os.path.basename(s.local_path), s.compression, s.kind) for s in shard.sources],
        }
        if not self.s.append_eod:  # only then: shards made before the key existed keep their fingerprint
            key["append_eod"] = False
        if self.s.sft:
            key["sft"] = dataclasses.asdict(self.s.sft)
        return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]

    def _get_pool(self) -> ProcessPoolExecutor:
        if self._pool is None:
            import multiprocessing

            from data_prep.encode import init_worker, set_encoder

            tok = self.tokenizer
            make_encoder = self._make_encoder()
            # One constructor call per start method, so each initializer is type-checked against its own arguments.
            if "fork" in multiprocessing.get_all_start_methods():
                # fork: workers start in milliseconds with the tokenizer already loaded (a Llama 3 tokenizer.json
                # takes a while to parse). Safe here: the parent has used neither the tokenizer nor torch, and
                # tqdm's monitor thread is off (see progress.py), so no thread holds a lock across the fork.
                self._pool = ProcessPoolExecutor(
                    max_workers=self.s.workers,
                    mp_context=multiprocessing.get_context("fork"),
                    initializer=set_encoder,
                    initargs=(os.getpid(), make_encoder(tok)),
                )
            else:
                self._pool = ProcessPoolExecutor(
                    max_workers=self.s.workers,
                    mp_context=multiprocessing.get_context("spawn"),
                    initializer=init_worker,
                    initargs=(os.getpid(), tok.type, tok.path, tok.eod, make_encoder),
                )
        return self._pool

    def _make_encoder(self) -> Callable:
        """The encoder's class with its settings, called with the tokenizer (in the worker, under spawn)."""
        import functools

        from data_prep.encode import ChunkEncoder
        from data_prep.sft import SftEncoder

        if self.s.sft:
            return functools.partial(
                SftEncoder, dtype=self.dtype.__name__, settings=self.s.sft, append_eod=self.s.append_eod
            )
        return functools.partial(
            ChunkEncoder, dtype=self.dtype.__name__, text_key=self.s.text_key, append_eod=self.s.append_eod
        )

    def _load_checksums(self) -> dict[str, str]:
        if self._checksums is None:
            self._checksums = (
                read_checksums(str(self.s.checksums_file), self.s.download_dir, self.s.download)
                if self.s.checksums_file
                else {}
            )
        return self._checksums

    def _guarded(self, shard: Shard, fn) -> ShardResult:
        """A failing shard becomes a result with a one-line reason; the other shards go on."""
        try:
            return fn()
        except KeyboardInterrupt:
            raise
        except OSError as e:
            if e.errno != errno.ENOSPC:
                return ShardResult(shard.index, shard.name, shard.output_prefix, "failed", reason=_first_line(e))
            where = os.path.dirname(shard.output_prefix)
            reason = (
                f"no space left on the device under {where}: its temporary files are removed and the shards "
                "finished before are intact; free space and run again (finished shards are skipped)"
            )
            return ShardResult(shard.index, shard.name, shard.output_prefix, "failed", reason=reason, disk_full=True)
        except EXPECTED_ERRORS + (ShardBusy,) as e:
            reason = _first_line(e)
        except Exception as e:
            traceback.print_exc(file=sys.stderr)
            reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        return ShardResult(shard.index, shard.name, shard.output_prefix, "failed", reason=reason)


def kill_workers() -> None:
    """Kill this process's tokenizer workers (its multiprocessing children) at once: a stop signal does not wait
    for the chunks they are tokenizing."""
    import multiprocessing

    for child in multiprocessing.active_children():
        child.kill()


def megatron_indexed_dataset():
    """megatron.core.datasets.indexed_dataset, imported quietly: importing megatron.core warns about optional
    training packages (Transformer Engine, apex) that reading .bin/.idx files does not use."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets import indexed_dataset
    return indexed_dataset


# -- markers, locks, files ---------------------------------------------------------------------------------


def read_marker(prefix: str, fingerprint: Optional[str] = None) -> Optional[dict]:
    """The done marker when it proves `prefix.bin/.idx` complete (and made with `fingerprint`), else None."""
    marker = _read_json(prefix + MARKER_SUFFIX)
    if not isinstance(marker, dict):
        return None
    try:
        complete = (
            os.path.getsize(prefix + ".bin") == marker["bin_bytes"]
            and os.path.getsize(prefix + ".idx") == marker["idx_bytes"]
        )
        mask = marker.get("loss_mask")  # fine-tuning samples: their loss mask is part of the output
        if mask is not None:
            complete = complete and all(
                os.path.getsize(prefix + LOSS_MASK + ext) == mask[ext[1:] + "_bytes"] for ext in (".bin", ".idx")
            )
    except (OSError, KeyError, TypeError):
        return None
    if not complete or (fingerprint is not None and marker.get("fingerprint") != fingerprint):
        return None
    return marker


class shard_lock:
    """Exclusive lock on `<prefix>.lock` so two processes never write the same shard; where the file system
    has no locks (some NFS mounts) it goes on without one. The file is removed on every way out, a failed or
    interrupted shard too: a leftover looks like a shard still being prepared."""

    def __init__(self, prefix: str):
        self.path = prefix + ".lock"
        self.fd: Optional[int] = None

    def __enter__(self):
        import fcntl

        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                if e.errno in (errno.EAGAIN, errno.EACCES):
                    os.close(fd)
                    raise ShardBusy(f"another process is preparing this shard (lock {self.path} is held)") from None
                break  # no locking on this file system
            # The last holder may have removed the file between our open and our lock: then we hold a file nobody
            # else can see, and must lock the one now at the path instead.
            if _same_file(fd, self.path):
                break
            os.close(fd)
        self.fd = fd
        return self

    def __exit__(self, *_):
        if self.fd is not None:
            _remove(self.path)  # before unlocking, so a waiting process finds it gone (see __enter__)
            os.close(self.fd)
            self.fd = None


def _same_file(fd: int, path: str) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False


def _first_line(e: BaseException) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def format_result(r: ShardResult) -> str:
    if r.status == "not started":
        return f"{r.name}: not started (the disk is full)"
    if r.status == "failed":
        return f"{r.name}: FAILED: {r.reason}"
    if r.status == "downloaded":
        return f"{r.name}: sources downloaded ({r.seconds:.1f} s)"
    if r.status == "skipped" and not r.documents:
        return f"{r.name}: already done"
    head = f"{r.name}: " + ("already done: " if r.status == "skipped" else f"done in {r.seconds:.1f} s: ")
    rate = f" ({human(r.documents / r.seconds)}/s)" if r.seconds and r.status == "done" else ""
    trate = f" ({human(r.tokens / r.seconds)}/s)" if r.seconds and r.status == "done" else ""
    text = f"{head}{r.documents:,} documents{rate}, {r.tokens:,} tokens{trate}"
    if r.skipped_total:
        parts = []
        for reason, n in r.skipped.items():
            where = r.examples.get(reason) or []
            parts.append(f"{reason} {n:,}" + (f" (e.g. {', '.join(where)})" if where else ""))
        text += f"; skipped {r.skipped_total:,} lines: " + "; ".join(parts)
    else:
        text += "; skipped 0 lines"
    return text + f" -> {r.output_prefix}.{{bin,idx}}"


def _result_from_marker(shard: Shard, marker: dict, status: str) -> ShardResult:
    return ShardResult(
        shard.index,
        shard.name,
        shard.output_prefix,
        status,
        documents=marker.get("documents", 0),
        tokens=marker.get("tokens", 0),
        lines=marker.get("lines", 0),
        skipped=marker.get("skipped", {}),
        examples=marker.get("skipped_examples", {}),
        seconds=marker.get("seconds", 0.0),
    )


def _read_json(path: str) -> Optional[Any]:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _write_json_atomic(path: str, obj: Any) -> None:
    atomic_write(path, json.dumps(obj, indent=2) + "\n")


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: str) -> None:
    try:
        _fsync(path)
    except OSError:  # not every file system lets a directory be opened or synced
        pass
