"""fedgp records as Flower records, both ways, bit for bit.

A fedgp :class:`~fedgp.messages.Record` becomes one ``Array`` of bytes — its tensors' bytes one
after the other — in the message's ``fedgp.arrays`` ``ArrayRecord``, and its layout (each
tensor's name, dtype and shape) and settings, as JSON, in the ``fedgp`` ``ConfigRecord``. One
array per record rather than one per tensor: a deployment moves every Flower object of a message
as its own HTTPS request, so a message's cost follows its number of objects (a train task went
from about 20 to 6). A task sent to a node holds the ``shared`` and ``personal`` records and, in
``fedgp``, the kind, round, options, the reply declaration and the node's first client key; a
node's reply holds its clients' outcome and a ``MetricRecord`` of counts Flower's tools can read.
"""

from __future__ import annotations

import json

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

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
]

#: The ``ArrayRecord`` holding every record's bytes, and the ``ConfigRecord`` of layouts, settings
#: and the task's header.
ARRAYS, HEADER = "fedgp.arrays", "fedgp"
#: fedgp task kinds as Flower message types (``category[.action]``).
MESSAGE_TYPES = {
    "hello": "query.hello",
    "summarise": "query.summarise",
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


def put_record(content: RecordDict, name: str, record: Record) -> None:
    """Store a fedgp record in a Flower ``RecordDict`` under ``name``: its tensors' bytes as one
    ``Array`` in ``fedgp.arrays``, its layout and settings as JSON in the ``fedgp`` config."""
    tensors = {k: v.detach().cpu().contiguous() for k, v in record.tensors.items()}
    layout = [[k, str(v.dtype).removeprefix("torch."), list(v.shape)] for k, v in tensors.items()]
    parts = [v.numpy().reshape(-1).view(np.uint8) for v in tensors.values()]
    blob = np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint8)
    if ARRAYS not in content.array_records:
        content[ARRAYS] = ArrayRecord()
    if HEADER not in content.config_records:
        content[HEADER] = ConfigRecord()
    content.array_records[ARRAYS][name] = Array(blob)
    content.config_records[HEADER][f"{name}.layout"] = json.dumps(layout)
    content.config_records[HEADER][f"{name}.settings"] = json.dumps(dict(record.settings))


def get_record(content: RecordDict, name: str) -> Record:
    """The fedgp record that :func:`put_record` stored under ``name``."""
    blob = content.array_records[ARRAYS][name].numpy()
    head = content.config_records[HEADER]
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
    """A node's outcome as a Flower reply's content, with a ``MetricRecord`` of how many clients replied and
    failed."""
    content = RecordDict()
    put_record(content, "outcome", outcome_to_record(outcome, keys))
    content["metrics"] = MetricRecord({"replied": len(outcome.clients), "failed": len(outcome.failures)})
    return content


def outcome_from_content(content: RecordDict) -> Outcome:
    """The outcome that :func:`outcome_to_content` put in a reply."""
    return outcome_from_record(get_record(content, "outcome"))
