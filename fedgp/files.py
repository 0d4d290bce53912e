"""Durable file writes: a reader sees the old bytes or the new ones, never half of either.

Checkpoints, saved results and downloaded datasets all end the same way: bytes in a temporary file
of the destination's folder, fsync'ed, renamed over the destination, and the folder fsync'ed so the
rename itself survives a crash.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["write_atomically", "fsync_folder"]


def fsync_folder(folder: Path) -> None:
    """Make a rename durable (POSIX); a no-op where folders cannot be opened (Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomically(path: Path, data: bytes) -> None:
    """Write to a temporary file in the same folder, fsync it, rename it over ``path``, fsync the
    folder: after a crash ``path`` holds the old bytes or the new ones."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        tmp = None
        fsync_folder(path.parent)
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
