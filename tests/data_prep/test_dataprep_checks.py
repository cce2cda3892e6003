"""The launcher's plan-time data checks (data_prep.checks): real .bin/.idx pairs made by the pipeline, then
damaged; data_preparation sections as main.py composes them, then given bad values."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import struct
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import yaml

from common.config import DataPreparationConfig, TokenizerConfig, TokenizerType
from common.typed import to_plain
from launcher.config.compose import compose

from data_prep import checks
from data_prep.checks import pair_problem, preparation_problems, prepared_data_problems
from data_prep.config import load_config_file
from data_prep.shards import ConfigError
from dataprep_helpers import REPO, copy_of, make_docs, write_shard

KEY = "training.data.blend"


def tokenizer_setting(kind: str, path: str) -> TokenizerConfig:
    return TokenizerConfig(type=TokenizerType(kind), path=path)


def sp_tokenizer(tokenizers_dir) -> TokenizerConfig:
    return tokenizer_setting("sentencepiece", tokenizers_dir["sentencepiece"])


def megatron_index(prefix: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import IndexedDataset

        return IndexedDataset(prefix).index


# -- prepared data -----------------------------------------------------------------------------------------


def test_sound_pairs_have_no_problems(prepared, tokenizers_dir):
    prefixes = [str(prepared / "a_text_document"), str(prepared / "b_text_document")]
    assert prepared_data_problems(KEY, prefixes, sp_tokenizer(tokenizers_dir)) == []


def test_the_header_reads_as_megatron_reads_it(prepared):
    from megatron.core.datasets.indexed_dataset import DType

    prefix = str(prepared / "a_text_document")
    index = megatron_index(prefix)
    with open(prefix + ".idx", "rb") as f:
        header = checks.read_index_header(f, os.path.getsize(prefix + ".idx"))
        needed = checks._data_bytes(f, header)
    assert (header.dtype, header.sequences, header.documents) == (
        index.dtype.__name__,
        len(index.sequence_lengths),
        len(index.document_indices),
    )
    assert needed == os.path.getsize(prefix + ".bin") == int(index.sequence_lengths.sum()) * header.itemsize
    # the dtype table stays megatron's
    assert checks.INDEX_DTYPES == {d.value: (d.name, DType.size(d.value)) for d in DType}
    assert checks.INDEX_MAGIC == __import__("megatron.core.datasets.indexed_dataset", fromlist=["x"])._INDEX_HEADER


def test_missing_files(prepared, tmp_path, tokenizers_dir):
    a = copy_of(prepared, "a", tmp_path)
    b = copy_of(prepared, "b", tmp_path)
    os.remove(a + ".idx")
    os.remove(b + ".bin")
    gone = str(tmp_path / "never_text_document")
    assert prepared_data_problems(KEY, [a, b, gone], sp_tokenizer(tokenizers_dir)) == [
        f"{KEY}: no {a}.idx; run the data_preparation stage first (stages=[data_preparation,training]) or fix the "
        "prefix",
        f"{KEY}: no {b}.bin; run the data_preparation stage first (stages=[data_preparation,training]) or fix the "
        "prefix",
        f"{KEY}: no {gone}.bin/.idx; run the data_preparation stage first (stages=[data_preparation,training]) or "
        "fix the prefix",
    ]


def _truncate(path: str, by: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - by)


def _patch(path: str, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


DAMAGE = {
    "empty .idx": (lambda p: _truncate(p + ".idx", os.path.getsize(p + ".idx")), ".idx is empty (0 bytes)"),
    "empty .bin": (lambda p: _truncate(p + ".bin", os.path.getsize(p + ".bin")), ".bin is empty, its .idx says "),
    "truncated .bin": (lambda p: _truncate(p + ".bin", 2), ".bin has "),
    "longer .bin": (lambda p: open(p + ".bin", "ab").write(b"\0\0"), ".bin has "),
    "truncated .idx": (lambda p: _truncate(p + ".idx", 8), "document entries) needs "),
    "random .idx": (
        lambda p: Path(p + ".idx").write_bytes(os.urandom(os.path.getsize(p + ".idx"))),
        ".idx is not a megatron index (it starts with ",
    ),
    "index version 2": (lambda p: _patch(p + ".idx", 9, struct.pack("<Q", 2)), "has index version 2"),
    "unknown dtype": (lambda p: _patch(p + ".idx", 17, b"\x09"), "has an unknown dtype code 9"),
    "wrong last document index": (
        lambda p: _patch(p + ".idx", os.path.getsize(p + ".idx") - 8, struct.pack("<q", 7)),
        "has document indices 0..7, not 0..40",
    ),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_each_damage_is_one_line_naming_the_file_and_the_fix(prepared, tmp_path, tokenizers_dir, damage):
    a = copy_of(prepared, "a", tmp_path)
    b = copy_of(prepared, "b", tmp_path)
    do, says = DAMAGE[damage]
    do(a)
    (line,) = prepared_data_problems(KEY, [a, b], sp_tokenizer(tokenizers_dir))
    assert line.startswith(f"{KEY}: {a}") and says in line, line
    assert line.endswith(
        "; prepare it again (the data_preparation stage; python -m data_prep run --force if it says already done)"
    )


def test_index_from_another_shard(prepared, tmp_path):
    a = copy_of(prepared, "a", tmp_path)
    shutil.copy(prepared / "b_text_document.idx", a + ".idx")
    b_size = os.path.getsize(prepared / "b_text_document.bin")
    assert pair_problem(a).startswith(
        f"{a}.bin has {os.path.getsize(a + '.bin'):,} bytes, its .idx says "
        f"{b_size:,} (truncated, or the two come from different runs)"
    )


def test_multimodal_indexes_keep_their_mode_bytes(prepared, tmp_path):
    """megatron's multimodal layout adds one mode byte per sequence; any other size is damage."""
    a = copy_of(prepared, "a", tmp_path)
    open(a + ".idx", "ab").write(b"\0" * 40)  # 40 sequences
    assert pair_problem(a) is None
    open(a + ".idx", "ab").write(b"\0")
    assert "needs" in pair_problem(a)


def test_an_index_of_no_documents(tmp_path):
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    import numpy as np

    builder = IndexedDatasetBuilder(str(tmp_path / "e.bin"), dtype=np.uint16)
    builder.finalize(str(tmp_path / "e.idx"))
    assert pair_problem(str(tmp_path / "e")).startswith(f"{tmp_path / 'e'}.idx holds no documents")


# -- the tokenizer the data was made with ------------------------------------------------------------------


def test_another_tokenizer_is_one_line_naming_both(prepared, tmp_path, tokenizers_dir):
    a = copy_of(prepared, "a", tmp_path)
    b = copy_of(prepared, "b", tmp_path)
    hf = tokenizer_setting("huggingface", tokenizers_dir["huggingface"])
    from data_prep.tokenizer import load_tokenizer

    sp = load_tokenizer("sentencepiece", tokenizers_dir["sentencepiece"])
    bpe = load_tokenizer("huggingface", tokenizers_dir["huggingface"])
    assert prepared_data_problems(KEY, [a, b], hf) == [
        f"{KEY}: {p} was tokenized with another tokenizer: sentencepiece:{tokenizers_dir['sentencepiece']} (vocab "
        f"{sp.vocab_size}, eod {sp.eod}), training.tokenizer is huggingface:{tokenizers_dir['huggingface']} (vocab "
        f"{bpe.vocab_size}, eod {bpe.eod}); prepare the data with training's tokenizer or set training.tokenizer to "
        "the one the data was made with"
        for p in (a, b)
    ]


def test_same_setting_is_not_loaded(prepared, tmp_path, tokenizers_dir, monkeypatch):
    def no_loading(*args, **kwargs):
        raise AssertionError("the tokenizer was loaded")

    monkeypatch.setattr(checks, "load_tokenizer", no_loading)
    prefixes = [str(prepared / "a_text_document"), str(prepared / "b_text_document")]
    (tmp_path / "link.model").symlink_to(tokenizers_dir["sentencepiece"])  # another name for the same file
    for path in (tokenizers_dir["sentencepiece"], str(tmp_path / "link.model")):
        assert prepared_data_problems(KEY, prefixes, tokenizer_setting("sentencepiece", path)) == []


def test_a_copy_elsewhere_is_loaded_once_and_matches(prepared, tmp_path, tokenizers_dir, monkeypatch):
    shutil.copy(tokenizers_dir["sentencepiece"], tmp_path / "copy.model")
    loads = []
    real = checks.load_tokenizer
    monkeypatch.setattr(checks, "load_tokenizer", lambda *a, **k: loads.append(a) or real(*a, **k))
    prefixes = [str(prepared / "a_text_document"), str(prepared / "b_text_document")]
    tok = tokenizer_setting("sentencepiece", str(tmp_path / "copy.model"))
    assert prepared_data_problems(KEY, prefixes, tok) == [] and len(loads) == 1


def test_data_without_a_marker_is_not_compared(prepared, tmp_path, tokenizers_dir):
    a = copy_of(prepared, "a", tmp_path)
    os.remove(a + ".done.json")  # made by another tool: nothing records its tokenizer
    assert prepared_data_problems(KEY, [a], tokenizer_setting("huggingface", tokenizers_dir["huggingface"])) == []


def test_hub_tokenizer_outside_the_cache_is_skipped(prepared, tmp_path, monkeypatch):
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    tok = tokenizer_setting("huggingface", "some-org/not-downloaded")
    assert prepared_data_problems(KEY, [str(prepared / "a_text_document")], tok) == []


def test_hub_tokenizer_in_the_cache_is_compared(prepared, tmp_path, tokenizers_dir, monkeypatch):
    import huggingface_hub.constants as constants

    snapshot = tmp_path / "hub" / "models--some-org--bpe" / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (tmp_path / "hub" / "models--some-org--bpe" / "refs").mkdir()
    (tmp_path / "hub" / "models--some-org--bpe" / "refs" / "main").write_text("0123abcd")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(tokenizers_dir["huggingface"]) / name, snapshot / name)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    (line,) = prepared_data_problems(
        KEY, [str(prepared / "a_text_document")], tokenizer_setting("huggingface", "some-org/bpe")
    )
    assert "was tokenized with another tokenizer" in line and "training.tokenizer is huggingface:some-org/bpe" in line


def test_an_unusable_training_tokenizer_is_said_once(prepared, tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"text": "not a tokenizer"}) + "\n")
    prefixes = [str(prepared / "a_text_document"), str(prepared / "b_text_document")]
    (line,) = prepared_data_problems(KEY, prefixes, tokenizer_setting("sentencepiece", str(corpus)))
    assert line.startswith(
        "training.tokenizer: cannot be loaded to compare it with the data's tokenizer: "
        f"training.tokenizer.path={corpus} is a JSON lines file"
    )


# -- the data_preparation section --------------------------------------------------------------------------


def composed(*overrides: str) -> DataPreparationConfig:
    """The data_preparation section as main.py composes it."""
    return compose(["data_preparation.output_dir=/data/out", *overrides]).data_preparation


@pytest.mark.parametrize("name", ["pile", "c4", "mlperf_llama31_8b", "mlperf_llama31_405b"])
def test_the_shipped_configs_have_no_problems(name):
    assert preparation_problems(composed(f"data_preparation={name}")) == []


def test_a_run_directorys_section_and_a_composed_one_alike(tmp_path):
    composed_cfg = compose(["data_preparation.output_dir=/data/out", "data_preparation.workers=0"])
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(to_plain(composed_cfg)))  # what the launcher writes
    from_file = load_config_file(str(tmp_path / "config.yaml")).section
    assert from_file == composed_cfg.data_preparation
    assert (
        preparation_problems(composed_cfg.data_preparation)
        == preparation_problems(from_file)
        == ["data_preparation.workers=0: expected a positive integer (tokenizer processes) or auto"]
    )


@pytest.fixture
def files_cfg(tmp_path, tokenizers_dir):
    """A files section over one real input with a real tokenizer, read as `python -m data_prep` reads a run
    directory's config.yaml with `data_preparation.KEY=VALUE` overrides."""
    src = write_shard(tmp_path / "in.jsonl", make_docs(3, seed=1))
    (tmp_path / "hf_without_json").mkdir()
    cfg = compose(
        [
            "data_preparation.output_dir=/data/out",
            "data_preparation=files",
            f"data_preparation.inputs=[{src.path}]",
            "training.tokenizer.type=sentencepiece",
            f"training.tokenizer.path={tokenizers_dir['sentencepiece']}",
        ]
    )
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(to_plain(cfg)))

    def make(*overrides: str) -> DataPreparationConfig:
        return load_config_file(str(path), overrides).section

    return make


def test_a_sound_files_section(files_cfg):
    assert preparation_problems(files_cfg()) == []


@pytest.mark.parametrize(
    "override, line",
    [
        ("workers=0", "data_preparation.workers=0: expected a positive integer (tokenizer processes) or auto"),
        ("workers=abc", "data_preparation.workers='abc': expected a positive integer (tokenizer processes) or auto"),
        (
            "chunk_bytes=0",
            "data_preparation.chunk_bytes=0: expected a number of bytes from 4096 to 1073741824 "
            "(default 262144; it only tunes speed)",
        ),
        (
            "chunk_bytes=-5",
            "data_preparation.chunk_bytes=-5: expected a number of bytes from 4096 to 1073741824 "
            "(default 262144; it only tunes speed)",
        ),
        (
            "chunk_bytes=100",
            "data_preparation.chunk_bytes=100: expected a number of bytes from 4096 to 1073741824 "
            "(default 262144; it only tunes speed)",
        ),
        ("download.retries=-1", "data_preparation.download.retries=-1: expected a whole number, at least 0"),
        (
            "checksums_file=/nowhere/SHA256SUMS",
            "data_preparation.checksums_file=/nowhere/SHA256SUMS does not exist: "
            "give a sha256sum list's path or URL, or null",
        ),
        (
            "inputs=[/nowhere/a.jsonl,/nowhere/*.zst]",
            "data_preparation.inputs: nothing matches /nowhere/a.jsonl, /nowhere/*.zst",
        ),
        (
            "output_dir=data/files",
            "data_preparation.output_dir: 'data/files' is relative; give an absolute path (jobs "
            "do not run in the directory you launch from)",
        ),
    ],
)
def test_each_bad_value_is_one_line(files_cfg, override, line):
    assert preparation_problems(files_cfg(f"data_preparation.{override}")) == [line]


@pytest.mark.parametrize(
    "override, line",
    [
        ("append_eod=maybe", "data_preparation.append_eod='maybe' must be true or false"),
        ("format=csv", "data_preparation.format='csv' is none of auto, jsonl, text"),
        ("tokenizer.type=tiktoken", "data_preparation.tokenizer.type='tiktoken' is none of huggingface, sentencepiece"),
        ("chunk_bytes=abc", "data_preparation.chunk_bytes='abc' must be an integer"),
        ("colour=blue", "data_preparation.colour is not a config key: remove it"),
    ],
)
def test_a_value_of_the_wrong_type_is_refused_when_read(files_cfg, override, line):
    """The schema's types, checked as the file is read: one line naming the key."""
    with pytest.raises(ConfigError) as err:
        files_cfg(f"data_preparation.{override}")
    assert str(err.value) == line


def test_tokenizer_paths_of_the_wrong_kind(files_cfg, tmp_path, tokenizers_dir):
    key = "data_preparation.tokenizer"
    (hf_dir,) = preparation_problems(files_cfg(f"{key}.type=huggingface", f"{key}.path={tmp_path}"))
    assert hf_dir.startswith(f"{key}.path={tmp_path} is a directory without tokenizer.json")
    (sp_as_hf,) = preparation_problems(files_cfg(f"{key}.type=huggingface"))
    assert sp_as_hf.endswith(f"is a sentencepiece model, not a Hugging Face tokenizer: set {key}.type=sentencepiece")
    (jsonl_as_sp,) = preparation_problems(files_cfg(f"{key}.path={tmp_path / 'in.jsonl'}"))
    assert "is a JSON lines file (a corpus?), not a sentencepiece model" in jsonl_as_sp


def test_every_problem_at_once(files_cfg):
    problems = preparation_problems(
        files_cfg(
            "data_preparation.workers=0",
            "data_preparation.chunk_bytes=0",
            "data_preparation.tokenizer.path=/nowhere/tok.model",
            "data_preparation.inputs=[/nowhere/x.jsonl]",
        )
    )
    assert [p.split("=")[0].split(":")[0] for p in problems] == [
        "data_preparation.workers",
        "data_preparation.chunk_bytes",
        "data_preparation.tokenizer.path",
        "data_preparation.inputs",
    ]


def test_pile_numbers_and_a_local_mirror(tmp_path):
    assert preparation_problems(composed("data_preparation.file_numbers=28-31")) == [
        "data_preparation.file_numbers: [30, 31] outside 0-29 (the source has 30 shards)"
    ]
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / "00.jsonl.zst").write_bytes(b"")
    dp = composed(
        f"data_preparation.base_url={mirror}",
        "data_preparation.file_numbers=0-2",
        f"data_preparation.output_dir={tmp_path / 'out'}",
    )
    assert preparation_problems(dp) == [
        f"data_preparation.base_url={mirror}: 2 of the 3 local input files do not exist (first: "
        f"{mirror / '01.jsonl.zst'}); fix data_preparation.base_url or put the files there"
    ]
    (tmp_path / "out").mkdir()
    for n in (1, 2):  # finished shards do not read their inputs again
        (tmp_path / "out" / f"my-llama_{n:02d}_text_document.done.json").write_text("{}")
    assert preparation_problems(dp) == []


def test_an_unresolved_file_is_one_line(tmp_path):
    path = tmp_path / "section.yaml"
    path.write_text("name: files\noutput_dir: ${nowhere.dir}\n")  # hand-written, never through main.py
    with pytest.raises(ConfigError) as err:
        load_config_file(str(path))
    assert str(err.value) == (
        f"config {path}: cannot resolve data_preparation (data_preparation.output_dir=${{nowhere.dir}} is an "
        "interpolation); pass the resolved config.yaml the launcher writes into the run directory"
    )


@pytest.mark.parametrize(
    "overrides, line",
    [
        (["data_preparation.workers"], "override 'data_preparation.workers' is not key=value"),
        (
            ["data_preparation.workers.count=8"],
            "cannot apply overrides ['data_preparation.workers.count=8']: data_preparation.workers is a value, not a "
            "section: data_preparation.workers.count cannot be set",
        ),
    ],
)
def test_overrides_that_cannot_apply_are_one_line(files_cfg, overrides, line):
    with pytest.raises(ConfigError) as err:
        files_cfg(*overrides)
    assert str(err.value) == line


def test_a_file_with_just_the_section(tmp_path, files_cfg):
    """What `--config` also takes: the section alone, overridden by its full dotted paths."""
    path = tmp_path / "section.yaml"
    path.write_text(yaml.safe_dump(to_plain(files_cfg())))
    read = load_config_file(str(path), ["data_preparation.workers=3"])
    assert read.run is None and read.section == dataclasses.replace(files_cfg(), workers=3)


def test_the_checks_import_nothing_heavy(prepared, tokenizers_dir):
    """The launcher imports them without torch, numpy or tokenizer libraries; a check of prepared data with the
    same tokenizer setting loads none either."""
    code = (
        "import sys, json\n"
        "from common.config import VARIANTS, DataPreparationConfig, TokenizerConfig, TokenizerType\n"
        "from common.typed import from_plain\n"
        "from data_prep.checks import preparation_problems, prepared_data_problems\n"
        "tok = TokenizerConfig(TokenizerType.sentencepiece, sys.argv[2])\n"
        "assert prepared_data_problems('training.data.blend', [sys.argv[1]], tok) == []\n"
        "dp = from_plain(DataPreparationConfig, json.loads(sys.argv[3]), VARIANTS, 'data_preparation')\n"
        "assert preparation_problems(dp) == [], preparation_problems(dp)\n"
        "heavy = [m for m in ('torch', 'numpy', 'megatron', 'tokenizers', 'sentencepiece', 'omegaconf', 'zstandard',"
        " 'tqdm', 'huggingface_hub', 'transformers') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    dp = to_plain(composed("data_preparation=c4"))
    subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            str(prepared / "a_text_document"),
            tokenizers_dir["sentencepiece"],
            json.dumps(dp),
        ],
        check=True,
        cwd=REPO,
    )
