"""The checksum registry: verification, clear errors, and downloads from a local HTTP server."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from fedgp.datasets.registry import (
    DataRegistry,
    data_root,
    fetch,
    git_blob_sha1_of,
    locate,
    verify_file,
)
from fedgp.errors import DataFileError, DataFileMissing
from tests.datasets.real import require_real_data

CONTENT = b"1 2 3\n4 5 6\n"


def make_registry(**entry) -> DataRegistry:
    files = {"toy.txt": {"url": "http://127.0.0.1:9/unused/toy.txt", **entry}}
    return DataRegistry({"datasets": {"toy": {"title": "Toy", "folder": "toydir", "files": files}}})


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_data_root_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("FEDGP_DATA", str(tmp_path / "env"))
    assert data_root(tmp_path / "arg")[0] == tmp_path / "arg"
    assert data_root()[0] == tmp_path / "env" and "FEDGP_DATA" in data_root()[1]
    monkeypatch.delenv("FEDGP_DATA")
    root, where = data_root()
    assert root == Path(__file__).resolve().parents[2] / "datasets" and "default" in where


def test_the_repository_registry_lists_every_shared_file_with_a_checksum():
    registry = DataRegistry.load()
    names = set(registry.files("cmapss"))
    for subset in ("FD001", "FD002", "FD003", "FD004"):
        assert {f"train_{subset}.txt", f"test_{subset}.txt", f"RUL_{subset}.txt"} <= names
    for dataset in registry.datasets():
        for name in registry.files(dataset):
            e = registry.entry(dataset, name)
            assert e.url and (e.sha256 or e.git_blob_sha1)
    assert registry.entry("cmapss", "train_FD001.txt").size == 3515356
    assert (
        registry.entry("sarcos", "sarcos_inv.mat").git_blob_sha1 == "687b7aaa5faf5a9c67fc6655fd59fd8b4539ad55"
    )


def test_a_registry_entry_without_any_checksum_is_refused():
    with pytest.raises(ValueError, match="neither sha256 nor git_blob_sha1"):
        make_registry(size=3)


def test_missing_file_error_names_file_place_and_remedy(tmp_path):
    registry = make_registry(size=len(CONTENT), sha256=sha(CONTENT))
    with pytest.raises(DataFileMissing) as info:
        locate("toy", "toy.txt", root=tmp_path, registry=registry)
    message = str(info.value)
    assert "Toy file 'toy.txt' not found" in message
    assert str(tmp_path / "toydir" / "toy.txt") in message and "root= argument" in message
    assert "download=True" in message and "FEDGP_DATA" in message and sha(CONTENT) in message
    assert isinstance(info.value, FileNotFoundError) and isinstance(info.value, ValueError)
    assert info.value.reason == "missing"


@pytest.mark.parametrize(
    "content, reason, phrase",
    [
        (CONTENT[:-3], "size", "not the registered file (a truncated copy or another file)"),
        (b"9 9\n", "size", "not the registered file (a truncated copy or another file)"),  # another, shorter
        (CONTENT + b"7", "size", "not the registered file (altered or another file)"),
        (b"1 2 3\n4 5 7\n", "checksum", "altered"),
    ],
)
def test_truncated_or_altered_files_are_rejected(tmp_path, content, reason, phrase):
    registry = make_registry(size=len(CONTENT), sha256=sha(CONTENT))
    (tmp_path / "toydir").mkdir()
    (tmp_path / "toydir" / "toy.txt").write_bytes(content)
    with pytest.raises(DataFileError) as info:
        locate("toy", "toy.txt", root=tmp_path, registry=registry)
    assert info.value.reason == reason and phrase in str(info.value)
    assert str(tmp_path / "toydir" / "toy.txt") in str(info.value) and "download=True" in str(info.value)


def test_git_blob_id_matches_git_hash_object(tmp_path):
    path = tmp_path / "blob.bin"
    path.write_bytes(CONTENT)
    try:
        expected = subprocess.run(
            ["git", "hash-object", str(path)], capture_output=True, text=True, check=True
        )
    except (FileNotFoundError, subprocess.CalledProcessError):
        expected = None
    blob = git_blob_sha1_of(path)
    header = hashlib.sha1(b"blob %d\0" % len(CONTENT) + CONTENT).hexdigest()
    assert blob == header
    if expected is not None:
        assert blob == expected.stdout.strip()
    registry = make_registry(git_blob_sha1=blob)
    verify_file(path, registry.entry("toy", "toy.txt"))
    with pytest.raises(DataFileError, match="git blob sha1"):
        verify_file(path, make_registry(git_blob_sha1="0" * 40).entry("toy", "toy.txt"))


def test_download_from_local_server_verifies_then_places_the_file(tmp_path, http_root, monkeypatch):
    served, base = http_root
    (served / "toydir").mkdir()
    (served / "toydir" / "toy.txt").write_bytes(CONTENT)
    registry = make_registry(size=len(CONTENT), sha256=sha(CONTENT))
    monkeypatch.setenv("FEDGP_DATA_MIRROR", base)
    path = locate("toy", "toy.txt", root=tmp_path / "root", download=True, registry=registry)
    assert path == tmp_path / "root" / "toydir" / "toy.txt" and path.read_bytes() == CONTENT
    # an explicit URL wins over the mirror
    path.unlink()
    fetch(registry.entry("toy", "toy.txt"), tmp_path / "root", url=f"{base}/toydir/toy.txt", progress=False)
    assert path.read_bytes() == CONTENT


def test_a_bad_download_leaves_nothing_behind(tmp_path, http_root, monkeypatch):
    served, base = http_root
    (served / "toydir").mkdir()
    (served / "toydir" / "toy.txt").write_bytes(b"1 2 3\n4 5 7\n")  # same size, wrong bytes
    registry = make_registry(size=len(CONTENT), sha256=sha(CONTENT))
    monkeypatch.setenv("FEDGP_DATA_MIRROR", base)
    with pytest.raises(DataFileError) as info:
        locate("toy", "toy.txt", root=tmp_path, download=True, registry=registry)
    assert info.value.reason == "download" and "failed verification" in str(info.value)
    assert not any((tmp_path / "toydir").iterdir())
    with pytest.raises(DataFileError, match="could not download") as info:
        fetch(registry.entry("toy", "toy.txt"), tmp_path, url=f"{base}/toydir/absent.txt", progress=False)
    assert not any((tmp_path / "toydir").iterdir())


def test_every_shared_real_file_matches_the_registry():
    """Sizes and sha256 of all 13 C-MAPSS files and the SARCOS test file (the training file is absent)."""
    names = [f"cmapss/{n}" for n in DataRegistry.load().files("cmapss")] + ["sarcos/sarcos_inv_test.mat"]
    root = require_real_data(*names)
    registry = DataRegistry.load()
    for name in names:
        folder, file = name.split("/")
        verify_file(root / name, registry.entry("cmapss" if folder == "cmapss" else "sarcos", file))
    assert len(names) == 14
