"""Files fedgp writes have the mode ``open()`` would give them: ``0o666`` less the umask for a new file
(``0o644`` under ``0o022``, the same as the CSVs beside them), an existing file's own mode when it is
rewritten; never the ``0o600`` of ``tempfile.mkstemp``."""

from __future__ import annotations

import hashlib
import os
import stat
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

import fedgp
from fedgp.datasets.registry import DataRegistry, fetch
from fedgp.files import open_temporary, write_atomically
from fedgp.run import Checkpointing, Progress

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX permission bits")


@contextmanager
def umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def modes(folder: Path) -> dict[str, int]:
    return {p.name: stat.S_IMODE(p.stat().st_mode) for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_saved_model_and_a_checkpoint_are_0644_under_umask_022(tmp_path):
    draws = fedgp.synthetic.gp_federation(num_clients=3, n=10, d=1, seed=0)
    with umask(0o022):
        result = fedgp.fit(
            draws.spec,
            draws.federation,
            rounds=2,
            callbacks=[Progress(False), Checkpointing(tmp_path / "run.ckpt", every=1)],
        )
        result.save(tmp_path / "model.fedgp")
        result.history.to_csv(tmp_path / "history.csv")  # an ordinary open(), for comparison
    written = modes(tmp_path)
    assert set(written) == {"run.ckpt", "model.fedgp", "history.csv"}  # no temporary file left
    assert written == dict.fromkeys(written, 0o644), {k: oct(v) for k, v in written.items()}


@pytest.mark.parametrize("mask, expected", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_the_mode_follows_the_umask(tmp_path, mask, expected):
    with umask(mask):
        write_atomically(tmp_path / "sub" / "a.bin", b"x")
        with open(tmp_path / "plain.bin", "wb") as fh:
            fh.write(b"x")
    assert modes(tmp_path) == {"a.bin": expected, "plain.bin": expected}


def test_rewriting_a_file_keeps_its_mode(tmp_path):
    path = tmp_path / "model.fedgp"
    with umask(0o022):
        write_atomically(path, b"old")
        path.chmod(0o600)  # the user restricted it
        write_atomically(path, b"new")
    assert path.read_bytes() == b"new" and stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_temporary_file_is_new_and_hidden(tmp_path):
    with umask(0o022):
        handle, path = open_temporary(tmp_path, "x.bin", ".partial")
        with handle:
            handle.write(b"abc")
    assert path.parent == tmp_path and path.name.startswith(".x.bin.") and path.name.endswith(".partial")
    assert path.read_bytes() == b"abc" and stat.S_IMODE(path.stat().st_mode) == 0o644


def test_a_downloaded_data_file_is_0644_under_umask_022(tmp_path):
    content = b"1 2 3\n"
    source = tmp_path / "served.txt"
    source.write_bytes(content)
    entry = {"url": source.as_uri(), "size": len(content), "sha256": hashlib.sha256(content).hexdigest()}
    toy = {"title": "Toy", "folder": "toydir", "files": {"toy.txt": entry}}
    registry = DataRegistry({"datasets": {"toy": toy}})
    with umask(0o022):
        path = fetch(registry.entry("toy", "toy.txt"), tmp_path / "root", progress=False)
    assert path.read_bytes() == content
    assert modes(tmp_path / "root") == {"toy.txt": 0o644}
