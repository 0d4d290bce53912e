"""Where real data files live, what they must contain, and how to fetch them.

``fedgp/datasets/registry.json`` (installed with the package) lists every file a loader reads: its folder,
canonical URL, size and checksum (sha256, or the git blob id where only that is published). Loaders
never parse a file before it has been verified against that entry, so a truncated download or an
edited copy is an error that says which file, where it was looked for and how to get a good one,
rather than a silently different table.

The data root is resolved, in order, from the ``root=`` argument, the ``FEDGP_DATA`` environment
variable, and the default: the repository's ``datasets/`` folder when fedgp runs from a checkout
(``pip install -e .``), else ``fedgp/datasets`` in the user's cache folder (``$XDG_CACHE_HOME``, or
``~/.cache``). Files sit in ``<root>/<folder>/<name>``.
``download=True`` fetches a missing file from its URL (or from ``FEDGP_DATA_MIRROR``, a base URL
with the same ``<folder>/<name>`` layout) into the data root, verifies it, and only then moves it
into place.
"""

from __future__ import annotations

import errno
import hashlib
import http.client
import json
import os
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from fedgp.errors import DataFileError, DataFileMissing, InputError, UnknownNameError
from fedgp.files import fsync_folder, open_temporary, remove_stale_temporaries

__all__ = [
    "FileEntry",
    "DataRegistry",
    "REGISTRY_PATH",
    "default_data_root",
    "data_root",
    "verify_file",
    "fetch",
    "locate",
    "check_place",
    "sha256_of",
    "git_blob_sha1_of",
]

#: The repository's ``datasets/`` folder: the default data root when fedgp runs from a checkout.
DATASETS_DIR = Path(__file__).resolve().parents[2] / "datasets"
#: The registry of the real datasets (package data): file names, URLs, sizes and SHA-256 checksums.
REGISTRY_PATH = Path(__file__).resolve().parent / "registry.json"
_CHUNK = 1 << 20
_PARTIAL = ".partial"


@dataclass(frozen=True)
class FileEntry:
    """One registry entry: what a file must be, and where it comes from."""

    dataset: str
    folder: str
    name: str
    url: str | None
    size: int | None
    sha256: str | None
    git_blob_sha1: str | None = None
    info: Mapping[str, Any] | None = None
    title: str = ""

    @property
    def label(self) -> str:
        """How messages name the file: its dataset's title and its name."""
        return f"{self.title or self.dataset} file {self.name!r}"

    @property
    def relative(self) -> str:
        """The file's path under the data root."""
        return f"{self.folder}/{self.name}"

    def describe(self) -> str:
        """The file's expected size and checksums, for error messages."""
        parts = []
        if self.size is not None:
            parts.append(f"{self.size} bytes")
        if self.sha256:
            parts.append(f"sha256 {self.sha256}")
        if self.git_blob_sha1:
            parts.append(f"git blob {self.git_blob_sha1}")
        return ", ".join(parts) or "no checksum recorded"


class DataRegistry:
    """The parsed ``registry.json``: ``entry(dataset, name)`` gives a :class:`FileEntry`."""

    def __init__(self, data: Mapping[str, Any], path: Path | str | None = None):
        if not isinstance(data, Mapping) or "datasets" not in data:
            raise InputError(f"registry {path or '<dict>'}: expected an object with a 'datasets' key")
        self.data = data
        self.path = None if path is None else Path(path)
        for dataset, spec in data["datasets"].items():
            for name, entry in spec.get("files", {}).items():
                if not entry.get("sha256") and not entry.get("git_blob_sha1"):
                    raise InputError(
                        f"registry {self.path or '<dict>'}: {dataset}/{name} has neither sha256 nor "
                        "git_blob_sha1; every file must be verifiable"
                    )

    @classmethod
    def load(cls, path: Path | str | None = None) -> DataRegistry:
        """Read a registry file (default: the repository's ``datasets/registry.json``)."""
        path = REGISTRY_PATH if path is None else Path(path)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise DataFileMissing(
                f"dataset registry not found at {path}. fedgp reads it from the repository's "
                "datasets/ folder; use fedgp from a checkout (pip install -e .) or pass registry=",
                path=path,
                reason="missing",
            ) from None
        except json.JSONDecodeError as err:
            raise DataFileError(f"dataset registry {path} is not valid JSON: {err}", path=path) from err
        return cls(data, path)

    def datasets(self) -> list[str]:
        """The datasets the registry knows."""
        return list(self.data["datasets"])

    def files(self, dataset: str) -> list[str]:
        """The file names of one dataset."""
        return list(self._dataset(dataset).get("files", {}))

    def _dataset(self, dataset: str) -> Mapping[str, Any]:
        try:
            return self.data["datasets"][dataset]
        except KeyError:
            raise UnknownNameError(
                f"dataset {dataset!r} is not in the registry {self.path}; known: {', '.join(self.datasets())}"
            ) from None

    def entry(self, dataset: str, name: str) -> FileEntry:
        """The :class:`FileEntry` of one file; an unknown file is a ``KeyError`` naming the registry."""
        spec = self._dataset(dataset)
        try:
            raw = spec["files"][name]
        except KeyError:
            raise UnknownNameError(
                f"file {name!r} of dataset {dataset!r} is not in the registry {self.path}; "
                f"known: {', '.join(spec.get('files', {}))}"
            ) from None
        known = {"url", "size", "sha256", "git_blob_sha1"}
        return FileEntry(
            dataset=dataset,
            folder=spec.get("folder", dataset),
            name=name,
            url=raw.get("url"),
            size=raw.get("size"),
            sha256=raw.get("sha256"),
            git_blob_sha1=raw.get("git_blob_sha1"),
            info={k: v for k, v in raw.items() if k not in known},
            title=spec.get("title", dataset),
        )


@lru_cache(maxsize=1)
def _default_registry() -> DataRegistry:
    return DataRegistry.load()


def default_registry() -> DataRegistry:
    """The repository's ``datasets/registry.json`` (parsed once)."""
    return _default_registry()


def default_data_root() -> Path:
    """The data root when neither ``root=`` nor ``FEDGP_DATA`` is given: ``<repository>/datasets``
    from a checkout (its ``README.md`` marks it), else ``<cache>/fedgp/datasets`` for an installed
    package, whose ``site-packages`` has no ``datasets/`` of its own."""
    if (DATASETS_DIR / "README.md").is_file():
        return DATASETS_DIR
    cache = os.environ.get("XDG_CACHE_HOME", "").strip() or Path.home() / ".cache"
    return Path(cache).expanduser() / "fedgp" / "datasets"


def data_root(root: str | os.PathLike | None = None) -> tuple[Path, str]:
    """The data root and a phrase saying which setting chose it (for error messages)."""
    if root is not None:
        return Path(root).expanduser(), "the root= argument"
    env = os.environ.get("FEDGP_DATA", "").strip()
    if env:
        return Path(env).expanduser(), f"FEDGP_DATA={env}"
    return default_data_root(), "the default data root (set FEDGP_DATA or root=)"


def sha256_of(path: Path) -> str:
    """The hex SHA-256 of a file's bytes, read in chunks (the registry's checksums are these)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def git_blob_sha1_of(path: Path) -> str:
    """``git hash-object``: sha1 of ``b"blob <size>\\0" + content``."""
    digest = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _how_to_get(entry: FileEntry, folder: Path) -> str:
    source = f"from {entry.url}" if entry.url else "from the publisher"
    return (
        f"To get it: pass download=True to fetch it {source} into {folder}/ (verified before use), "
        f"or copy the publisher's file there, or point FEDGP_DATA (or root=) at a folder holding "
        f"{entry.relative}. Expected: {entry.describe()}."
    )


def check_place(path: Path, entry: FileEntry, where: str = "", root: Path | None = None) -> None:
    """Raise :class:`DataFileError` with its own message when the place a file should be is
    damaged: the data root or the dataset folder is a file, the file is a directory, a symlink
    loop or a dangling symlink, or something on the way cannot be read (permissions). A plainly
    absent file passes (``verify_file`` or a download deals with it)."""
    label = entry.label
    origin = f" (data root from {where})" if where else ""
    for folder, what in [(root, "data root"), (path.parent, f"{entry.title or entry.dataset} folder")]:
        if folder is not None and folder.exists() and not folder.is_dir():
            raise DataFileError(
                f"the {what} {folder}{origin} is a file, not a folder, so {label} cannot be looked up in it. "
                "Move that file away, or point root= (or FEDGP_DATA) at a folder.",
                path=path,
                reason="place",
            )
    try:
        path.stat()
    except FileNotFoundError:
        if path.is_symlink():
            raise DataFileError(
                f"{label} at {path}{origin} is a symlink to {os.readlink(path)}, which does not exist. "
                "Fix or remove the link.",
                path=path,
                reason="place",
            ) from None
        return
    except PermissionError as err:
        raise DataFileError(
            f"{label} at {path}{origin} cannot be reached: permission denied ({err.strerror}). Give this "
            "user read access to it and its folders, or point root= (or FEDGP_DATA) at a readable copy.",
            path=path,
            reason="permission",
        ) from None
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise DataFileError(
                f"{label} at {path}{origin} is a symlink loop (it points back at itself). Remove the link "
                "and put the file there, or point root= (or FEDGP_DATA) elsewhere.",
                path=path,
                reason="place",
            ) from None
        raise DataFileError(
            f"{label} at {path}{origin} cannot be examined: {err}", path=path, reason="place"
        ) from err
    if path.is_dir():
        raise DataFileError(
            f"{label}: {path}{origin} is a directory where the file should be. Remove or rename that "
            f"directory and {_how_to_get(entry, path.parent)[len('To get it: ') :]}",
            path=path,
            reason="place",
        )


def verify_file(path: Path, entry: FileEntry, where: str = "") -> None:
    """Raise :class:`DataFileError` unless ``path`` has the registry's size and checksum."""
    path = Path(path)
    label = entry.label
    origin = f" (data root from {where})" if where else ""
    check_place(path, entry, where)
    if not path.is_file():
        raise DataFileMissing(
            f"{label} not found: looked for {path}{origin}. {_how_to_get(entry, path.parent)}",
            path=path,
            reason="missing",
        )
    try:
        _verify_contents(path, entry, label, origin)
    except PermissionError as err:
        raise DataFileError(
            f"{label} at {path}{origin} cannot be read: permission denied ({err.strerror}). Give this user "
            "read access (chmod), or point root= (or FEDGP_DATA) at a readable copy.",
            path=path,
            reason="permission",
        ) from None


def _verify_contents(path: Path, entry: FileEntry, label: str, origin: str) -> None:
    size = path.stat().st_size
    if entry.size is not None and size != entry.size:
        # The registry knows only the whole file's size and hash, so a short file may be a truncated
        # copy or another file in its place: say both, not a guess.
        kind = "a truncated copy or another file" if size < entry.size else "altered or another file"
        raise DataFileError(
            f"{label} at {path}{origin} is not the registered file ({kind}): {size} bytes, expected "
            f"{entry.size}. "
            f"Delete it and {_how_to_get(entry, path.parent)[len('To get it: ') :]}",
            path=path,
            reason="size",
        )
    if entry.sha256:
        actual, expected, kind = sha256_of(path), entry.sha256, "sha256"
    else:
        actual, expected, kind = git_blob_sha1_of(path), entry.git_blob_sha1, "git blob sha1"
    if actual != expected:
        raise DataFileError(
            f"{label} at {path}{origin} is altered or corrupted: {kind} {actual}, expected {expected}. "
            f"Delete it and {_how_to_get(entry, path.parent)[len('To get it: ') :]}",
            path=path,
            reason="checksum",
        )


def _source_url(entry: FileEntry, url: str | None, mirror: str | None) -> str:
    if url:
        return url
    mirror = mirror if mirror is not None else os.environ.get("FEDGP_DATA_MIRROR", "").strip() or None
    if mirror:
        return f"{mirror.rstrip('/')}/{entry.folder}/{entry.name}"
    if not entry.url:
        raise DataFileMissing(f"{entry.label} has no download URL in the registry", reason="missing")
    return entry.url


def _remove_stale_partials(folder: Path, name: str, timeout: float) -> None:
    """Remove partial downloads of ``name`` left by killed processes (:func:`fedgp.files.
    remove_stale_temporaries`): at once when their process is dead (this host), else once idle for
    twice ``timeout`` (a live download writes at least every ``timeout`` seconds, or times out). A
    download running in another live process keeps its file; no lock is needed."""
    remove_stale_temporaries(folder, name, _PARTIAL, 2 * max(timeout, 1.0))


def fetch(
    entry: FileEntry,
    root: str | os.PathLike | None = None,
    *,
    url: str | None = None,
    mirror: str | None = None,
    timeout: float = 60.0,
    progress: bool | None = None,
) -> Path:
    """Download ``entry`` into ``<root>/<folder>/<name>`` and verify it; return the path.

    The bytes go to a temporary file in the destination folder (``.<name>.<random>.partial``),
    are fsync'ed and checked against the registry, and only then renamed into place; the temporary
    file is removed on any failure, so an interrupted or wrong download never leaves a file that
    looks valid (partial files of killed processes are removed by the next download). ``timeout``:
    seconds to wait for the connection and for each read. ``url`` overrides the source; ``mirror``
    (or ``FEDGP_DATA_MIRROR``) is a base URL with the same ``<folder>/<name>`` layout as the data root.
    """
    base, where = data_root(root)
    dest = base / entry.folder / entry.name
    check_place(dest, entry, where, base)
    source = _source_url(entry, url, mirror)
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_partials(dest.parent, entry.name, timeout)
        handle, tmp = open_temporary(dest.parent, entry.name, _PARTIAL)  # 0o666 less the umask, as open()
    except OSError as err:
        raise DataFileError(
            f"cannot write {entry.label} into {dest.parent} (data root from {where}): "
            f"{err}. Pass root= (or set FEDGP_DATA to) a writable folder.",
            path=dest,
            reason="download",
        ) from err
    try:
        with handle, urllib.request.urlopen(source, timeout=timeout) as response:
            _copy_with_progress(response, handle, entry, progress)
        try:
            verify_file(tmp, entry)
        except DataFileError as err:
            raise DataFileError(
                f"download of {entry.label} from {source} failed verification: "
                f"{err}. Nothing was written to {dest}.",
                path=dest,
                reason="download",
            ) from err
        os.replace(tmp, dest)
        fsync_folder(dest.parent)
    except (urllib.error.URLError, OSError, http.client.HTTPException) as err:
        timed_out = isinstance(err, TimeoutError) or isinstance(getattr(err, "reason", None), TimeoutError)
        why = f"no answer within timeout={timeout:g} s (pass a larger timeout=)" if timed_out else str(err)
        if isinstance(err, http.client.IncompleteRead):
            why = f"the connection closed after {len(err.partial)} bytes of the file ({err})"
        raise DataFileError(
            f"could not download {entry.label} from {source} into {dest}: {why}. "
            f"Nothing was written to {dest}. {_how_to_get(entry, dest.parent)}",
            path=dest,
            reason="download",
        ) from err
    finally:
        if tmp.exists():
            tmp.unlink()
    return dest


def _copy_with_progress(response, handle, entry: FileEntry, progress: bool | None) -> None:
    """Stream the response into ``handle`` (fsync'ed at the end) under a byte progress bar."""
    from tqdm import tqdm

    total = response.headers.get("Content-Length")
    bar = tqdm(
        total=int(total) if total else entry.size,
        unit="B",
        unit_scale=True,
        desc=entry.name,
        disable=None if progress is None else not progress,
        leave=False,
    )
    with bar:
        for chunk in iter(lambda: response.read(_CHUNK), b""):
            handle.write(chunk)
            bar.update(len(chunk))
    handle.flush()
    os.fsync(handle.fileno())


def locate(
    dataset: str,
    name: str,
    root: str | os.PathLike | None = None,
    download: bool = False,
    registry: DataRegistry | None = None,
    progress: bool | None = None,
    timeout: float = 60.0,
) -> Path:
    """The verified path of ``<root>/<folder>/<name>``; fetched first if missing and ``download``
    (``timeout``: seconds to wait for the server). A damaged place (see :func:`check_place`) is an
    error either way: downloading over it would hide the problem."""
    registry = default_registry() if registry is None else registry
    entry = registry.entry(dataset, name)
    base, where = data_root(root)
    path = base / entry.folder / entry.name
    check_place(path, entry, where, base)
    if download and not path.exists():
        fetch(entry, root, progress=progress, timeout=timeout)
    verify_file(path, entry, where)
    return path
