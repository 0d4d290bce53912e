"""The one container every fedgp byte format uses: safetensors, with a JSON header inside it.

Messages (:mod:`fedgp.messages.records`), checkpoints (:mod:`fedgp.run.checkpoint`) and saved
models (:mod:`fedgp.run.saved`) are all the same thing on disk or on the wire: a safetensors
payload holding named tensors and, as one more entry, the JSON header that says what the payload
is (``format``, ``version``) and holds everything that is not a tensor. The whole payload —
header entry included — is parsed by the safetensors library: a flat table of dtypes, shapes and
byte ranges, which can describe nothing but tensors, so reading fedgp's bytes can never run code
(unlike ``pickle`` or ``torch.load``). The header travels as a ``uint8`` tensor rather than in
safetensors' own metadata because the library reads metadata only from files, and messages are
bytes in memory.

Files add one line in front (:func:`seal`): ``FEDGP sha256=<digest of the payload>``, checked
before anything is parsed (:func:`unseal`), so a truncated copy or a flipped byte is refused, not
misread. A SHA-256 detects accidents, not forgery: anyone can recompute it for a crafted payload.
Given a ``key`` (bytes, or a string taken as UTF-8), the line is ``FEDGP hmac-sha256=<HMAC-SHA256 of
the payload under the key>`` instead (Python's :mod:`hmac`), which only a holder of the key can
write: a keyed file read without the key, an unkeyed file read with one, or a wrong key is refused.
What a payload may then say is bounded by :mod:`fedgp.models.limits`, checked before the header is
parsed.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as _load
from safetensors.torch import save as _save

from fedgp.errors import FileFormatError, InputError, InputTypeError
from fedgp.models.limits import check_json_depth

__all__ = ["pack", "packed_size", "unpack", "seal", "unseal", "check_key", "HEADER"]

#: The entry holding the JSON header; no other entry may use the name.
HEADER = "__fedgp__"
_SEAL = b"FEDGP sha256="
_KEYED = b"FEDGP hmac-sha256="


def pack(format: str, version: int, header: Mapping[str, Any], tensors: Mapping[str, torch.Tensor]) -> bytes:
    """``tensors`` and ``header`` as one safetensors payload of ``format`` at ``version``."""
    _check_names(tensors)
    meta = _header_text(format, version, header)
    # safetensors refuses views that share memory: every entry gets its own contiguous buffer.
    own = {k: v.detach().cpu().contiguous().clone() for k, v in tensors.items()}
    own[HEADER] = torch.frombuffer(bytearray(meta.encode()), dtype=torch.uint8)
    return _save(own)


def _check_names(tensors: Mapping[str, Any]) -> None:
    if HEADER in tensors:
        raise FileFormatError(f"{HEADER!r} is reserved for the container's header; rename that tensor")


def _header_text(format: str, version: int, header: Mapping[str, Any]) -> str:
    return json.dumps({"format": format, "version": int(version), **header}, allow_nan=True)


#: safetensors' name and item size of each dtype fedgp writes, in the order safetensors lays its
#: entries out: by dtype (this order, its enum's descending), then by name.
_LAYOUT = {
    torch.int64: ("I64", 8),
    torch.float64: ("F64", 8),
    torch.float32: ("F32", 4),
    torch.int32: ("I32", 4),
    torch.uint8: ("U8", 1),
    torch.bool: ("BOOL", 1),
}
_RANK = {dtype: i for i, dtype in enumerate(_LAYOUT)}


def _json_string(name: str) -> str:
    """``name`` as safetensors (serde_json) writes it in its table: escaped as ``json.dumps`` does
    without ``ensure_ascii`` (quotes, backslashes and control characters only)."""
    if name.isascii() and name.isprintable() and '"' not in name and "\\" not in name:
        return f'"{name}"'  # nothing to escape: the common case, without json.dumps' encoder
    return json.dumps(name, ensure_ascii=False)


def packed_size(
    format: str,
    version: int,
    header: Mapping[str, Any],
    shapes: Mapping[str, tuple[torch.dtype, Sequence[int]]],
) -> int:
    """``len(pack(format, version, header, tensors))`` for tensors of the given ``(dtype, shape)`` by
    name, computed from them alone: no tensor is copied or written (an in-process engine's traffic
    figures). The layout is safetensors': 8 bytes giving the JSON table's length, the table (each
    entry's dtype, shape and byte range, entries by dtype then name, padded with spaces to a multiple
    of 8 bytes), then the tensors' bytes; the header entry is one more ``uint8`` tensor."""
    _check_names(shapes)
    meta = len(_header_text(format, version, header).encode())
    entries = [(name, dtype, tuple(shape)) for name, (dtype, shape) in shapes.items()]
    entries.append((HEADER, torch.uint8, (meta,)))
    try:
        entries.sort(key=lambda e: (_RANK[e[1]], e[0]))
    except KeyError as err:
        raise InputTypeError(f"no byte count for dtype {err.args[0]}; known: {tuple(_LAYOUT)}") from None
    offset, table = 0, []
    for name, dtype, shape in entries:
        tag, width = _LAYOUT[dtype]
        end = offset + width * math.prod(shape)
        key, dims = _json_string(name), ",".join(map(str, shape))
        table.append(f'{key}:{{"dtype":"{tag}","shape":[{dims}],"data_offsets":[{offset},{end}]}}')
        offset = end
    length = len(("{" + ",".join(table) + "}").encode())
    return 8 + length + (-length) % 8 + offset


def unpack(
    data: bytes, format: str, version: int | tuple[int, ...], source: str = "the data"
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """``(header, tensors)`` of a payload written by :func:`pack`; anything else — not safetensors,
    no header, another format, another version (``version``: the one, or the tuple of those, the
    reader reads) — is a :class:`~fedgp.errors.FileFormatError` naming ``source`` and, for a fedgp
    payload of another version, the version it has."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise FileFormatError(f"{source}: expected bytes, got {type(data).__name__}")
    try:
        tensors = _load(bytes(data))
    except (SafetensorError, ValueError, TypeError, RuntimeError) as err:
        raise FileFormatError(
            f"{source} is not a fedgp {format}: not a safetensors payload ({err})"
        ) from None
    raw = tensors.pop(HEADER, None)
    if raw is None or raw.dtype != torch.uint8 or raw.dim() != 1:
        raise FileFormatError(f"{source} is not a fedgp {format}: it holds no fedgp header")
    text = raw.numpy().tobytes()
    check_json_depth(text, f"{source}: the fedgp header")
    try:
        header = json.loads(text.decode())
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError, ValueError) as err:
        raise FileFormatError(f"{source}: unreadable fedgp header ({err})") from None
    if not isinstance(header, dict):
        raise FileFormatError(f"{source}: the fedgp header is not a JSON object")
    if header.get("format") != format:
        raise FileFormatError(f"{source} is a fedgp {header.get('format')!r}, not a {format!r}")
    versions = (version,) if isinstance(version, int) else tuple(version)
    if isinstance(header.get("version"), bool) or header.get("version") not in versions:
        readable = " or ".join(map(str, versions))
        raise FileFormatError(
            f"{source} is a fedgp {format} of format version {header.get('version')!r}; this fedgp reads "
            f"version {readable}"
        )
    return header, tensors


def check_key(key: bytes | str | None) -> bytes | None:
    """``key`` as bytes (a string is taken as UTF-8), ``None`` for no key; anything else, or an empty
    key, is the caller's :class:`~fedgp.errors.InputTypeError` / :class:`~fedgp.errors.InputError`."""
    if key is None:
        return None
    if isinstance(key, str):
        key = key.encode()
    if not isinstance(key, (bytes, bytearray)):
        raise InputTypeError(f"key= must be bytes or a string, got {type(key).__name__}")
    if not key:
        raise InputError("key= must not be empty (pass key=None for a file without a key)")
    return bytes(key)


def seal(payload: bytes, key: bytes | str | None = None) -> bytes:
    """A file's bytes: the payload behind a line with its SHA-256, or with ``key`` its HMAC-SHA256."""
    secret = check_key(key)
    if secret is None:
        return _SEAL + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload
    return _KEYED + hmac.new(secret, payload, hashlib.sha256).hexdigest().encode() + b"\n" + payload


def unseal(data: bytes, source: str, key: bytes | str | None = None) -> bytes:
    """The payload of a sealed file, after checking its SHA-256 (a damaged file is refused) or, for
    a file written with a key, its HMAC-SHA256 under ``key`` (a file written with another key, or
    altered by someone without it, is refused; so is a keyed file read without ``key`` and an unkeyed
    file read with one)."""
    secret = check_key(key)
    line, newline, payload = bytes(data).partition(b"\n")
    keyed = line.startswith(_KEYED)
    if not (keyed or line.startswith(_SEAL)) or not newline:
        raise FileFormatError(
            f"{source} is not a sealed fedgp file (it does not start with {_SEAL.decode()})"
        )
    if keyed and secret is None:
        raise FileFormatError(
            f"{source} was written with a key (it is sealed with an HMAC-SHA256): pass the same key= "
            "to read it"
        )
    if not keyed and secret is not None:
        raise FileFormatError(
            f"{source} was written without a key (it carries a plain sha256), but key= was given: it is not "
            "authenticated; read it without key= only if you trust where it came from"
        )
    if keyed:
        expected = line[len(_KEYED) :]
        if not hmac.compare_digest(expected, hmac.new(secret, payload, hashlib.sha256).hexdigest().encode()):
            raise FileFormatError(
                f"{source}: its HMAC-SHA256 does not match under this key (a wrong key, or a file altered "
                "or damaged since it was written)"
            )
        return payload
    expected = line[len(_SEAL) :].decode(errors="replace")
    actual = hashlib.sha256(payload).hexdigest()
    if actual != expected:
        raise FileFormatError(
            f"{source} is damaged: its contents have sha256 {actual}, but the file records {expected} "
            "(a truncated copy or a flipped byte)"
        )
    return payload
