"""Hang detection under ft_launcher: each rank tells its rank monitor (nvidia-resiliency-ext's RankMonitorClient)
which part of the run it is in, and the monitor restarts every rank when one stays in a part longer than that
part's timeout (the job script passes them: launcher/jobs/commands.py, ft_launch_command):

    setup          from the rank's start to the end of its first step: build, load, the first step's warm-up
                   (resilience.startup_timeout_s)
    step           every later step (resilience.hang_timeout_s)
    checkpointing  a save, the wait for the asynchronous one before it included (resilience.checkpoint_timeout_s)
    (outside)      between steps: validation, logging (resilience.hang_timeout_s)

So a slow start or a long save is never taken for a hang, and a hung collective is found after hang_timeout_s
rather than NCCL's 30 minutes."""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

try:
    from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient
    from nvidia_resiliency_ext.fault_tolerance.data import FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR as SOCKET_VARIABLE
except ImportError:  # not under ft_launcher: nothing to tell
    RankMonitorClient, SOCKET_VARIABLE = None, "FT_RANK_MONITOR_IPC_SOCKET"


class HangMonitor:
    """This rank's connection to its rank monitor (ft_launcher starts one per rank)."""

    def __init__(self, client):
        self._client = client
        self._first_step_done = False
        client.start_section("setup")

    @classmethod
    def connect(cls) -> "HangMonitor | None":
        """The monitor of this rank when ft_launcher started it; None otherwise (torchrun, srun, mpirun)."""
        if SOCKET_VARIABLE not in os.environ or RankMonitorClient is None:
            return None
        client = RankMonitorClient()
        client.init_workload_monitoring()
        return cls(client)

    def step_begins(self) -> None:
        if self._first_step_done:
            self._client.start_section("step")

    def step_ended(self) -> None:
        if self._first_step_done:
            self._client.end_section("step")
        else:
            self._client.end_section("setup")
            self._first_step_done = True

    @contextlib.contextmanager
    def checkpointing(self) -> Iterator[None]:
        self._client.start_section("checkpointing")
        try:
            yield
        finally:
            self._client.end_section("checkpointing")

    def close(self) -> None:
        with contextlib.suppress(Exception):  # the monitor may be gone already (ft_launcher shutting down)
            self._client.end_all_sections()
            self._client.shutdown_workload_monitoring()
