"""Files that appear whole or not at all: written under a temporary name in the same directory, synced to disk, then
renamed over the final name. A reader (a job starting, a resumed run, a second launcher) sees the old file or the
new one, never half of one, also after a crash or a kill. The temporary name is unique per writer (mkstemp), so
two writers never share one, and a failed write leaves nothing behind."""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator


@contextmanager
def atomic_output(path: str | os.PathLike, binary: bool = False, mode: int = 0o644) -> Iterator[IO]:
    """An open file whose contents become `path` when the block ends without an exception."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb" if binary else "w", encoding=None if binary else "utf-8") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)  # mkstemp makes it 0600
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write(path: str | os.PathLike, data: str | bytes, mode: int = 0o644) -> None:
    with atomic_output(path, binary=isinstance(data, bytes), mode=mode) as f:
        f.write(data)
