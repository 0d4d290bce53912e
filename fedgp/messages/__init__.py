"""Messages: the protocol between the server and the clients, in one place.

A round is a :class:`Task` sent to its participants (a shared :class:`Record` plus one personal
row each) and a reply :class:`Record` from each, checked against declared :class:`Field` s
(:mod:`fedgp.engines.tasks` declares the fixed replies of every task kind but training). The
server's side of a round is a :class:`RoundPlan` built from the :class:`ServerContext` (what the
:class:`Roster` of registered clients told it) and the :class:`Replies` that come back; an engine
hands back an :class:`Outcome`. Strategies travel as JSON configs (:class:`Configurable`, through
the one tree codec :mod:`~fedgp.messages.codec`); records and tasks as bytes in the one container
(:mod:`~fedgp.messages.container`; :mod:`~fedgp.messages.records` writes them and computes their
sizes without writing them); a remote host's pieces as records
(:mod:`~fedgp.messages.remote`).
"""

from fedgp.messages.codec import decode, encode, register_type
from fedgp.messages.config import Configurable, config_json, from_config
from fedgp.messages.records import (
    KINDS,
    MIN_CONTRIBUTORS,
    TENSOR_DTYPES,
    Record,
    Setting,
    Task,
    record_from_bytes,
    record_size,
    record_to_bytes,
    reply_size,
    split_size,
    task_from_bytes,
    task_size,
    task_to_bytes,
)
from fedgp.messages.roster import Roster
from fedgp.messages.round import (
    ARRIVED,
    Field,
    Outcome,
    Replies,
    RoundPlan,
    ServerContext,
    check_reply,
    merge_outcomes,
    read_state,
    reply_structure,
    state_fields,
    state_tensors,
    withhold_small_sums,
)

__all__ = [
    "ARRIVED",
    "Record",
    "Setting",
    "Task",
    "Field",
    "Roster",
    "Outcome",
    "ServerContext",
    "RoundPlan",
    "Replies",
    "Configurable",
    "KINDS",
    "TENSOR_DTYPES",
    "check_reply",
    "reply_structure",
    "read_state",
    "state_fields",
    "state_tensors",
    "merge_outcomes",
    "withhold_small_sums",
    "MIN_CONTRIBUTORS",
    "config_json",
    "from_config",
    "encode",
    "decode",
    "register_type",
    "record_to_bytes",
    "record_from_bytes",
    "task_to_bytes",
    "task_from_bytes",
    "record_size",
    "task_size",
    "split_size",
    "reply_size",
]
