"""The one atomic write every side uses: the new contents or the old, never half, and nothing left behind."""

from __future__ import annotations

import os
import stat

import pytest

from common.files import atomic_output, atomic_write


def test_text_and_bytes_replace_the_file_with_the_mode_asked(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("old")
    atomic_write(path, "new\n")
    assert path.read_text() == "new\n" and stat.S_IMODE(path.stat().st_mode) == 0o644
    atomic_write(path, b"\x00\x01", mode=0o755)
    assert path.read_bytes() == b"\x00\x01" and stat.S_IMODE(path.stat().st_mode) == 0o755
    assert os.listdir(tmp_path) == ["config.yaml"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "model-00001-of-00002.safetensors"
    path.write_bytes(b"complete")
    with pytest.raises(RuntimeError):
        with atomic_output(path, binary=True) as f:
            f.write(b"half of a ")
            raise RuntimeError("the export stopped here")
    assert path.read_bytes() == b"complete"
    assert os.listdir(tmp_path) == [path.name]


def test_the_temporary_lies_beside_the_target_under_a_hidden_unique_name(tmp_path):
    path = tmp_path / "plan.json"
    with atomic_output(path) as first, atomic_output(path) as second:
        names = sorted(os.listdir(tmp_path))
        assert len(names) == 2 and all(n.startswith(".plan.json.") and n.endswith(".tmp") for n in names)
        first.write("1")
        second.write("2")
    assert path.read_text() == "1"  # the writer that finishes last wins, whole (the inner block closed first)
    assert os.listdir(tmp_path) == ["plan.json"]
