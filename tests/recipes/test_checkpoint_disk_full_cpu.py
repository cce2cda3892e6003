"""A checkpoint save that the disk refuses (ENOSPC): the trainer's Checkpointer stops the run with one line, gives
the partial save's space back, and leaves the previous complete checkpoint loadable. Once through the existing
fault point (resilience.inject_fault.kind=enospc, during=save), once on a real tmpfs too small for the second save.
One gloo rank; dist_checkpointing's writer is replaced by one that writes the shard file the real one would."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from common import checkpoints
from common.checkpoints import TrainState
from common.config import FaultConfig, FaultKind, FaultPoint
from recipes.resilience.faults import FaultInjector
from recipes.trainer import checkpoint
from recipes.trainer.cadence import SavePolicy

SHARD_BYTES = 300_000


@pytest.fixture
def one_rank(tmp_path):
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    yield
    torch.distributed.destroy_process_group()


@pytest.fixture
def writer(monkeypatch):
    """dist_checkpointing.save as files: one shard of SHARD_BYTES bytes (its content names the step)."""

    def save(state, directory, **extra):
        with open(os.path.join(directory, "__0_0.distcp"), "wb") as f:
            f.write(state["step"].to_bytes(8, "little") * (SHARD_BYTES // 8))

    monkeypatch.setattr(
        checkpoint, "sharded_state", lambda chunks, optimizer, scheduler, is_loading, adapters_only=False: {}
    )
    return save


def checkpointer(root: Path, writer, monkeypatch) -> checkpoint.Checkpointer:
    saver = checkpoint.Checkpointer(
        str(root),
        keep_last=2,
        async_save=False,
        policy=SavePolicy(10, True, False),
        chunks=[],
        optimizer=None,
        scheduler=None,
    )
    steps = {"step": 0}
    monkeypatch.setattr(
        checkpoint, "dist_checkpointing", SimpleNamespace(save=lambda state, d, **e: writer({"step": steps["step"]}, d))
    )
    original = saver.save

    def save(state: TrainState, in_flight=None):
        steps["step"] = state.step
        original(state, lambda line: None, in_flight=in_flight)

    saver.save_step = save  # type: ignore[attr-defined]
    return saver


def loadable(root: Path, step: int) -> bool:
    newest = checkpoints.latest_checkpoint(str(root))
    if newest is None or newest[0] != step:
        return False
    data = Path(newest[1], "__0_0.distcp").read_bytes()
    return checkpoints.read_train_state(newest[1]).step == step and data == step.to_bytes(8, "little") * (
        SHARD_BYTES // 8
    )


def check_stopped(err: pytest.ExceptionInfo, root: Path, step: int) -> None:
    message = str(err.value.code)
    assert "\n" not in message and message.startswith(
        f"error: no space left on the device for the checkpoint of step {step} under {root}: training stops; "
    ), message
    assert "iter_0000010 is intact and the run resumes from it" in message, message
    assert loadable(root, 10)
    assert not [p for p in os.listdir(root) if p.startswith(".partial_")]  # its space given back


def test_an_injected_enospc_while_saving_stops_the_run_and_keeps_the_previous_checkpoint(
    tmp_path, one_rank, writer, monkeypatch
):
    root = tmp_path / "run" / "checkpoints"
    saver = checkpointer(root, writer, monkeypatch)
    saver.save_step(TrainState(step=10, consumed_samples=80))
    enospc = FaultConfig(kind=FaultKind.enospc, rank=0, step=20, during=FaultPoint.save)
    fault = FaultInjector(str(tmp_path / "run"), enospc, 0, [])
    with pytest.raises(SystemExit) as err:
        saver.save_step(TrainState(step=20, consumed_samples=160), in_flight=lambda step: fault.at(step, "save"))
    check_stopped(err, root, 20)


def test_a_real_full_disk_stops_the_run_and_keeps_the_previous_checkpoint(
    tmp_path, one_rank, writer, monkeypatch, small_tmpfs
):
    disk = small_tmpfs(SHARD_BYTES * 3 // 2)
    root = disk / "checkpoints"
    saver = checkpointer(root, writer, monkeypatch)
    saver.save_step(TrainState(step=10, consumed_samples=80))
    with pytest.raises(SystemExit) as err:
        saver.save_step(TrainState(step=20, consumed_samples=160))
    check_stopped(err, root, 20)


def test_enospc_is_found_however_the_writer_wraps_it():
    wrapped = RuntimeError("save failed")
    wrapped.__cause__ = OSError(28, os.strerror(28))

    class CheckpointException(Exception):  # torch's: the failures of every rank, as exceptions or their text
        failures = {0: ValueError(f"[Errno 28] {os.strerror(28)}: '/x'")}

    assert checkpoint.disk_full(OSError(28, "x")) and checkpoint.disk_full(wrapped)
    assert checkpoint.disk_full(CheckpointException("save failed on 1 rank"))
    assert not checkpoint.disk_full(OSError(13, "Permission denied"))
