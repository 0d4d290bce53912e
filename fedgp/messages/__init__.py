"""Messages: what crosses the boundary between the server and the clients.

A round is a :class:`Task` sent to its participants (a shared :class:`Record` plus one personal
row each) and a reply :class:`Record` from each, checked against the strategy's declared
:class:`Field` s. Strategies travel as JSON configs (:class:`Configurable`); records and tasks as
safetensors bytes (:mod:`fedgp.messages.wire`).
"""

from fedgp.messages.config import Configurable, config_json, from_config
from fedgp.messages.fields import Field, check_reply, read_state, reply_structure, state_fields, state_tensors
from fedgp.messages.records import TENSOR_DTYPES, Record, Setting
from fedgp.messages.task import KINDS, Task
from fedgp.messages.wire import record_from_bytes, record_to_bytes, task_from_bytes, task_to_bytes

__all__ = [
    "Record",
    "Setting",
    "Task",
    "Field",
    "Configurable",
    "KINDS",
    "TENSOR_DTYPES",
    "check_reply",
    "reply_structure",
    "read_state",
    "state_fields",
    "state_tensors",
    "config_json",
    "from_config",
    "record_to_bytes",
    "record_from_bytes",
    "task_to_bytes",
    "task_from_bytes",
]
