"""Shard listing: what the launcher sizes the Slurm array with, composed from the real configs."""

from __future__ import annotations

import subprocess
import sys

import pytest

from common.config import DATA_SOURCES, DataPreparationConfig
from launcher.config.compose import compose

from data_prep.shards import (
    ConfigError,
    detect_format,
    inputs_setting,
    list_shards,
    output_prefixes,
    parse_numbers,
    source_shards,
    strip_extensions,
)
from dataprep_helpers import REPO


def composed(*overrides: str) -> DataPreparationConfig:
    """The data_preparation section as main.py composes it (typed, as the launcher passes it)."""
    return compose(["data_preparation.output_dir=/data/out", *overrides]).data_preparation


def test_shards_module_imports_nothing_heavy():
    code = (
        "import sys, data_prep.shards\n"
        "heavy = [m for m in ('torch', 'numpy', 'megatron', 'tokenizers', 'sentencepiece', 'zstandard', 'tqdm',"
        " 'omegaconf') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_pile_default_is_two_shards_like_the_public_recipe():
    shards = list_shards(composed())
    assert [s.index for s in shards] == [0, 1]
    assert [s.name for s in shards] == ["my-llama_00", "my-llama_01"]
    assert [s.output_prefix for s in shards] == [
        "/data/out/my-llama_00_text_document",
        "/data/out/my-llama_01_text_document",
    ]
    src = shards[1].sources[0]
    assert src.uri == "https://huggingface.co/datasets/monology/pile-uncopyrighted/resolve/main/train/01.jsonl.zst"
    assert src.local_path == "/data/out/raw/01.jsonl.zst"
    assert (src.compression, src.kind, src.remote) == ("zstd", "jsonl", True)


@pytest.mark.parametrize(
    "numbers, expected", [("0-29", list(range(30))), ("3", [3]), ("'0,2,5-7'", [0, 2, 5, 6, 7]), ("[4,1]", [1, 4])]
)
def test_pile_file_numbers(numbers, expected):
    shards = list_shards(composed(f"data_preparation.file_numbers={numbers}"))
    assert [s.name for s in shards] == [f"my-llama_{n:02d}" for n in expected]
    assert [s.index for s in shards] == list(range(len(expected)))


def test_pile_mirror_on_the_file_system_is_read_in_place(tmp_path):
    shards = list_shards(composed(f"data_preparation.base_url=file://{tmp_path}", "data_preparation.file_numbers=7"))
    src = shards[0].sources[0]
    assert not src.remote and src.local_path == str(tmp_path / "07.jsonl.zst")


def test_c4_mlperf_layout():
    shards = list_shards(composed("data_preparation=c4"))
    assert [s.name for s in shards] == ["c4-train.en_6", "c4-train.en_7", "c4-validation-91205-samples.en"]
    assert shards[0].output_prefix == "/data/out/c4-train.en_6_text_document"
    assert shards[2].output_prefix == "/data/out/c4-validation-91205-samples.en_text_document"
    en6 = [s.file_name for s in shards[0].sources]
    assert len(en6) == 128
    assert en6[0] == "c4-train.00768-of-01024.json.gz" and en6[-1] == "c4-train.00895-of-01024.json.gz"
    assert shards[1].sources[-1].file_name == "c4-train.01023-of-01024.json.gz"
    assert shards[0].sources[0].uri.startswith("https://huggingface.co/datasets/allenai/c4/resolve/main/en/")
    val = shards[2]
    assert val.max_documents == 91205 and shards[0].max_documents is None
    assert [s.file_name for s in val.sources] == [f"c4-validation.{i:05d}-of-00008.json.gz" for i in range(8)]
    assert all(s.compression == "gzip" and s.kind == "jsonl" for s in val.sources)


def test_c4_all_merged_files_cover_every_train_file_once():
    shards = list_shards(
        composed(
            "data_preparation=c4", "data_preparation.train.tokenize=0-7", "data_preparation.validation.enabled=false"
        )
    )
    assert [s.name for s in shards] == [f"c4-train.en_{k}" for k in range(8)]
    files = [src.file_name for s in shards for src in s.sources]
    assert files == [f"c4-train.{i:05d}-of-01024.json.gz" for i in range(1024)]


def test_c4_validation_name_follows_its_size():
    shards = list_shards(composed("data_preparation=c4", "data_preparation.validation.max_documents=1000"))
    assert shards[-1].name == "c4-validation-1000-samples.en" and shards[-1].max_documents == 1000


def test_files_globs_sorted_and_merge(tmp_path):
    for name in ["b.jsonl.zst", "a.json.gz", "c.txt", "notes.md"]:
        (tmp_path / name).write_bytes(b"")
    dp = composed("data_preparation=files", f"data_preparation.inputs=[{tmp_path}/*.json*,{tmp_path}/c.txt]")
    shards = list_shards(dp)
    assert [s.name for s in shards] == ["a", "b", "c"]
    assert [(s.sources[0].compression, s.sources[0].kind) for s in shards] == [
        ("gzip", "jsonl"),
        ("zstd", "jsonl"),
        ("none", "text"),
    ]
    assert output_prefixes(dp) == [f"/data/out/{n}_text_document" for n in "abc"]
    merged = list_shards(
        composed(
            "data_preparation=files",
            f"data_preparation.inputs=[{tmp_path}/*.json*]",
            "data_preparation.merge=true",
            "data_preparation.output_name=all",
        )
    )
    assert (
        len(merged) == 1
        and merged[0].name == "all"
        and [s.file_name for s in merged[0].sources] == ["a.json.gz", "b.jsonl.zst"]
    )


def test_files_urls_download_into_download_dir():
    shards = list_shards(
        composed("data_preparation=files", "data_preparation.inputs=[https://mirror.example/x/part-1.jsonl.gz]")
    )
    assert shards[0].sources[0].local_path == "/data/out/raw/part-1.jsonl.gz" and shards[0].name == "part-1"


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["data_preparation.file_numbers=30"], "file_numbers: [30] outside 0-29"),
        (["data_preparation.file_numbers=2-1"], "is empty"),
        (["data_preparation.file_numbers=abc"], "cannot read 'abc'"),
        (["data_preparation=files"], "data_preparation.inputs is empty"),
        (
            ["data_preparation=files", "data_preparation.inputs=[/nonexistent/*.jsonl]"],
            "nothing matches /nonexistent/*.jsonl",
        ),
        (
            ["data_preparation=files", "data_preparation.inputs=[corpus/*.jsonl]"],
            "inputs: 'corpus/*.jsonl' is relative",
        ),
        (["data_preparation.output_dir=data/pile"], "output_dir: 'data/pile' is relative"),
        (["data_preparation.base_url=mirror/pile"], "base_url: 'mirror/pile/00.jsonl.zst' is relative"),
        (["data_preparation=c4", "data_preparation.train.merged_files=7"], "must divide train.num_files=1024"),
        (["data_preparation=c4", "data_preparation.train.tokenize=8"], "merged file 8 does not exist"),
        (
            ["data_preparation=c4", "data_preparation.train.tokenize=[]", "data_preparation.validation.enabled=false"],
            "selects nothing",
        ),
    ],
)
def test_config_errors_name_the_key(overrides, message):
    with pytest.raises(ConfigError) as err:
        list_shards(composed(*overrides))
    assert message in str(err.value)


@pytest.mark.parametrize("source", DATA_SOURCES.values(), ids=list(DATA_SOURCES))
def test_every_data_source_has_a_shard_layout(source):
    """common/config.py's DATA_SOURCES is the one list of sources: each registers its shards and inputs here."""
    assert source_shards.dispatch(source) is not source_shards.dispatch(DataPreparationConfig)
    assert inputs_setting.dispatch(source) is not inputs_setting.dispatch(DataPreparationConfig)


def test_same_output_name_twice_is_an_error(tmp_path):
    for d in ("x", "y"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "part.jsonl").write_bytes(b"")
    with pytest.raises(ConfigError, match="several inputs would write .*part_text_document.bin"):
        list_shards(composed("data_preparation=files", f"data_preparation.inputs=[{tmp_path}/*/part.jsonl]"))


def test_parse_numbers_and_formats():
    assert parse_numbers("0-1", "k") == [0, 1] and parse_numbers(5, "k") == [5]
    assert parse_numbers([3, "1-2"], "k") == [1, 2, 3]
    with pytest.raises(ConfigError):
        parse_numbers(True, "k")
    assert detect_format("x/00.jsonl.zst") == ("zstd", "jsonl")
    assert detect_format("https://h/c4-train.00001-of-01024.json.gz?download=1") == ("gzip", "jsonl")
    assert detect_format("book.txt") == ("none", "text") and detect_format("README") == ("none", "text")
    assert detect_format("data.bin", "jsonl") == ("none", "jsonl")
    assert detect_format("data/train-00000-of-00001.parquet") == ("none", "parquet")  # rows, read with pyarrow
    with pytest.raises(ConfigError, match="set data_preparation.format"):
        detect_format("data.csv")
    assert strip_extensions("00.jsonl.zst") == "00" and strip_extensions("v1.2.txt") == "v1.2"
