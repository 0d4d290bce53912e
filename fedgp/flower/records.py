"""fedgp records as Flower records, both ways, bit for bit.

A fedgp :class:`~fedgp.messages.Record` becomes an ``ArrayRecord`` (its tensors, as numpy arrays)
plus a ``ConfigRecord`` of its settings under the same name with ``.settings`` appended. A task
sent to a node holds ``shared`` and ``personal`` records and a ``fedgp`` ``ConfigRecord`` with
the kind, round, options, the reply declaration and the node's first client key; a node's reply
holds its clients' outcome and a ``MetricRecord`` of counts Flower's tools can read.
"""

from __future__ import annotations

import json

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

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
    """Store a fedgp record in a Flower ``RecordDict`` under ``name``: an ``ArrayRecord`` of its tensors and
    a ``ConfigRecord`` of its settings."""
    content[name] = ArrayRecord(
        {k: Array(v.detach().cpu().contiguous().numpy()) for k, v in record.tensors.items()}
    )
    content[f"{name}.settings"] = ConfigRecord({"json": json.dumps(dict(record.settings))})


def get_record(content: RecordDict, name: str) -> Record:
    """The fedgp record that :func:`put_record` stored under ``name``."""
    arrays = content.array_records[name]
    tensors = {k: torch.from_numpy(np.array(arrays[k].numpy())) for k in arrays}
    return Record(tensors, json.loads(content.config_records[f"{name}.settings"]["json"]))


def task_to_content(task: Task, header: dict) -> RecordDict:
    """The task for one node; ``header`` adds what the node needs besides (fields, keys, config)."""
    content = RecordDict()
    put_record(content, "shared", task.shared)
    put_record(content, "personal", task.personal)
    content["fedgp"] = ConfigRecord(
        {
            "kind": task.kind,
            "round": task.round,
            "options": json.dumps(dict(task.options)),
            **header,
        }
    )
    return content


def task_from_content(content: RecordDict) -> tuple[Task, ConfigRecord]:
    """The fedgp task in a Flower message's content, with the ``fedgp`` header record (reply declaration,
    first client key)."""
    head = content.config_records["fedgp"]
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
