"""``Record`` and ``Task``: what crosses a process or network boundary, and what carries it.

Every payload the server sends and every reply a client returns is a record: a flat mapping of
names to tensors (float64, int64 or bool) and a mapping of names to plain settings (str, int,
float, bool). No Python objects, no pickles, no callables: the same record can be kept in memory
by the in-process engines, written to bytes (below), or mapped onto Flower's
``ArrayRecord``/``ConfigRecord``. Tensors of a record that serves a batch of B clients carry a
leading dimension B (one row per client); a single participant's message has B = 1.

A :class:`Task` is what the server asks of a batch of clients in one message exchange: two records
and a little more. It names its kind (``hello``: report your size; ``summarise``: counts and sums
for the data transforms; ``transform``: hold your data in the run's units (once per run);
``train``: a round's local update; ``evaluate``: score your test split under your personal state;
``predict``: the posterior at given inputs; ``personal``: which state you would condition on), the
round, the part every recipient shares, the part each recipient gets alone (one row per client),
and protocol options such as a simulated failure rate. A single participant's message is the task
with one row.

One option binds the engine rather than the clients: ``min_contributors``, the fewest replies a
summed field may add up before the engine releases the sum (:attr:`Task.min_contributors`). It
travels in the task, as every option does, so an engine in another process (Ray, Flower) sees it;
the engine enforces it where the sum is formed (:func:`fedgp.messages.withhold_small_sums`), and a
shard whose sum is only a part of the engine's gets the task :meth:`Task.as_part`.

**As bytes**, in fedgp's one container (:mod:`fedgp.messages.container`): a record's tensors are the
payload's tensors and its settings are in the header; a task's shared and personal tensors are
prefixed ``s/`` and ``p/``, and its kind, round, options and settings are in the header. Reading a
message can never run code; round trips are bit-exact. How many bytes a message takes is known
without writing it: :func:`task_size`, :func:`record_size` and :func:`split_size` compute it from the
tensors' names, dtypes and shapes and the settings, equal byte for byte to the written length;
:func:`reply_size` from a reply's declared fields. The in-process engines count their traffic with
them, and serialise only with ``loopback=True``. The bytes live beside the types because every
engine that counts a round's traffic needs both, and nothing else needs either.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch

from fedgp.errors import FileFormatError, InputError, InputTypeError, UnknownNameError
from fedgp.messages.container import pack, packed_size, unpack

__all__ = [
    "Record",
    "TENSOR_DTYPES",
    "Setting",
    "Task",
    "KINDS",
    "MIN_CONTRIBUTORS",
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

#: The tensor types a record may hold (states and statistics, indices and labels, flags).
TENSOR_DTYPES = (torch.float64, torch.int64, torch.bool)
#: A plain setting a record may carry beside its tensors.
Setting = str | int | float | bool


def _check_setting(name: str, value) -> None:
    if not isinstance(value, (str, int, float, bool)):
        raise InputTypeError(
            f"record setting {name!r} is a {type(value).__name__}; settings must be str, int, float or bool"
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise InputError(f"record setting {name!r} is not finite ({value})")


@dataclass(frozen=True)
class Record:
    """Named tensors and plain settings; validated on construction, read-only afterwards."""

    tensors: Mapping[str, torch.Tensor] = field(default_factory=dict)
    settings: Mapping[str, Setting] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, value in self.tensors.items():
            if not isinstance(name, str) or not name:
                raise InputTypeError(f"record tensor names must be non-empty strings, got {name!r}")
            if not isinstance(value, torch.Tensor):
                raise InputTypeError(
                    f"record entry {name!r} is a {type(value).__name__}; only tensors travel in a record "
                    "(rebuild objects on the other side from the spec and the strategy's settings)"
                )
            if value.dtype not in TENSOR_DTYPES:
                raise InputTypeError(
                    f"record tensor {name!r} has dtype {value.dtype}; allowed: {TENSOR_DTYPES}"
                )
            if value.requires_grad:
                raise InputError(f"record tensor {name!r} requires grad; send detached values")
        for name, value in self.settings.items():
            if not isinstance(name, str) or not name:
                raise InputTypeError(f"record setting names must be non-empty strings, got {name!r}")
            _check_setting(name, value)
        object.__setattr__(self, "tensors", MappingProxyType(dict(self.tensors)))
        object.__setattr__(self, "settings", MappingProxyType(dict(self.settings)))

    # -- rows -------------------------------------------------------------------------------------
    def rows(self, index: torch.Tensor | slice) -> Record:
        """The rows ``index`` of every tensor (the clients of a sub-batch); settings unchanged."""
        return Record({k: v[index] for k, v in self.tensors.items()}, self.settings)

    @staticmethod
    def cat(records: Sequence[Record]) -> Record:
        """Concatenate the rows of records with the same names (settings from the first)."""
        first = records[0]
        names = set(first.tensors)
        for other in records[1:]:
            if set(other.tensors) != names:
                raise InputError(
                    f"cannot concatenate records with different fields: {sorted(names)} vs "
                    f"{sorted(other.tensors)}"
                )
        return Record({k: torch.cat([r.tensors[k] for r in records]) for k in first.tensors}, first.settings)

    @property
    def nbytes(self) -> int:
        """Bytes of tensor data (without names, shapes or settings)."""
        return sum(v.numel() * v.element_size() for v in self.tensors.values())

    def __repr__(self) -> str:
        tensors = ", ".join(
            f"{k}: {tuple(v.shape)} {str(v.dtype).removeprefix('torch.')}" for k, v in self.tensors.items()
        )
        return f"Record(tensors={{{tensors}}}, settings={dict(self.settings)})"


#: The task kinds a client answers: the round's exchanges from ``hello`` to ``personal``.
KINDS = ("hello", "summarise", "transform", "train", "evaluate", "predict", "personal")
#: The task option naming the fewest contributors a released sum may have (absent: 1, every sum).
MIN_CONTRIBUTORS = "min_contributors"


@dataclass(frozen=True)
class Task:
    """One message exchange: ``kind``, ``round``, the ``shared`` record, per-client ``personal`` rows."""

    kind: str
    round: int = 0
    shared: Record = field(default_factory=Record)
    personal: Record = field(default_factory=Record)
    options: Mapping[str, Setting] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InputError(f"task kind must be one of {KINDS}, got {self.kind!r}")
        if not isinstance(self.shared, Record) or not isinstance(self.personal, Record):
            raise InputTypeError("a task's shared and personal parts must be Records")
        clash = set(self.shared.tensors) & set(self.personal.tensors)
        if clash:
            raise InputError(f"names {sorted(clash)} are both shared and personal")
        for name, value in self.options.items():
            _check_setting(name, value)
        minimum = self.options.get(MIN_CONTRIBUTORS, 1)
        if isinstance(minimum, bool) or not isinstance(minimum, int) or minimum < 1:
            raise InputError(f"task option {MIN_CONTRIBUTORS!r} must be an int >= 1, got {minimum!r}")
        object.__setattr__(self, "round", int(self.round))
        object.__setattr__(self, "options", MappingProxyType(dict(self.options)))

    def rows(self, index: torch.Tensor | slice) -> Task:
        """The same task for a sub-batch of its clients."""
        return Task(self.kind, self.round, self.shared, self.personal.rows(index), self.options)

    @property
    def min_contributors(self) -> int:
        """The fewest replies a summed field may add up before the engine releases the sum; below
        it the engine withholds the sums and fails their contributors (a one-client "sum" is that
        client's value). 1 unless the task's options say otherwise."""
        return int(self.options.get(MIN_CONTRIBUTORS, 1))

    def as_part(self) -> Task:
        """The task for a shard whose sums the engine adds to other shards' before releasing them
        (a Ray actor's, a Flower node's): without ``min_contributors``, which binds the whole sum, not
        a part of it — a shard of one client still contributes to a sum of many."""
        if MIN_CONTRIBUTORS not in self.options:
            return self
        options = {k: v for k, v in self.options.items() if k != MIN_CONTRIBUTORS}
        return Task(self.kind, self.round, self.shared, self.personal, options)

    def tensor(self, name: str) -> torch.Tensor:
        """A shared or personal tensor by name."""
        if name in self.personal.tensors:
            return self.personal.tensors[name]
        try:
            return self.shared.tensors[name]
        except KeyError:
            raise UnknownNameError(f"the {self.kind} task carries no tensor {name!r}") from None

    def has(self, name: str) -> bool:
        """Whether the task carries a tensor of this name (personal or shared)."""
        return name in self.personal.tensors or name in self.shared.tensors

    @property
    def tensors(self) -> dict[str, torch.Tensor]:
        """Shared and personal tensors in one mapping (personal ones have a leading client dimension)."""
        return {**self.shared.tensors, **self.personal.tensors}

    def setting(self, name: str, default=None) -> Any:
        """A shared setting, or ``default``."""
        return self.shared.settings.get(name, default)


# -- as bytes, in the one container -------------------------------------------------------------
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
