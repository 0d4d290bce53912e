"""Durable file writes: a reader sees the old bytes or the new ones, never half of either.

Checkpoints, saved results and downloaded datasets all end the same way: bytes in a temporary file
of the destination's folder, fsync'ed, renamed over the destination, and the folder fsync'ed so the
rename itself survives a crash.

A write killed between creating its temporary file and the rename leaves that file behind. The
next write to the same destination removes the stale ones (:func:`remove_stale_temporaries`): only
fedgp's own temporary names for that destination (``.<name>.<host>-<pid>.<random><suffix>``, or the
``.<name>.<random><suffix>`` of earlier versions), and only those whose writer is known dead (written
on this host, by a process id that no longer exists) or that have not been written to for
:data:`STALE_AFTER` seconds (another host, a name without a process id). A live writer on this host
is never touched, so two processes writing the same destination at once keep their own files; a
process id reused by a new process only delays the removal until the age rule applies. (Windows:
the age rule only.)

The file that lands has the mode ``open(path, "wb")`` would give it: a new file ``0o666`` less the
umask (``0o644`` under the usual ``0o022``, like the CSVs written beside it), an existing file its own
mode. (``tempfile.mkstemp`` would make every such file ``0o600``.) The umask is applied by the
kernel when the temporary file is created, never read with ``os.umask``, which would change it for
every thread of the process for a moment.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import socket
import stat
import time
from pathlib import Path
from typing import BinaryIO

__all__ = ["write_atomically", "open_temporary", "fsync_folder", "remove_stale_temporaries", "STALE_AFTER"]

#: Seconds after its last write when a temporary file of a writer not known to be alive is stale.
STALE_AFTER = 600.0
_HOST = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]

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


def _writer_is_dead(host: str | None, pid: str | None) -> bool:
    if host != _HOST or pid is None or os.name == "nt":  # os.kill(pid, 0) would end a Windows process
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except (OSError, OverflowError, ValueError):  # alive but another user's (EPERM), or not a pid
        return False
    return False


def remove_stale_temporaries(
    folder: Path, name: str, suffix: str = ".tmp", max_age: float = STALE_AFTER
) -> list[Path]:
    """Remove the temporary files :func:`open_temporary` made for ``name`` in ``folder`` whose writer
    is dead (this host, a process id that no longer exists) or that were last written more than
    ``max_age`` seconds ago; returns the paths removed. Other files, links and folders are left alone."""
    pattern = re.compile(
        rf"\.{re.escape(name)}\.(?:(?P<host>[0-9a-f]{{8}})-(?P<pid>[0-9]{{1,10}})\.)?[0-9a-f]{{12}}"
        rf"{re.escape(suffix)}"
    )
    removed, cutoff = [], time.time() - max_age
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        match = pattern.fullmatch(entry.name)
        try:
            if match is None or not entry.is_file(follow_symlinks=False):
                continue
            if (
                _writer_is_dead(match["host"], match["pid"])
                or entry.stat(follow_symlinks=False).st_mtime < cutoff
            ):
                os.unlink(entry.path)
                removed.append(Path(entry.path))
        except OSError:  # removed meanwhile, or not ours to remove
            continue
    return removed


def open_temporary(folder: Path, name: str, suffix: str = ".tmp") -> tuple[BinaryIO, Path]:
    """A new, empty file ``.<name>.<host>-<pid>.<random><suffix>`` in ``folder``, open for binary
    writing, and its path: created exclusively (never an existing file or a link) with mode ``0o666``
    less the umask, as ``open()`` creates files, so that renamed over ``name`` it has the mode
    ``name`` would have. The host and process id let :func:`remove_stale_temporaries` tell a killed
    writer's file from a live one's."""
    for _ in range(100):
        path = Path(folder) / f".{name}.{_HOST}-{os.getpid()}.{secrets.token_hex(6)}{suffix}"
        try:
            fd = os.open(path, _CREATE, 0o666)
        except FileExistsError:
            continue
        return os.fdopen(fd, "wb"), path
    raise FileExistsError(f"no free temporary name for {name!r} in {folder} after 100 tries")


def write_atomically(path: Path, data: bytes) -> None:
    """Write to a temporary file in the same folder, fsync it, rename it over ``path``, fsync the
    folder: after a crash ``path`` holds the old bytes or the new ones. ``path`` ends with the mode
    ``open(path, "wb")`` would leave: its own if it exists, else ``0o666`` less the umask. Temporary
    files of killed earlier writes to ``path`` are removed first (:func:`remove_stale_temporaries`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path.parent, path.name)
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
