"""``Record`` and ``Task``: what crosses a process or network boundary, and what carries it.

Every payload the server sends and every reply a client returns is a record: a flat mapping of
names to tensors (float64, int64 or bool) and a mapping of names to plain settings (str, int,
float, bool). No Python objects, no pickles, no callables: the same record can be kept in memory
by the in-process engines, written to bytes (:mod:`fedgp.messages.wire`), or mapped onto Flower's
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
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch

from fedgp.errors import InputError, InputTypeError, UnknownNameError

__all__ = ["Record", "TENSOR_DTYPES", "Setting", "Task", "KINDS", "MIN_CONTRIBUTORS"]

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
