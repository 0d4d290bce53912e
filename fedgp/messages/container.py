"""The one container every fedgp byte format uses: safetensors, with a JSON header inside it.

Messages (:mod:`fedgp.messages.wire`), checkpoints (:mod:`fedgp.run.checkpoint`) and saved
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
misread.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as _load
from safetensors.torch import save as _save

from fedgp.errors import FileFormatError

__all__ = ["pack", "unpack", "seal", "unseal", "HEADER"]

#: The entry holding the JSON header; no other entry may use the name.
HEADER = "__fedgp__"
_SEAL = b"FEDGP sha256="


def pack(format: str, version: int, header: Mapping[str, Any], tensors: Mapping[str, torch.Tensor]) -> bytes:
    """``tensors`` and ``header`` as one safetensors payload of ``format`` at ``version``."""
    if HEADER in tensors:
        raise FileFormatError(f"{HEADER!r} is reserved for the container's header; rename that tensor")
    meta = json.dumps({"format": format, "version": int(version), **header}, allow_nan=True)
    # safetensors refuses views that share memory: every entry gets its own contiguous buffer.
    own = {k: v.detach().cpu().contiguous().clone() for k, v in tensors.items()}
    own[HEADER] = torch.frombuffer(bytearray(meta.encode()), dtype=torch.uint8)
    return _save(own)


def unpack(
    data: bytes, format: str, version: int, source: str = "the data"
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """``(header, tensors)`` of a payload written by :func:`pack`; anything else — not safetensors,
    no header, another format, another version — is a :class:`~fedgp.errors.FileFormatError`
    naming ``source`` and, for a fedgp payload of another version, the version it has."""
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
    try:
        header = json.loads(raw.numpy().tobytes().decode())
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise FileFormatError(f"{source}: unreadable fedgp header ({err})") from None
    if not isinstance(header, dict):
        raise FileFormatError(f"{source}: the fedgp header is not a JSON object")
    if header.get("format") != format:
        raise FileFormatError(f"{source} is a fedgp {header.get('format')!r}, not a {format!r}")
    if header.get("version") != version:
        raise FileFormatError(
            f"{source} is a fedgp {format} of format version {header.get('version')!r}; this fedgp reads "
            f"version {version}"
        )
    return header, tensors


def seal(payload: bytes) -> bytes:
    """A file's bytes: the payload behind a line with its SHA-256."""
    return _SEAL + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload


def unseal(data: bytes, source: str) -> bytes:
    """The payload of a sealed file, after checking its SHA-256 (a damaged file is refused)."""
    line, newline, payload = bytes(data).partition(b"\n")
    if not line.startswith(_SEAL) or not newline:
        raise FileFormatError(
            f"{source} is not a sealed fedgp file (it does not start with {_SEAL.decode()})"
        )
    expected = line[len(_SEAL) :].decode(errors="replace")
    actual = hashlib.sha256(payload).hexdigest()
    if actual != expected:
        raise FileFormatError(
            f"{source} is damaged: its contents have sha256 {actual}, but the file records {expected} "
            "(a truncated copy or a flipped byte)"
        )
    return payload
