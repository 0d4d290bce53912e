"""``Record``: what crosses a process or network boundary — named tensors and plain settings.

Every payload the server sends and every reply a client returns is a record: a flat mapping of
names to tensors (float64, int64 or bool) and a mapping of names to plain settings (str, int,
float, bool). No Python objects, no pickles, no callables: the same record can be kept in memory
by the in-process engines, written to bytes (:mod:`fedgp.messages.wire`), or mapped onto Flower's
``ArrayRecord``/``ConfigRecord``. Tensors of a record that serves a batch of B clients carry a
leading dimension B (one row per client); a single participant's message has B = 1.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import torch

from fedgp.errors import InputError, InputTypeError

__all__ = ["Record", "TENSOR_DTYPES", "Setting"]

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
