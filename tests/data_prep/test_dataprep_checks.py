"""The launcher's plan-time data checks (data_prep.checks): real .bin/.idx pairs made by the pipeline, then
damaged; data_preparation sections as main.py composes them, then given bad values."""

from __future__ import annotations

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
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from launcher.config.schema import register

from data_prep import checks
from data_prep.checks import pair_problem, preparation_problems, prepared_data_problems
from dataprep_helpers import REPO, copy_of, make_docs, write_shard

KEY = "training.data.blend"


def sp_tokenizer(tokenizers_dir) -> dict:
    return {"type": "sentencepiece", "path": tokenizers_dir["sentencepiece"]}


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
    hf = {"type": "huggingface", "path": tokenizers_dir["huggingface"]}
    from data_prep.tokenizer import load_tokenizer

    sp, bpe = load_tokenizer("sentencepiece", tokenizers_dir["sentencepiece"]), load_tokenizer(**hf)
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
        assert prepared_data_problems(KEY, prefixes, {"type": "sentencepiece", "path": path}) == []


def test_a_copy_elsewhere_is_loaded_once_and_matches(prepared, tmp_path, tokenizers_dir, monkeypatch):
    shutil.copy(tokenizers_dir["sentencepiece"], tmp_path / "copy.model")
    loads = []
    real = checks.load_tokenizer
    monkeypatch.setattr(checks, "load_tokenizer", lambda *a, **k: loads.append(a) or real(*a, **k))
    prefixes = [str(prepared / "a_text_document"), str(prepared / "b_text_document")]
    tok = {"type": "sentencepiece", "path": str(tmp_path / "copy.model")}
    assert prepared_data_problems(KEY, prefixes, tok) == [] and len(loads) == 1


def test_data_without_a_marker_is_not_compared(prepared, tmp_path, tokenizers_dir):
    a = copy_of(prepared, "a", tmp_path)
    os.remove(a + ".done.json")  # made by another tool: nothing records its tokenizer
    assert prepared_data_problems(KEY, [a], {"type": "huggingface", "path": tokenizers_dir["huggingface"]}) == []


def test_hub_tokenizer_outside_the_cache_is_skipped(prepared, tmp_path, monkeypatch):
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    tok = {"type": "huggingface", "path": "some-org/not-downloaded"}
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
        KEY, [str(prepared / "a_text_document")], {"type": "huggingface", "path": "some-org/bpe"}
    )
    assert "was tokenized with another tokenizer" in line and "training.tokenizer is huggingface:some-org/bpe" in line


def test_an_unusable_training_tokenizer_is_said_once(prepared, tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"text": "not a tokenizer"}) + "\n")
    prefixes = [str(prepared / "a_text_document"), str(prepared / "b_text_document")]
    (line,) = prepared_data_problems(KEY, prefixes, {"type": "sentencepiece", "path": str(corpus)})
    assert line.startswith(
        "training.tokenizer: cannot be loaded to compare it with the data's tokenizer: "
        f"training.tokenizer.path={corpus} is a JSON lines file"
    )


# -- the data_preparation section --------------------------------------------------------------------------


def composed(*overrides: str):
    """The data_preparation section as main.py composes it."""
    register()  # the schema and the ${path:} resolver the YAML files name
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        cfg = compose("config", overrides=["data_preparation.output_dir=/data/out", *overrides])
    return cfg.data_preparation


@pytest.mark.parametrize("name", ["pile", "c4", "mlperf_llama31_8b", "mlperf_llama31_405b"])
def test_the_shipped_configs_have_no_problems(name):
    assert preparation_problems(composed(f"data_preparation={name}")) == []


def test_a_plain_section_and_a_composed_one_alike(tmp_path):
    from omegaconf import OmegaConf

    dp = composed("data_preparation.workers=0")
    plain = OmegaConf.to_container(dp, resolve=True, enum_to_str=True)  # what to_plain gives the launcher
    assert (
        preparation_problems(dp)
        == preparation_problems(plain)
        == ["data_preparation.workers=0: expected a positive integer (tokenizer processes) or auto"]
    )


@pytest.fixture
def files_cfg(tmp_path, tokenizers_dir):
    """A files section over one real input with a real tokenizer, plus overrides."""
    src = write_shard(tmp_path / "in.jsonl", make_docs(3, seed=1))
    (tmp_path / "hf_without_json").mkdir()

    def make(*overrides: str):
        """The section as a run directory's config.yaml holds it (plain values), with the overrides applied to the
        file: data_prep reads such files itself, so it checks the values the schema would refuse in main.py too."""
        section = OmegaConf.create(
            OmegaConf.to_container(
                composed(
                    "data_preparation=files",
                    f"data_preparation.inputs=[{src.path}]",
                    "training.tokenizer.type=sentencepiece",
                    f"training.tokenizer.path={tokenizers_dir['sentencepiece']}",
                ),
                resolve=True,
                enum_to_str=True,
            )
        )
        for override in overrides:
            key, value = override.split("=", 1)
            OmegaConf.update(section, key.removeprefix("data_preparation."), yaml.safe_load(value), merge=False)
        return OmegaConf.to_container(section)

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
        ("append_eod=maybe", "data_preparation.append_eod='maybe': expected true or false"),
        ("format=csv", "data_preparation.format='csv' is not one of auto, jsonl, text"),
        ("download.retries=-1", "data_preparation.download.retries=-1: expected a whole number, at least 0"),
        (
            "checksums_file=/nowhere/SHA256SUMS",
            "data_preparation.checksums_file=/nowhere/SHA256SUMS does not exist: "
            "give a sha256sum list's path or URL, or null",
        ),
        (
            "tokenizer.type=tiktoken",
            "data_preparation.tokenizer.type='tiktoken' is not one of huggingface, sentencepiece",
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
            "data_preparation.tokenizer.type=bpe",
            "data_preparation.inputs=[/nowhere/x.jsonl]",
        )
    )
    assert [p.split("=")[0].split(":")[0] for p in problems] == [
        "data_preparation.workers",
        "data_preparation.chunk_bytes",
        "data_preparation.tokenizer.type",
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


def test_unresolvable_section_is_one_line():
    from omegaconf import OmegaConf

    dp = OmegaConf.create({"name": "files", "output_dir": "${nowhere.dir}"})
    (line,) = preparation_problems(dp)
    assert line.startswith("data_preparation: cannot resolve the section (")


def test_the_checks_import_nothing_heavy(prepared, tokenizers_dir):
    """The launcher imports them without torch, numpy or tokenizer libraries; a check of prepared data with the
    same tokenizer setting loads none either."""
    code = (
        "import sys, json\n"
        "from data_prep.checks import preparation_problems, prepared_data_problems\n"
        "tok = {'type': 'sentencepiece', 'path': sys.argv[2]}\n"
        "assert prepared_data_problems('training.data.blend', [sys.argv[1]], tok) == []\n"
        "dp = json.loads(sys.argv[3])\n"
        "assert preparation_problems(dp) == [], preparation_problems(dp)\n"
        "heavy = [m for m in ('torch', 'numpy', 'megatron', 'tokenizers', 'sentencepiece', 'omegaconf', 'zstandard',"
        " 'tqdm', 'huggingface_hub', 'transformers') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    dp = json.loads(json.dumps(composed_plain()))
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


def composed_plain() -> dict:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(composed("data_preparation=c4"), resolve=True, enum_to_str=True)
