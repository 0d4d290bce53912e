"""Records and tasks as bytes: safetensors for the tensors, JSON for everything else.

safetensors (a flat header plus raw little-endian buffers) can describe nothing but tensors, so
reading a message can never run code — unlike ``pickle``/``torch.load``. The JSON header holds the
task's kind, round, options and settings. Round trips are bit-exact.
"""

from __future__ import annotations

import json
import struct

import torch
from safetensors.torch import load as _load_tensors
from safetensors.torch import save as _save_tensors

from fedgp.messages.records import Record
from fedgp.messages.task import Task

__all__ = ["record_to_bytes", "record_from_bytes", "task_to_bytes", "task_from_bytes", "WIRE_VERSION"]

#: The version of the byte format, written into every message's header.
WIRE_VERSION = 1
_KEY = "fedgp"


def _pack(tensors: dict[str, torch.Tensor], meta: dict) -> bytes:
    # safetensors refuses views that share memory: every entry gets its own contiguous buffer.
    own = {k: v.detach().cpu().contiguous().clone() for k, v in tensors.items()}
    return _save_tensors(own, metadata={_KEY: json.dumps({"version": WIRE_VERSION, **meta}, allow_nan=False)})


def _unpack(data: bytes) -> tuple[dict[str, torch.Tensor], dict]:
    if not isinstance(data, (bytes, bytearray, memoryview)) or len(data) < 8:
        raise ValueError("not a fedgp message: too short")
    (size,) = struct.unpack("<Q", bytes(data[:8]))
    try:
        header = json.loads(bytes(data[8 : 8 + size]))
        meta = json.loads(header["__metadata__"][_KEY])
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"not a fedgp message: unreadable header ({err})") from None
    if not isinstance(meta, dict) or meta.get("version") != WIRE_VERSION:
        raise ValueError(
            f"fedgp message version {meta.get('version') if isinstance(meta, dict) else '?'}, "
            f"expected {WIRE_VERSION}"
        )
    return _load_tensors(bytes(data)), meta


def record_to_bytes(record: Record) -> bytes:
    """A record as bytes: safetensors for its tensors, its settings in the JSON header."""
    return _pack(dict(record.tensors), {"settings": dict(record.settings)})


def record_from_bytes(data: bytes) -> Record:
    """The record written by :func:`record_to_bytes`; nothing but tensors and JSON is read."""
    tensors, meta = _unpack(data)
    return Record(tensors, meta.get("settings", {}))


def task_to_bytes(task: Task) -> bytes:
    """A task as bytes: its shared and personal tensors (prefixed ``s/`` and ``p/``) as safetensors, kind,
    round, options and settings in the JSON header."""
    tensors = {f"s/{k}": v for k, v in task.shared.tensors.items()}
    tensors.update({f"p/{k}": v for k, v in task.personal.tensors.items()})
    meta = {
        "kind": task.kind,
        "round": task.round,
        "options": dict(task.options),
        "shared": dict(task.shared.settings),
        "personal": dict(task.personal.settings),
    }
    return _pack(tensors, meta)


def task_from_bytes(data: bytes) -> Task:
    """The task written by :func:`task_to_bytes`; an unexpected tensor or a missing header field is a
    ``ValueError``."""
    tensors, meta = _unpack(data)
    parts: dict[str, dict] = {"s": {}, "p": {}}
    for name, value in tensors.items():
        side, _, key = name.partition("/")
        if side not in parts or not key:
            raise ValueError(f"fedgp task: unexpected tensor {name!r}")
        parts[side][key] = value
    try:
        return Task(
            meta["kind"],
            meta["round"],
            Record(parts["s"], meta["shared"]),
            Record(parts["p"], meta["personal"]),
            meta["options"],
        )
    except KeyError as err:
        raise ValueError(f"fedgp task: header lacks {err.args[0]!r}") from None
