"""Child processes that never outlive the process that started them: data preparation's tokenizer workers and the
trainer's helpers (an asynchronous save's writer, data-loader workers). Linux only (prctl); elsewhere nothing."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int | None = None) -> None:
    """In a freshly forked child: the kernel kills it (SIGKILL) when the thread that forked it ends, its process
    killed hard included (kill -9, the OOM killer). With `parent_pid`, a child whose parent died before this call
    exits at once (it would never get the signal)."""
    if not sys.platform.startswith("linux"):
        return
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)
