"""Records and tasks as bytes, in fedgp's one container (:mod:`fedgp.messages.container`).

A record's tensors are the payload's tensors and its settings are in the header; a task's shared
and personal tensors are prefixed ``s/`` and ``p/``, and its kind, round, options and settings
are in the header. Reading a message can never run code; round trips are bit-exact.

How many bytes a message takes is known without writing it: :func:`task_size`, :func:`record_size`
and :func:`split_size` compute it from the tensors' names, dtypes and shapes and the settings, equal
byte for byte to the written length; :func:`reply_size` from a reply's declared fields. The
in-process engines count their traffic with them, and serialise only with ``loopback=True``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from fedgp.errors import FileFormatError
from fedgp.messages.container import pack, packed_size, unpack
from fedgp.messages.records import Record, Task

__all__ = [
    "record_to_bytes",
    "record_from_bytes",
    "task_to_bytes",
    "task_from_bytes",
    "record_size",
    "task_size",
    "split_size",
    "reply_size",
    "WIRE_VERSION",
]

#: The version of the message format, written into every message's header.
WIRE_VERSION = 2
_RECORD, _TASK = "record", "task"


def record_to_bytes(record: Record) -> bytes:
    """A record as bytes: its tensors, and its settings in the header."""
    return pack(_RECORD, WIRE_VERSION, _record_header(record.settings), record.tensors)


def _record_header(settings: Mapping[str, Any]) -> dict:
    return {"settings": dict(settings)}


def record_from_bytes(data: bytes) -> Record:
    """The record written by :func:`record_to_bytes`."""
    header, tensors = unpack(data, _RECORD, WIRE_VERSION, "a fedgp message")
    return Record(tensors, header.get("settings", {}))


def task_to_bytes(task: Task) -> bytes:
    """A task as bytes: shared and personal tensors (prefixed ``s/`` and ``p/``); kind, round,
    options and settings in the header."""
    tensors = {f"s/{k}": v for k, v in task.shared.tensors.items()}
    tensors.update({f"p/{k}": v for k, v in task.personal.tensors.items()})
    return pack(_TASK, WIRE_VERSION, _task_header(task), tensors)


def _task_header(task: Task) -> dict:
    return {
        "kind": task.kind,
        "round": task.round,
        "options": dict(task.options),
        "shared": dict(task.shared.settings),
        "personal": dict(task.personal.settings),
    }


def task_from_bytes(data: bytes) -> Task:
    """The task written by :func:`task_to_bytes`; an unexpected tensor or a missing header field is a
    :class:`~fedgp.errors.FileFormatError`."""
    header, tensors = unpack(data, _TASK, WIRE_VERSION, "a fedgp task")
    parts: dict[str, dict] = {"s": {}, "p": {}}
    for name, value in tensors.items():
        side, _, key = name.partition("/")
        if side not in parts or not key:
            raise FileFormatError(f"fedgp task: unexpected tensor {name!r}")
        parts[side][key] = value
    try:
        return Task(
            header["kind"],
            header["round"],
            Record(parts["s"], header["shared"]),
            Record(parts["p"], header["personal"]),
            header["options"],
        )
    except KeyError as err:
        raise FileFormatError(f"fedgp task: header lacks {err.args[0]!r}") from None


# -- sizes, without writing ------------------------------------------------------------------------


def _shapes(
    tensors: Mapping[str, torch.Tensor], prefix: str = "", rows: int | None = None
) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    """``(dtype, shape)`` of each tensor under ``prefix + name``; with ``rows``, as if each had
    ``rows`` rows (a tensor without a row dimension as it is)."""
    return {
        f"{prefix}{k}": (v.dtype, tuple(v.shape) if rows is None or not v.dim() else (rows, *v.shape[1:]))
        for k, v in tensors.items()
    }


def record_size(record: Record) -> int:
    """``len(record_to_bytes(record))``, computed from the names, dtypes and shapes of the record's
    tensors and its settings: nothing is written (:func:`fedgp.messages.container.packed_size`)."""
    return packed_size(_RECORD, WIRE_VERSION, _record_header(record.settings), _shapes(record.tensors))


def task_size(task: Task, rows: int | None = None) -> int:
    """``len(task_to_bytes(task))``, computed as :func:`record_size` is; with ``rows``, that of the task
    for ``rows`` of its clients (``rows=1``: one participant's message, the same for every row)."""
    shapes = _shapes(task.shared.tensors, "s/")
    shapes.update(_shapes(task.personal.tensors, "p/", rows))
    return packed_size(_TASK, WIRE_VERSION, _task_header(task), shapes)


def split_size(record: Record, count: int) -> int:
    """Bytes of ``record`` sent as ``count`` one-row records, ``record.rows(slice(i, i + 1))`` for each
    ``i < count`` (a batch's replies, one per client): ``sum(len(record_to_bytes(r)) for r in those)``,
    computed. A tensor with fewer than ``count`` rows (a malformed reply) gives the later records none;
    one without a row dimension is counted whole in each."""
    layout = _shapes(record.tensors)
    cuts = sorted({0, count} | {min(shape[0], count) for _, shape in layout.values() if shape})
    header, total = _record_header(record.settings), 0
    for low, high in zip(cuts, cuts[1:]):
        # records low .. high - 1 hold one row of each tensor longer than low, none of the others
        rows = {
            k: (dtype, (int(shape[0] > low), *shape[1:]) if shape else ())
            for k, (dtype, shape) in layout.items()
        }
        total += (high - low) * packed_size(_RECORD, WIRE_VERSION, header, rows)
    return total


def reply_size(fields: Mapping[str, Any], rows: int = 1, settings: Mapping[str, Any] | None = None) -> int:
    """Bytes of a reply of ``rows`` clients as its fields (:class:`~fedgp.messages.Field`) declare it:
    each field a tensor of shape ``(rows, *field.shape)`` and its dtype; ``settings`` beside them. Every
    valid one-client reply to a round has this size (``rows=1``)."""
    shapes = {name: (f.dtype, (rows, *f.shape)) for name, f in fields.items()}
    return packed_size(_RECORD, WIRE_VERSION, _record_header(settings or {}), shapes)
