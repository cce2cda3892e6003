"""End to end on fixtures, offline: download from a local HTTP server, extract, tokenize, write .bin/.idx, read
back with megatron-core, resume after interruption."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from data_prep import cli
from data_prep.tokenizer import load_tokenizer
from dataprep_helpers import REPO, make_docs, write_config, write_shard


def run_cli(capsys, *args) -> tuple[int, str, str]:
    rc = cli.main([*map(str, args)])
    out, err = capsys.readouterr()
    return rc, out, err


def read_documents(prefix: str) -> list[np.ndarray]:
    """Every document of a .bin/.idx pair, through megatron-core's reader."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import IndexedDataset

        ds = IndexedDataset(prefix)
    assert list(ds.document_indices) == list(range(len(ds) + 1))  # one sequence per document
    return [np.array(ds[i]) for i in range(len(ds))]  # copies: the views die with ds's mmap


def assert_round_trip(prefix: str, tok, expected_docs: list[str]) -> None:
    docs = read_documents(prefix)
    assert len(docs) == len(expected_docs)
    for ids, text in zip(docs, expected_docs):
        assert ids[-1] == tok.eod and tok.eod not in ids[:-1]
        assert tok.decode(ids[:-1].tolist()) == text


def marker(prefix: str) -> dict:
    import json

    return json.loads(Path(prefix + ".done.json").read_text())


def files_of(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.glob("*_text_document.*")) if p.suffix in (".bin", ".idx")}


@pytest.fixture
def served(http_server):
    www = http_server.root
    return {
        "clean": write_shard(www / "00.jsonl.zst", make_docs(120, seed=1)),
        "broken": write_shard(www / "01.jsonl.zst", make_docs(100, seed=2), broken=True, seed=3),
        "gz": write_shard(www / "c.json.gz", make_docs(80, seed=4), broken=True, seed=5),
    }


def test_end_to_end_over_http(tmp_path, capsys, http_server, served, tokenizer_spec):
    out = tmp_path / "data"
    urls = [http_server.url(p.path.name) for p in served.values()]
    cfg = write_config(tmp_path / "config.yaml", "files", tokenizer_spec, out, inputs=urls, workers=2, chunk_bytes=4096)
    rc, stdout, stderr = run_cli(capsys, "run", "--config", cfg)
    assert rc == 0, stderr
    tok = load_tokenizer(*tokenizer_spec)
    prefixes = []
    for stem, shard in zip(["00", "01", "c"], served.values()):
        prefix = str(out / f"{stem}_text_document")
        prefixes.append(prefix)
        assert_round_trip(prefix, tok, shard.docs)
        m = marker(prefix)
        assert m["skipped"] == shard.skipped and m["documents"] == len(shard.docs) and m["dtype"] == "uint16"
        assert m["tokens"] == sum(len(d) for d in read_documents(prefix))
        assert (out / "raw" / shard.path.name).read_bytes() == shard.path.read_bytes()
    # the summary names each reason with where it happened
    assert "skipped 9 lines: blank_line 1" in stdout and "malformed_json 2 (e.g. 01.jsonl.zst:" in stdout
    assert "3 done (3 shards)" in stdout
    rc, stdout, _ = run_cli(capsys, "verify", "--config", cfg)
    assert rc == 0 and stdout.count(": OK") == 3

    # what training does with them: GPTDataset through BlendedMegatronDatasetBuilder, blended 3 ways
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
        from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

        config = GPTDatasetConfig(
            random_seed=1234,
            sequence_length=48,
            blend=(prefixes, [0.5, 0.3, 0.2]),
            split="90,10,0",
            tokenizer=tok,
            reset_position_ids=False,
            reset_attention_mask=False,
            eod_mask_loss=False,
            path_to_cache=str(tmp_path / "cache"),
        )
        train, valid, _ = BlendedMegatronDatasetBuilder(GPTDataset, [64, 8, 0], lambda: True, config).build()
        assert len(train) >= 64 and len(valid) >= 8  # (the blend rounds up per dataset)
        for i in (0, 17, 63):
            sample = train[i]
            assert sample["tokens"].shape == (48,) and sample["labels"].shape == (48,)
            assert int(sample["tokens"].max()) < tok.vocab_size and int(sample["loss_mask"].sum()) == 48


def test_workers_and_chunking_never_change_the_bytes(tmp_path, capsys, tokenizers_dir):
    inputs = [
        str(write_shard(tmp_path / "a.jsonl.zst", make_docs(400, seed=11), broken=True).path),
        str(write_shard(tmp_path / "b.json.gz", make_docs(300, seed=12)).path),
    ]
    spec = ("huggingface", tokenizers_dir["huggingface"])
    outputs = []
    for workers, chunk in [(1, 1 << 20), (2, 4096), (3, 5000)]:  # (4096: the smallest chunk_bytes allowed)
        out = tmp_path / f"out_{workers}"
        cfg = write_config(
            tmp_path / f"c{workers}.yaml", "files", spec, out, inputs=inputs, workers=workers, chunk_bytes=chunk
        )
        assert run_cli(capsys, "run", "--config", cfg)[0] == 0
        outputs.append(files_of(out))
    assert len(outputs[0]) == 4 and outputs[0] == outputs[1] == outputs[2]


def test_pile_and_c4_layouts_over_http(tmp_path, capsys, http_server, tokenizers_dir):
    spec = ("sentencepiece", tokenizers_dir["sentencepiece"])
    tok = load_tokenizer(*spec)
    www = http_server.root
    (www / "pile").mkdir()
    (www / "en").mkdir()
    pile = [
        write_shard(www / "pile" / f"{n:02d}.jsonl.zst", make_docs(40, seed=20 + n), broken=n == 1, seed=n)
        for n in range(2)
    ]
    train = [
        write_shard(www / "en" / f"c4-train.{i:05d}-of-00004.json.gz", make_docs(25, seed=30 + i)) for i in range(4)
    ]
    val = [
        write_shard(www / "en" / f"c4-validation.{i:05d}-of-00002.json.gz", make_docs(30, seed=40 + i))
        for i in range(2)
    ]

    out = tmp_path / "pile"
    cfg = write_config(
        tmp_path / "pile.yaml", "pile", spec, out, base_url=http_server.url("pile"), num_files=2, workers=1
    )
    assert run_cli(capsys, "run", "--config", cfg)[0] == 0
    for n in range(2):
        assert_round_trip(str(out / f"my-llama_{n:02d}_text_document"), tok, pile[n].docs)

    out = tmp_path / "c4"
    cfg = write_config(
        tmp_path / "c4.yaml",
        "c4",
        spec,
        out,
        base_url=http_server.url("en"),
        workers=2,
        **{
            "train.file_template": "c4-train.{:05d}-of-00004.json.gz",
            "train.num_files": 4,
            "train.merged_files": 2,
            "train.tokenize": "0-1",
            "validation.file_template": "c4-validation.{:05d}-of-00002.json.gz",
            "validation.num_files": 2,
            "validation.max_documents": 45,
            "validation.output_name": "c4-validation-45-samples.en",  # resolved, as in a run's config.yaml
        },
    )
    rc, stdout, _ = run_cli(capsys, "list", "--config", cfg, "--prefixes")
    assert stdout.split() == [
        str(out / n)
        for n in (
            "c4-train.en_0_text_document",
            "c4-train.en_1_text_document",
            "c4-validation-45-samples.en_text_document",
        )
    ]
    assert run_cli(capsys, "run", "--config", cfg)[0] == 0
    # merged file k = train files 2k, 2k+1 in order; validation = the first 45 lines across both files
    assert_round_trip(str(out / "c4-train.en_0_text_document"), tok, train[0].docs + train[1].docs)
    assert_round_trip(str(out / "c4-train.en_1_text_document"), tok, train[2].docs + train[3].docs)
    assert_round_trip(str(out / "c4-validation-45-samples.en_text_document"), tok, (val[0].docs + val[1].docs)[:45])
    assert marker(str(out / "c4-validation-45-samples.en_text_document"))["lines"] == 45


def test_a_bad_shard_fails_alone_with_a_clear_reason(tmp_path, capsys, http_server, tokenizers_dir):
    good = write_shard(tmp_path / "good.jsonl.zst", make_docs(50, seed=1))
    (tmp_path / "garbage.jsonl.zst").write_bytes(b"this is not zstd at all" * 100)
    whole = write_shard(tmp_path / "whole.jsonl.zst", make_docs(300, seed=2), frames=1).path.read_bytes()
    (tmp_path / "truncated.jsonl.zst").write_bytes(whole[: len(whole) // 2])
    (tmp_path / "empty.jsonl").write_bytes(b"")
    inputs = [str(tmp_path / n) for n in ("good.jsonl.zst", "garbage.jsonl.zst", "truncated.jsonl.zst", "empty.jsonl")]
    inputs.append(http_server.url("missing.jsonl.zst"))
    out = tmp_path / "out"
    cfg = write_config(
        tmp_path / "c.yaml", "files", ("sentencepiece", tokenizers_dir["sentencepiece"]), out, inputs=inputs, workers=2
    )
    rc, stdout, stderr = run_cli(capsys, "run", "--config", cfg)
    assert rc == 1
    failures = [line for line in stderr.splitlines() if line.startswith("data_prep: shard")]
    assert len(failures) == 4
    assert "shard 1 (garbage) failed: cannot read" in failures[0] and "corrupt zstd data" in failures[0]
    assert "shard 2 (truncated) failed:" in failures[1] and "ends in the middle of a frame" in failures[1]
    assert "shard 3 (empty) failed: no documents in 0 input lines" in failures[2]
    assert "shard 4 (missing) failed: HTTP 404 Not Found" in failures[3]
    assert "1 done, 4 failed (5 shards)" in stdout
    assert_round_trip(
        str(out / "good_text_document"), load_tokenizer("sentencepiece", tokenizers_dir["sentencepiece"]), good.docs
    )
    for name in ("garbage", "truncated", "empty", "missing"):  # nothing that looks finished, or still running
        assert not any((out / f"{name}_text_document{ext}").exists() for ext in (".bin", ".idx", ".done.json", ".lock"))


def test_wrong_text_key_fails_with_a_hint(tmp_path, capsys, tokenizers_dir):
    src = write_shard(tmp_path / "a.jsonl", make_docs(20, seed=1))
    cfg = write_config(
        tmp_path / "c.yaml",
        "files",
        ("sentencepiece", tokenizers_dir["sentencepiece"]),
        tmp_path / "out",
        inputs=[str(src.path)],
        text_key="content",
        workers=1,
    )
    rc, _, stderr = run_cli(capsys, "run", "--config", cfg)
    assert rc == 1 and "no documents in 20 input lines (missing_text_key 20); check data_preparation.text_key" in stderr


def test_unusable_tokenizer_is_one_clear_error(tmp_path, capsys):
    src = write_shard(tmp_path / "a.jsonl", make_docs(5, seed=1))
    cfg = write_config(
        tmp_path / "c.yaml",
        "files",
        ("sentencepiece", str(tmp_path / "nope.model")),
        tmp_path / "out",
        inputs=[str(src.path)],
        workers=1,
    )
    rc, _, stderr = run_cli(capsys, "run", "--config", cfg)
    assert rc == 2 and stderr.strip().splitlines() == [
        f"data_prep: error: data_preparation.tokenizer.path={tmp_path / 'nope.model'} does not exist "
        "(and is not a hub id like org/name)"
    ]


def test_rerun_skips_finished_and_redoes_incomplete_or_changed(tmp_path, capsys, tokenizers_dir):
    inputs = [str(write_shard(tmp_path / f"{n}.jsonl.gz", make_docs(60, seed=n)).path) for n in ("a", "b", "c")]
    out = tmp_path / "out"
    sp = ("sentencepiece", tokenizers_dir["sentencepiece"])
    cfg = write_config(tmp_path / "c.yaml", "files", sp, out, inputs=inputs, workers=2)
    assert run_cli(capsys, "run", "--config", cfg)[0] == 0
    first = files_of(out)
    stamps = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}

    rc, stdout, _ = run_cli(capsys, "run", "--config", cfg)
    assert rc == 0 and stdout.count("already done") == 4  # 3 shards + the summary line
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == stamps

    # b: killed between renaming its outputs and writing the marker; c: a leftover temp file of a killed run
    (out / "b_text_document.done.json").unlink()
    (out / "c_text_document.bin").write_bytes(b"half")
    (out / "c_text_document.bin.tmp").write_bytes(b"stale")
    rc, stdout, _ = run_cli(capsys, "run", "--config", cfg)
    assert rc == 0 and "a: already done" in stdout and "b: done in" in stdout and "c: done in" in stdout
    assert files_of(out) == first and not (out / "c_text_document.bin.tmp").exists()
    assert (out / "a_text_document.bin").stat().st_mtime_ns == stamps["a_text_document.bin"]

    # another tokenizer makes every shard stale
    cfg = write_config(
        tmp_path / "c.yaml", "files", ("huggingface", tokenizers_dir["huggingface"]), out, inputs=inputs, workers=2
    )
    rc, stdout, _ = run_cli(capsys, "run", "--config", cfg)
    assert rc == 0 and stdout.count("done in") == 3 and "made with other settings" in stdout
    assert files_of(out) != first and marker(str(out / "a_text_document"))["tokenizer"]["type"] == "huggingface"


def test_interrupted_run_resumes_byte_identical(tmp_path, capsys, tokenizers_dir):
    """Kill the whole process group while the second of three shards is being written, then rerun."""
    inputs = [
        str(write_shard(tmp_path / "s0.jsonl.zst", make_docs(200, seed=1)).path),
        str(write_shard(tmp_path / "s1.jsonl.zst", make_docs(6000, seed=2, words_max=120), broken=True).path),
        str(write_shard(tmp_path / "s2.jsonl.zst", make_docs(200, seed=3)).path),
    ]
    spec = ("huggingface", tokenizers_dir["huggingface"])
    ref = tmp_path / "reference"
    cfg_ref = write_config(tmp_path / "ref.yaml", "files", spec, ref, inputs=inputs, workers=2, chunk_bytes=65536)
    assert run_cli(capsys, "run", "--config", cfg_ref)[0] == 0

    out = tmp_path / "out"
    cfg = write_config(tmp_path / "c.yaml", "files", spec, out, inputs=inputs, workers=2, chunk_bytes=65536)
    proc = subprocess.Popen(
        [sys.executable, "-m", "data_prep", "run", "--config", str(cfg), "--no-progress"],
        cwd=REPO,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    tmp_bin = out / "s1_text_document.bin.tmp"
    deadline = time.time() + 120
    while not ((out / "s0_text_document.done.json").exists() and tmp_bin.exists() and tmp_bin.stat().st_size > 0):
        assert proc.poll() is None and time.time() < deadline, proc.stdout.read().decode()
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    # the half-written shard does not look finished, to us or to megatron
    assert not any((out / f"s1_text_document{ext}").exists() for ext in (".bin", ".idx", ".done.json"))
    assert not (out / "s2_text_document.bin").exists()
    rc, stdout, _ = run_cli(capsys, "list", "--config", cfg)
    assert [line.split()[1] for line in stdout.splitlines()[1:]] == ["done", "incomplete", "pending"]
    s0_stamp = (out / "s0_text_document.done.json").stat().st_mtime_ns

    rc, stdout, _ = run_cli(capsys, "run", "--config", cfg)
    assert rc == 0 and "s0: already done" in stdout and "s1: done in" in stdout and "s2: done in" in stdout
    assert (out / "s0_text_document.done.json").stat().st_mtime_ns == s0_stamp
    assert files_of(out) == files_of(ref) and len(files_of(out)) == 6
    assert not list(out.glob("*.tmp")) and not list(out.glob("*.lock"))


def test_verify_catches_damage(tmp_path, capsys, tokenizers_dir):
    src = write_shard(tmp_path / "a.jsonl", make_docs(30, seed=1))
    cfg = write_config(
        tmp_path / "c.yaml",
        "files",
        ("sentencepiece", tokenizers_dir["sentencepiece"]),
        tmp_path / "out",
        inputs=[str(src.path)],
        workers=1,
    )
    assert run_cli(capsys, "run", "--config", cfg)[0] == 0
    bin_path = tmp_path / "out" / "a_text_document.bin"
    data = bytearray(bin_path.read_bytes())
    data[-2:] = (7).to_bytes(2, "little")  # the last document's EOD (uint16) overwritten
    bin_path.write_bytes(bytes(data))
    rc, stdout, _ = run_cli(capsys, "verify", "--config", cfg)
    assert rc == 1 and "1 documents do not end with the EOD token 2" in stdout
    bin_path.write_bytes(bytes(data[:-2]))
    rc, stdout, _ = run_cli(capsys, "verify", "--config", cfg)
    assert rc == 1 and "not finished" in stdout


def test_shard_selection_and_slurm_array(tmp_path, capsys, monkeypatch, tokenizers_dir):
    inputs = [str(write_shard(tmp_path / f"{n}.jsonl", make_docs(10, seed=i)).path) for i, n in enumerate("abc")]
    out = tmp_path / "out"
    cfg = write_config(
        tmp_path / "c.yaml", "files", ("sentencepiece", tokenizers_dir["sentencepiece"]), out, inputs=inputs, workers=1
    )
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "1")
    rc, stdout, _ = run_cli(capsys, "run", "--config", cfg)
    assert rc == 0 and sorted(p.name for p in out.glob("*.bin")) == ["b_text_document.bin"]
    rc, _, stderr = run_cli(capsys, "run", "--config", cfg, "--shard", "5")
    assert rc == 2 and "--shard=5: shard 5 does not exist (this config has 3 shards, 0-2)" in stderr
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "3")
    rc, _, stderr = run_cli(capsys, "run", "--config", cfg)
    assert rc == 2 and "SLURM_ARRAY_TASK_ID=3: shard 3 does not exist" in stderr
    rc, stdout, _ = run_cli(capsys, "run", "--config", cfg, "--shard", "all", "data_preparation.workers=2")
    assert (
        rc == 0
        and "b: already done" in stdout
        and sorted(p.name for p in out.glob("*.bin"))
        == ["a_text_document.bin", "b_text_document.bin", "c_text_document.bin"]
    )


def test_downloads_removed_when_not_kept(tmp_path, capsys, http_server, tokenizers_dir):
    write_shard(http_server.root / "x.jsonl.gz", make_docs(10, seed=1))
    out = tmp_path / "out"
    cfg = write_config(
        tmp_path / "c.yaml",
        "files",
        ("sentencepiece", tokenizers_dir["sentencepiece"]),
        out,
        inputs=[http_server.url("x.jsonl.gz")],
        keep_downloads=False,
        workers=1,
    )
    assert run_cli(capsys, "run", "--config", cfg)[0] == 0
    assert (out / "x_text_document.bin").exists() and not (out / "raw" / "x.jsonl.gz").exists()


def test_plain_text_lines_or_files(tmp_path, capsys, tokenizers_dir):
    docs = make_docs(6, seed=8, words_max=10)
    for i, d in enumerate(docs):
        (tmp_path / f"doc{i}.txt").write_text(d, encoding="utf-8")
    (tmp_path / "lines.txt").write_text("first line\r\n\nsecond line\nthird", encoding="utf-8")
    spec = ("sentencepiece", tokenizers_dir["sentencepiece"])
    tok = load_tokenizer(*spec)
    out = tmp_path / "out"
    cfg = write_config(
        tmp_path / "c.yaml",
        "files",
        spec,
        out,
        inputs=[str(tmp_path / "doc*.txt")],
        merge=True,
        output_name="books",
        text_document="file",
        workers=1,
    )
    assert run_cli(capsys, "run", "--config", cfg)[0] == 0
    assert_round_trip(str(out / "books_text_document"), tok, docs)
    cfg = write_config(tmp_path / "c.yaml", "files", spec, out, inputs=[str(tmp_path / "lines.txt")], workers=1)
    assert run_cli(capsys, "run", "--config", cfg)[0] == 0
    assert_round_trip(str(out / "lines_text_document"), tok, ["first line", "second line", "third"])
    assert marker(str(out / "lines_text_document"))["skipped"] == {"blank_line": 1}


def test_documents_without_eod_as_in_mlperf_c4(tmp_path, capsys, tokenizers_dir):
    """append_eod=false: each document is its tokens alone (MLPerf's C4 files); verify accepts that, and turning
    the setting back on redoes the shard with an EOD after every document."""
    src = write_shard(tmp_path / "d.jsonl.gz", make_docs(40, seed=21))
    spec = ("sentencepiece", tokenizers_dir["sentencepiece"])
    tok = load_tokenizer(*spec)
    out = tmp_path / "out"
    prefix = str(out / "d_text_document")
    cfg = write_config(tmp_path / "c.yaml", "files", spec, out, inputs=[str(src.path)], workers=2, append_eod=False)
    assert run_cli(capsys, "run", "--config", cfg)[0] == 0
    docs = read_documents(prefix)
    assert [ids.tolist() for ids in docs] == [tok.encode(text) for text in src.docs]
    assert marker(prefix)["append_eod"] is False
    assert marker(prefix)["tokens"] == sum(len(tok.encode(text)) for text in src.docs)
    rc, stdout, _ = run_cli(capsys, "verify", "--config", cfg)
    assert rc == 0, stdout

    cfg = write_config(tmp_path / "c.yaml", "files", spec, out, inputs=[str(src.path)], workers=2)
    rc, stdout, _ = run_cli(capsys, "run", "--config", cfg)
    assert rc == 0 and "made with other settings" in stdout
    assert_round_trip(prefix, tok, src.docs)
    assert marker(prefix)["append_eod"] is True


def test_append_eod_must_be_a_boolean(tmp_path, capsys, tokenizers_dir):
    src = write_shard(tmp_path / "d.jsonl", make_docs(3, seed=2))
    cfg = write_config(
        tmp_path / "c.yaml",
        "files",
        ("sentencepiece", tokenizers_dir["sentencepiece"]),
        tmp_path / "out",
        inputs=[str(src.path)],
        append_eod="no",
    )
    rc, _, err = run_cli(capsys, "run", "--config", cfg)
    assert rc == 2 and "data_preparation.append_eod='no' must be true or false" in err  # the schema's type


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt, SystemExit])
def test_shard_lock_is_released_on_every_way_out(tmp_path, error):
    from data_prep.pipeline import ShardBusy, shard_lock

    prefix = str(tmp_path / "x_text_document")
    with pytest.raises(error):
        with shard_lock(prefix):
            assert os.path.exists(prefix + ".lock")
            raise error()
    assert not os.path.exists(prefix + ".lock")
    with shard_lock(prefix):  # held: a second taker is refused and leaves the holder's file alone
        with pytest.raises(ShardBusy, match="another process is preparing this shard"):
            with shard_lock(prefix):
                pass
        assert os.path.exists(prefix + ".lock")
    assert not os.path.exists(prefix + ".lock")


@pytest.mark.parametrize(
    "override, line",
    [
        ("chunk_bytes=0", "data_preparation.chunk_bytes=0: expected a number of bytes from 4096 to 1073741824"),
        ("chunk_bytes=-5", "data_preparation.chunk_bytes=-5: expected a number of bytes from 4096"),
        ("chunk_bytes=abc", "data_preparation.chunk_bytes='abc' must be an integer"),  # the schema's type
        ("workers=0", "data_preparation.workers=0: expected a positive integer (tokenizer processes) or auto"),
        ("workers=abc", "data_preparation.workers='abc': expected a positive integer (tokenizer processes) or auto"),
        ("keep_downloads=maybe", "data_preparation.keep_downloads='maybe' must be true or false"),
        ("download.timeout_s=0", "data_preparation.download.timeout_s=0: expected seconds, above 0"),
    ],
)
def test_bad_settings_stop_before_anything_is_written(tmp_path, capsys, tokenizers_dir, override, line):
    src = write_shard(tmp_path / "a.jsonl", make_docs(3, seed=2))
    out = tmp_path / "out"
    cfg = write_config(
        tmp_path / "c.yaml",
        "files",
        ("sentencepiece", tokenizers_dir["sentencepiece"]),
        out,
        inputs=[str(src.path)],
        workers=1,
    )
    rc, stdout, stderr = run_cli(capsys, "run", "--config", cfg, f"data_preparation.{override}")
    assert rc == 2 and len(stderr.splitlines()) == 1 and stderr.startswith(f"data_prep: error: {line}"), stderr
    assert not stdout and not out.exists()


def test_every_bad_setting_is_reported_at_once(tmp_path, capsys, tokenizers_dir):
    src = write_shard(tmp_path / "a.jsonl", make_docs(3, seed=2))
    cfg = write_config(
        tmp_path / "c.yaml",
        "files",
        ("sentencepiece", tokenizers_dir["sentencepiece"]),
        tmp_path / "out",
        inputs=[str(src.path), str(tmp_path / "gone.jsonl"), "/nowhere/*.txt"],
    )
    rc, _, stderr = run_cli(
        capsys,
        "run",
        "--config",
        cfg,
        "data_preparation.workers=0",
        "data_preparation.chunk_bytes=0",
        f"data_preparation.tokenizer.path={src.path}",
    )
    assert rc == 2
    assert [line.split(": ")[2].split("=")[0] for line in stderr.splitlines()] == [
        "data_preparation.workers",
        "data_preparation.chunk_bytes",
        "data_preparation.tokenizer.path",
        "data_preparation.inputs",
    ]
    assert f"nothing matches {tmp_path / 'gone.jsonl'}, /nowhere/*.txt" in stderr


def test_zero_chunk_bytes_cannot_hang(tmp_path, tokenizers_dir):
    """It used to spin forever at 100% CPU once the input was read; now the config is refused."""
    src = write_shard(tmp_path / "a.jsonl", make_docs(3, seed=2))
    cfg = write_config(
        tmp_path / "c.yaml",
        "files",
        ("sentencepiece", tokenizers_dir["sentencepiece"]),
        tmp_path / "out",
        inputs=[str(src.path)],
        workers=1,
        chunk_bytes=0,
    )
    proc = subprocess.run(
        [sys.executable, "-m", "data_prep", "run", "--config", str(cfg), "--no-progress"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and proc.stderr.splitlines() == [
        "data_prep: error: data_preparation.chunk_bytes=0: expected a number of bytes from 4096 to 1073741824 "
        "(default 262144; it only tunes speed)"
    ]


@pytest.mark.parametrize(
    "kind, name, says",
    [
        ("huggingface", "empty_dir", "is a directory without tokenizer.json"),
        (
            "huggingface",
            "sp_model",
            "is a sentencepiece model, not a Hugging Face tokenizer: set data_preparation.tokenizer.type=sentencepiece",
        ),
        ("sentencepiece", "corpus", "is a JSON lines file (a corpus?), not a sentencepiece model"),
    ],
)
def test_tokenizer_of_the_wrong_kind_is_one_line(tmp_path, capsys, tokenizers_dir, kind, name, says):
    src = write_shard(tmp_path / "a.jsonl", make_docs(3, seed=2))
    (tmp_path / "empty_dir").mkdir()
    path = {
        "empty_dir": str(tmp_path / "empty_dir"),
        "sp_model": tokenizers_dir["sentencepiece"],
        "corpus": str(src.path),
    }[name]
    cfg = write_config(tmp_path / "c.yaml", "files", (kind, path), tmp_path / "out", inputs=[str(src.path)])
    rc, _, stderr = run_cli(capsys, "run", "--config", cfg)
    (line,) = stderr.splitlines()
    assert rc == 2 and line.startswith(f"data_prep: error: data_preparation.tokenizer.path={path} {says}")
    assert not (tmp_path / "out").exists()


def test_truncated_local_input_names_the_file_and_keeps_it(tmp_path, capsys, tokenizers_dir):
    whole = write_shard(tmp_path / "w.jsonl.gz", make_docs(300, seed=2), frames=1).path.read_bytes()
    (tmp_path / "cut.jsonl.gz").write_bytes(whole[: len(whole) // 2])
    out = tmp_path / "out"
    cfg = write_config(
        tmp_path / "c.yaml",
        "files",
        ("sentencepiece", tokenizers_dir["sentencepiece"]),
        out,
        inputs=[str(tmp_path / "cut.jsonl.gz")],
        workers=1,
    )
    rc, _, stderr = run_cli(capsys, "run", "--config", cfg)
    (line,) = [x for x in stderr.splitlines() if x.startswith("data_prep: shard")]
    assert rc == 1 and f"cannot read {tmp_path / 'cut.jsonl.gz'}: gzip data ends in the middle of a frame" in line
    assert line.endswith("(the file is truncated); replace it with a complete copy") and "download" not in line
    assert (tmp_path / "cut.jsonl.gz").exists() and sorted(p.name for p in out.iterdir()) == []
