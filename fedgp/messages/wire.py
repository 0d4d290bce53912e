"""Records and tasks as bytes, in fedgp's one container (:mod:`fedgp.messages.container`).

A record's tensors are the payload's tensors and its settings are in the header; a task's shared
and personal tensors are prefixed ``s/`` and ``p/``, and its kind, round, options and settings
are in the header. Reading a message can never run code; round trips are bit-exact.
"""

from __future__ import annotations

from fedgp.errors import FileFormatError
from fedgp.messages.container import pack, unpack
from fedgp.messages.records import Record
from fedgp.messages.task import Task

__all__ = ["record_to_bytes", "record_from_bytes", "task_to_bytes", "task_from_bytes", "WIRE_VERSION"]

#: The version of the message format, written into every message's header.
WIRE_VERSION = 2
_RECORD, _TASK = "record", "task"


def record_to_bytes(record: Record) -> bytes:
    """A record as bytes: its tensors, and its settings in the header."""
    return pack(_RECORD, WIRE_VERSION, {"settings": dict(record.settings)}, record.tensors)


def record_from_bytes(data: bytes) -> Record:
    """The record written by :func:`record_to_bytes`."""
    header, tensors = unpack(data, _RECORD, WIRE_VERSION, "a fedgp message")
    return Record(tensors, header.get("settings", {}))


def task_to_bytes(task: Task) -> bytes:
    """A task as bytes: shared and personal tensors (prefixed ``s/`` and ``p/``); kind, round,
    options and settings in the header."""
    tensors = {f"s/{k}": v for k, v in task.shared.tensors.items()}
    tensors.update({f"p/{k}": v for k, v in task.personal.tensors.items()})
    header = {
        "kind": task.kind,
        "round": task.round,
        "options": dict(task.options),
        "shared": dict(task.shared.settings),
        "personal": dict(task.personal.settings),
    }
    return pack(_TASK, WIRE_VERSION, header, tensors)


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
