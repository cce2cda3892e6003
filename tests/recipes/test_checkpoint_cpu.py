"""The checkpointer as one of the loop's callbacks, on the CPU (a gloo world of one process): when the run stops,
a save still being written is waited for where every rank stops together, and abandoned after an exception (which
may be one rank's, so no collective may follow), with a record in the run's events."""

from __future__ import annotations

import os
from pathlib import Path
import signal
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from common import run_events
from recipes.runtime.callbacks import ERROR, FINISHED, SIGNAL, Stop
from recipes.trainer import checkpoint
from recipes.trainer.cadence import SavePolicy

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def world_of_one(tmp_path):
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    yield
    torch.distributed.destroy_process_group()


class Writer:
    """An asynchronous save's writer process, still writing; records how it was let go."""

    def __init__(self):
        self.closed = []

    def is_current_async_call_done(self, blocking, no_dist):
        return False

    def close(self, abort=False):
        self.closed.append("killed" if abort else "joined")


def checkpointer_with_a_save_in_flight(run_dir, step: int):
    ckpt = checkpoint.Checkpointer(
        str(run_dir / "checkpoints"), 2, True, SavePolicy(interval=10, at_end=True, initial=False), [], None, None
    )
    writer = Writer()
    ckpt._queue.async_calls.append(SimpleNamespace(call_idx=0, async_caller=writer, async_request=None))
    ckpt._in_flight = step
    return ckpt, writer


def test_after_an_error_the_save_in_flight_is_abandoned_and_the_events_say_so(tmp_path, world_of_one):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints" / ".partial_iter_0000020.old").mkdir(parents=True)  # an earlier process's
    ckpt, writer = checkpointer_with_a_save_in_flight(run_dir, step=30)
    assert not (run_dir / "checkpoints" / ".partial_iter_0000020.old").exists()  # removed when a run starts
    ckpt.stops(Stop(ERROR, 34, 272, detail="RuntimeError: CUDA error"))
    assert writer.closed == ["killed"]
    assert [(e["event"], e["step"]) for e in run_events.read(str(run_dir))] == [("checkpoint_abandoned", 30)]


@pytest.mark.parametrize("reason", [FINISHED, SIGNAL])
def test_a_stop_every_rank_agrees_on_waits_for_the_save_instead(reason, tmp_path, world_of_one, monkeypatch):
    ckpt, writer = checkpointer_with_a_save_in_flight(tmp_path / "run", step=30)
    waited = []
    monkeypatch.setattr(
        ckpt._queue, "maybe_finalize_async_calls", lambda blocking=False, no_dist=False: waited.append(blocking)
    )
    ckpt.stops(Stop(reason, 34, 272))
    assert waited == [True] and writer.closed == []
    assert run_events.read(str(tmp_path / "run")) == []


# A trainer with an asynchronous save set up, killed hard (kill -9) as it starts writing.
KILLED_WHILE_SAVING = """
import os, signal
from megatron.core.dist_checkpointing.strategies import filesystem_async
from recipes.trainer import checkpoint
queue = checkpoint.writers_report_through_a_queue_that_dies_with_the_trainer()
assert filesystem_async.get_write_results_queue() is queue, "megatron's writers would start a manager of their own"
print("writers' queue ready", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_trainer_killed_hard_leaves_no_writer_queue_process_holding_its_output():
    """The writers' queue lives in a manager process. megatron-core starts it with 'spawn', and it outlived a
    trainer killed with kill -9, holding the job's stdout open: whoever read the output (the local launch, this
    test) waited forever. Ours dies with the trainer, so the reader gets end-of-file."""
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_WHILE_SAVING],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # the manager is in this process group: killed below if it outlives the trainer
    )
    try:
        output, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("a process the killed trainer started kept its output open: the writers' queue outlived it")
    assert "writers' queue ready" in output and proc.returncode == -signal.SIGKILL, output
