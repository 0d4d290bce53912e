"""Damaged data roots and hostile servers: each case fails with its own clear message, and no
download leaves a file behind (tests with local servers on 127.0.0.1)."""

from __future__ import annotations

import hashlib
import http.server
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from fedgp.cli import main as cli_main
from fedgp.datasets import registry as registry_module
from fedgp.datasets.registry import DataRegistry, fetch, locate
from fedgp.errors import DataFileError
from fedgp.files import open_temporary

CONTENT = b"1 2 3\n4 5 6\n" * 50


def toy_registry() -> DataRegistry:
    entry = {
        "url": "http://127.0.0.1:9/unused/toy.txt",
        "size": len(CONTENT),
        "sha256": hashlib.sha256(CONTENT).hexdigest(),
    }
    return DataRegistry(
        {"datasets": {"toy": {"title": "Toy", "folder": "toydir", "files": {"toy.txt": entry}}}}
    )


def _locate(root, download=False, **kw):
    return locate(
        "toy", "toy.txt", root=root, download=download, registry=toy_registry(), progress=False, **kw
    )


@pytest.mark.parametrize("download", [False, True])
def test_each_damaged_place_has_its_own_message(tmp_path, download):
    root = tmp_path / "root"
    (root / "toydir" / "toy.txt").mkdir(parents=True)  # a directory where the file should be
    with pytest.raises(
        DataFileError,
        match=r"toy.txt \(data root from the root= argument\) is a directory where the file should be\. "
        r"Remove or rename",
    ):
        _locate(root, download)
    os.rmdir(root / "toydir" / "toy.txt")
    os.symlink(root / "toydir" / "toy.txt", root / "toydir" / "toy.txt")  # a loop
    with pytest.raises(DataFileError, match=r"is a symlink loop") as info:
        _locate(root, download)
    assert info.value.reason == "place"
    os.unlink(root / "toydir" / "toy.txt")
    os.symlink(tmp_path / "nowhere", root / "toydir" / "toy.txt")
    with pytest.raises(DataFileError, match=r"is a symlink to .*nowhere, which does not exist"):
        _locate(root, download)
    flat = tmp_path / "flat"
    flat.write_text("not a folder")
    with pytest.raises(
        DataFileError, match=r"the data root .*flat \(data root from the root= argument\) is a file"
    ):
        _locate(flat, download)
    other = tmp_path / "other"
    other.mkdir()
    (other / "toydir").write_text("not a folder")
    with pytest.raises(DataFileError, match=r"the Toy folder .*toydir .* is a file, not a folder"):
        _locate(other, download)


def test_a_permission_error_is_named_not_raised_raw(tmp_path, monkeypatch):
    (tmp_path / "toydir").mkdir()
    (tmp_path / "toydir" / "toy.txt").write_bytes(CONTENT)
    assert _locate(tmp_path).read_bytes() == CONTENT

    def denied(*args):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(registry_module, "_verify_contents", denied)  # root ignores chmod; simulate it
    with pytest.raises(DataFileError, match=r"cannot be read: permission denied .* read access") as info:
        _locate(tmp_path)
    assert info.value.reason == "permission"
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        monkeypatch.undo()
        os.chmod(tmp_path / "toydir", 0)
        try:
            with pytest.raises(DataFileError, match="permission denied"):
                _locate(tmp_path)
        finally:
            os.chmod(tmp_path / "toydir", 0o755)


class _Server:
    """A server on 127.0.0.1 that answers every GET with ``behaviour``."""

    def __init__(self, behaviour):
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                behaviour(self)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/toydir/toy.txt"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def _drop_halfway(handler):
    handler.send_response(200)
    handler.send_header("Content-Length", str(len(CONTENT)))
    handler.end_headers()
    handler.wfile.write(CONTENT[: len(CONTENT) // 2])
    handler.wfile.flush()
    handler.close_connection = True
    handler.connection.shutdown(socket.SHUT_RDWR)


def _wrong_bytes(handler):
    body = CONTENT.replace(b"6", b"7")
    handler.send_response(200)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


@pytest.mark.parametrize(
    "behaviour, phrase",
    [
        (_drop_halfway, r"the connection closed after \d+ bytes|truncated"),
        (_wrong_bytes, r"failed verification: .*altered or corrupted"),
    ],
    ids=["drops-halfway", "wrong-bytes"],
)
def test_a_bad_server_leaves_nothing_behind(tmp_path, behaviour, phrase):
    server = _Server(behaviour)
    try:
        with pytest.raises(DataFileError, match=phrase) as info:
            fetch(toy_registry().entry("toy", "toy.txt"), tmp_path, url=server.url, progress=False, timeout=5)
    finally:
        server.close()
    assert info.value.reason == "download"
    assert list((tmp_path / "toydir").iterdir()) == []


@pytest.fixture
def silent_url():
    """A socket that accepts connections (the kernel's backlog) and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


def test_a_server_that_never_answers_costs_the_timeout_given_to_load(tmp_path, silent_url, monkeypatch):
    monkeypatch.setenv("FEDGP_DATA_MIRROR", silent_url)
    start = time.monotonic()
    with pytest.raises(DataFileError, match=r"no answer within timeout=0.3 s \(pass a larger timeout=\)"):
        _locate(tmp_path, download=True, timeout=0.3)
    assert time.monotonic() - start < 30  # not the 60 s default
    assert list((tmp_path / "toydir").iterdir()) == []


def test_the_cli_passes_timeout_through(tmp_path, silent_url, monkeypatch, capsys):
    monkeypatch.setenv("FEDGP_DATA_MIRROR", silent_url)
    code = cli_main(
        ["download", "cmapss", "RUL_FD001.txt", "--root", str(tmp_path), "--timeout", "0.3", "--no-progress"]
    )
    assert code == 1
    assert "no answer within timeout=0.3 s" in capsys.readouterr().err


def test_partial_files_of_killed_downloads_are_removed_by_the_next_one(tmp_path, http_root):
    served, base = http_root
    (served / "toydir").mkdir()
    (served / "toydir" / "toy.txt").write_bytes(CONTENT)
    folder = tmp_path / "toydir"
    folder.mkdir()
    # An old-style name idle for an hour; a fresh one of a killed process on this host; a fresh one
    # of a live process (this one): only the last may be a download still running.
    stale = folder / ".toy.txt.0123456789ab.partial"
    _, killed = open_temporary(folder, "toy.txt", ".partial")
    dead_pid = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True)
    dead_name = killed.name.replace(f"-{os.getpid()}.", f"-{int(dead_pid.stdout)}.")
    killed = killed.rename(killed.with_name(dead_name))
    handle, live = open_temporary(folder, "toy.txt", ".partial")
    handle.close()
    other = folder / ".toy.txt.bak.0123456789ab.partial"  # another file's partial download
    for path in (stale, other):
        path.write_bytes(b"half")
        os.utime(path, (time.time() - 3600, time.time() - 3600))
    path = fetch(
        toy_registry().entry("toy", "toy.txt"), tmp_path, url=f"{base}/toydir/toy.txt", progress=False
    )
    assert path.read_bytes() == CONTENT
    assert not stale.exists() and not killed.exists()
    assert live.exists() and other.exists()  # a live download, and another file's


def test_a_download_is_fsynced_before_the_rename(tmp_path, http_root, monkeypatch):
    served, base = http_root
    (served / "toydir").mkdir()
    (served / "toydir" / "toy.txt").write_bytes(CONTENT)
    calls = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (calls.append("replace"), real_replace(a, b))[1])
    fetch(toy_registry().entry("toy", "toy.txt"), tmp_path, url=f"{base}/toydir/toy.txt", progress=False)
    assert calls == ["fsync", "replace", "fsync"]  # the file, the rename, the folder
