"""A disk that fills up during data preparation: the shard being written fails with one line, leaves no
temporary files, the shards finished before stay finished, and the run stops there instead of downloading and
failing every later shard. Once there is space, running again finishes the rest."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

from common.config import FilesData
from data_prep import pipeline
from data_prep.config import load_config_file
from data_prep.pipeline import Pipeline, Settings, read_marker
from data_prep.shards import list_shards
from dataprep_helpers import make_docs, write_config, write_shard


def three_shards(root: Path, tokenizer: str, output_dir: Path) -> FilesData:
    root.mkdir(parents=True, exist_ok=True)
    inputs = [str(write_shard(root / f"{name}.jsonl", make_docs(150, seed=k)).path) for k, name in enumerate("abc")]
    cfg = write_config(root / "c.yaml", "files", ("sentencepiece", tokenizer), output_dir, inputs=inputs, workers=1)
    return load_config_file(str(cfg)).section


def run(section: FilesData, lines: list[str]) -> list:
    return Pipeline(Settings.from_config(section), log=lines.append).run(list_shards(section), progress=False)


def check_stopped_at_the_second(section: FilesData, results: list, lines: list[str]) -> None:
    assert [r.status for r in results] == ["done", "failed", "not started"], lines
    failed = results[1]
    assert failed.disk_full and "no space left on the device under" in failed.reason, failed.reason
    assert "\n" not in failed.reason
    shards = list_shards(section)
    assert read_marker(shards[0].output_prefix) is not None  # finished before: still finished
    leftovers = [p.name for p in Path(section.output_dir).iterdir() if p.name.endswith((".tmp", ".lock"))]
    assert leftovers == []
    assert not os.path.exists(shards[1].output_prefix + ".done.json")


def test_an_injected_enospc_stops_the_run_at_that_shard(tmp_path, tokenizers_dir, monkeypatch):
    section = three_shards(tmp_path, tokenizers_dir["sentencepiece"], tmp_path / "out")
    writes = {"count": 0}
    real = pipeline.IndexWriter.add_documents

    def add_documents(self, tokens, lengths):
        if "b_text_document" in self.data_file.name:
            writes["count"] += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.data_file.name)
        return real(self, tokens, lengths)

    monkeypatch.setattr(pipeline.IndexWriter, "add_documents", add_documents)
    lines: list[str] = []
    results = run(section, lines)
    check_stopped_at_the_second(section, results, lines)
    assert writes["count"] == 1

    monkeypatch.setattr(pipeline.IndexWriter, "add_documents", real)  # space again
    assert [r.status for r in run(section, [])] == ["skipped", "done", "done"]


def test_a_real_full_tmpfs_stops_the_run_and_the_next_run_finishes(tmp_path, tokenizers_dir, small_tmpfs):
    probe = three_shards(tmp_path / "probe", tokenizers_dir["sentencepiece"], tmp_path / "probe" / "out")
    assert [r.status for r in run(probe, [])] == ["done"] * 3
    sizes = sorted(p.stat().st_size for p in Path(probe.output_dir).iterdir() if p.is_file())
    shard_bytes = sum(sizes) // 3
    # Room for the first shard and a part of the second (tmpfs counts whole 4 KiB pages).
    disk = small_tmpfs(((shard_bytes * 3 // 2) // 4096 + 2) * 4096)
    section = three_shards(tmp_path / "real", tokenizers_dir["sentencepiece"], disk / "out")
    lines: list[str] = []
    results = run(section, lines)
    check_stopped_at_the_second(section, results, lines)
    first = list_shards(section)[0].output_prefix
    assert Path(first + ".bin").read_bytes() == Path(list_shards(probe)[0].output_prefix + ".bin").read_bytes()
    assert json.loads(Path(first + ".done.json").read_text())["documents"] == 150
