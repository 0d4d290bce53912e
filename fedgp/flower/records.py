"""fedgp records as Flower records, both ways, bit for bit.

A fedgp :class:`~fedgp.messages.Record` is its tensors' bytes one after the other, their layout
(each tensor's name, dtype and shape) and its settings as JSON, all in the message's ``fedgp``
``ConfigRecord`` (``bytes`` values are Flower config values). A deployment moves every Flower
object of a message as its own request (about 70 ms each on a busy loopback), and an ``Array``
is three objects (its ``ArrayRecord``, itself and its chunk), so a train task is three objects
(message, ``RecordDict``, ``ConfigRecord``; was 8, and about 20 with one array per tensor). A
record whose bytes pass :data:`INLINE_LIMIT` (Flower's array chunk size, 5 MB) goes as an
``Array`` in the ``fedgp.arrays`` ``ArrayRecord`` instead, which Flower chunks. A task sent to a
node holds the ``shared`` and ``personal`` records and, in ``fedgp``, the kind, round, options,
the reply declaration and the node's first client key; a node's reply holds its clients'
outcome (its counts included).
"""

from __future__ import annotations

import json

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict
from flwr.common.constant import FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE

from fedgp.errors import InputError
from fedgp.messages import Outcome, Record, Task
from fedgp.messages.remote import outcome_from_record, outcome_to_record

__all__ = [
    "put_record",
    "get_record",
    "task_to_content",
    "task_from_content",
    "outcome_to_content",
    "outcome_from_content",
    "message_type",
    "KIND_OF",
    "INLINE_LIMIT",
]

#: The ``ArrayRecord`` holding the bytes of records over :data:`INLINE_LIMIT`, and the
#: ``ConfigRecord`` of the others' bytes, every layout and setting, and the task's header.
ARRAYS, HEADER = "fedgp.arrays", "fedgp"
#: Bytes of a record above which it travels as a (chunked) ``Array``, not a config value.
INLINE_LIMIT = FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE
#: fedgp task kinds as Flower message types (``category[.action]``).
MESSAGE_TYPES = {
    "hello": "query.hello",
    "summarise": "query.summarise",
    "transform": "query.transform",
    "train": "train",
    "evaluate": "evaluate",
    "predict": "query.predict",
    "personal": "query.personal",
}
#: Flower message type -> fedgp task kind.
KIND_OF = {v: k for k, v in MESSAGE_TYPES.items()}


def message_type(kind: str) -> str:
    """The Flower message type (``category[.action]``) of a fedgp task kind."""
    return MESSAGE_TYPES[kind]


def put_record(content: RecordDict, name: str, record: Record, inline_limit: int | None = None) -> None:
    """Store a fedgp record in a Flower ``RecordDict`` under ``name``: its tensors' bytes, layout
    and settings in the ``fedgp`` config; bytes over ``inline_limit`` (:data:`INLINE_LIMIT`) as
    one ``Array`` in ``fedgp.arrays``."""
    tensors = {k: v.detach().cpu().contiguous() for k, v in record.tensors.items()}
    layout = [[k, str(v.dtype).removeprefix("torch."), list(v.shape)] for k, v in tensors.items()]
    parts = [v.numpy().reshape(-1).view(np.uint8) for v in tensors.values()]
    blob = np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint8)
    if HEADER not in content.config_records:
        content[HEADER] = ConfigRecord()
    head = content.config_records[HEADER]
    if blob.size > (INLINE_LIMIT if inline_limit is None else inline_limit):
        if ARRAYS not in content.array_records:
            content[ARRAYS] = ArrayRecord()
        content.array_records[ARRAYS][name] = Array(blob)
    else:
        head[f"{name}.bytes"] = blob.tobytes()
    head[f"{name}.layout"] = json.dumps(layout)
    head[f"{name}.settings"] = json.dumps(dict(record.settings))


def get_record(content: RecordDict, name: str) -> Record:
    """The fedgp record that :func:`put_record` stored under ``name``."""
    head = content.config_records[HEADER]
    if f"{name}.bytes" in head:
        blob = np.frombuffer(head[f"{name}.bytes"], dtype=np.uint8)
    else:
        blob = content.array_records[ARRAYS][name].numpy()
    tensors, start = {}, 0
    for key, dtype, shape in json.loads(str(head[f"{name}.layout"])):
        kind = getattr(torch, dtype)
        size = int(np.prod(shape, dtype=np.int64)) * torch.empty(0, dtype=kind).element_size()
        if size == 0:  # an empty tensor has no bytes to view
            tensors[key] = torch.empty(shape, dtype=kind)
        else:
            tensors[key] = torch.from_numpy(blob[start : start + size].copy()).view(kind).reshape(shape)
        start += size
    if start != blob.size:
        raise InputError(f"record {name!r}: its layout covers {start} of its {blob.size} bytes")
    return Record(tensors, json.loads(str(head[f"{name}.settings"])))


def task_to_content(task: Task, header: dict) -> RecordDict:
    """The task for one node; ``header`` adds what the node needs besides (fields, keys, config)."""
    content = RecordDict()
    content[HEADER] = ConfigRecord(
        {"kind": task.kind, "round": task.round, "options": json.dumps(dict(task.options)), **header}
    )
    put_record(content, "shared", task.shared)
    put_record(content, "personal", task.personal)
    return content


def task_from_content(content: RecordDict) -> tuple[Task, ConfigRecord]:
    """The fedgp task in a Flower message's content, with the ``fedgp`` header record (reply declaration,
    first client key)."""
    head = content.config_records[HEADER]
    task = Task(
        str(head["kind"]),
        int(head["round"]),
        get_record(content, "shared"),
        get_record(content, "personal"),
        json.loads(str(head["options"])),
    )
    return task, head


def outcome_to_content(outcome: Outcome, keys: torch.Tensor) -> RecordDict:
    """A node's outcome as a Flower reply's content."""
    content = RecordDict()
    put_record(content, "outcome", outcome_to_record(outcome, keys))
    return content


def outcome_from_content(content: RecordDict) -> Outcome:
    """The outcome that :func:`outcome_to_content` put in a reply."""
    return outcome_from_record(get_record(content, "outcome"))
