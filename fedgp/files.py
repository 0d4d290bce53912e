"""Durable file writes: a reader sees the old bytes or the new ones, never half of either.

Checkpoints, saved results and downloaded datasets all end the same way: bytes in a temporary file
of the destination's folder, fsync'ed, renamed over the destination, and the folder fsync'ed so the
rename itself survives a crash.

The file that lands has the mode ``open(path, "wb")`` would give it: a new file ``0o666`` less the
umask (``0o644`` under the usual ``0o022``, like the CSVs written beside it), an existing file its own
mode. (``tempfile.mkstemp`` would make every such file ``0o600``.) The umask is applied by the
kernel when the temporary file is created, never read with ``os.umask``, which would change it for
every thread of the process for a moment.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path
from typing import BinaryIO

__all__ = ["write_atomically", "open_temporary", "fsync_folder"]

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0) | getattr(os, "O_NOFOLLOW", 0)


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


def open_temporary(folder: Path, name: str, suffix: str = ".tmp") -> tuple[BinaryIO, Path]:
    """A new, empty file ``.<name>.<random><suffix>`` in ``folder``, open for binary writing, and its
    path: created exclusively (never an existing file or a link) with mode ``0o666`` less the umask,
    as ``open()`` creates files, so that renamed over ``name`` it has the mode ``name`` would have."""
    for _ in range(100):
        path = Path(folder) / f".{name}.{secrets.token_hex(6)}{suffix}"
        try:
            fd = os.open(path, _CREATE, 0o666)
        except FileExistsError:
            continue
        return os.fdopen(fd, "wb"), path
    raise FileExistsError(f"no free temporary name for {name!r} in {folder} after 100 tries")


def write_atomically(path: Path, data: bytes) -> None:
    """Write to a temporary file in the same folder, fsync it, rename it over ``path``, fsync the
    folder: after a crash ``path`` holds the old bytes or the new ones. ``path`` ends with the mode
    ``open(path, "wb")`` would leave: its own if it exists, else ``0o666`` less the umask."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = open_temporary(path.parent, path.name)
    try:
        with handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        _keep_mode(tmp, path)
        os.replace(tmp, path)
        tmp = None
        fsync_folder(path.parent)
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


def _keep_mode(tmp: Path, path: Path) -> None:
    """Give ``tmp`` the permission bits of ``path`` when ``path`` exists (before renaming ``tmp`` over
    it), as rewriting ``path`` in place would keep them."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return
    os.chmod(tmp, mode)
