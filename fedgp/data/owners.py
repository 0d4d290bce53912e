"""An owner that records features of its own beside the federation's shared core.

The federation's clients share a core of named input columns (``X``, as every client holds them);
an :class:`OwnerData` holds, beside its core, columns only it records (``own``, named by
``own_names``). The core is what the shared model reads and what the federation summarises; the own
columns stay with the owner and enter its own personal part of the model
(:mod:`fedgp.models.own_features`). Another owner may name an own column the same: each owner's own
part is its own, so the names need not differ across owners.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from fedgp.data._checks import _as_float_tensor, _check_finite
from fedgp.data.client import _FIELDS, ClientData
from fedgp.data.names import check_names, frame_names
from fedgp.errors import InputError

__all__ = ["OwnerData", "split_core"]


@dataclass(frozen=True, eq=False)
class OwnerData(ClientData):
    """A client whose ``X`` holds the federation's core columns and whose ``own`` (n, e) holds the
    columns only it records, named by ``own_names`` (taken from ``own`` when it is a ``DataFrame``
    with string column names). With a test split, ``own_test`` holds the test rows' own columns.

    Refused, naming the client and the field: own columns whose number of rows differs from ``X``'s,
    NaN/inf, an own name that is also one of the core's (``feature_names``), and a test split
    without its own columns (or own test columns without a test split)."""

    own: Any = None
    own_names: tuple[str, ...] | None = None
    own_test: Any = None

    def __post_init__(self) -> None:
        super().__post_init__()
        where = f"client {self.id!r}, own"
        if self.own is None:
            raise InputError(
                f"{where}: an OwnerData needs its own columns (own=...); a plain ClientData "
                "holds an owner without any"
            )
        given = frame_names(self.own, where)
        own = _as_float_tensor(self.own, self.id, "own")
        if own.dim() != 2 or own.shape[0] != self.n:
            raise InputError(
                f"{where}: must have shape ({self.n}, e), one row per row of X; got {tuple(own.shape)}"
            )
        _check_finite(own, self.id, "own")
        names = given if self.own_names is None else check_names(self.own_names, None, where)
        names = None if names is None else check_names(names, own.shape[1], where)
        if names is not None and self.feature_names is not None:
            twice = [n for n in names if n in self.feature_names]
            if twice:
                raise InputError(
                    f"{where}: {twice} also name core feature(s); a column is either the federation's "
                    "core (in X) or the owner's own (in own), not both"
                )
        if (self.X_test is None) != (self.own_test is None):
            raise InputError(
                f"client {self.id!r}, own_test: give the test rows' own columns with X_test, and only with it"
            )
        object.__setattr__(self, "own", own)
        object.__setattr__(self, "own_names", names)
        if self.own_test is not None:
            own_test = _as_float_tensor(self.own_test, self.id, "own_test")
            if own_test.shape != (self.X_test.shape[0], own.shape[1]):
                raise InputError(
                    f"client {self.id!r}, own_test: must have shape ({self.X_test.shape[0]}, "
                    f"{own.shape[1]}), one row per test row and the own columns; got {tuple(own_test.shape)}"
                )
            _check_finite(own_test, self.id, "own_test")
            object.__setattr__(self, "own_test", own_test)

    @property
    def n_own(self) -> int:
        """The number of the owner's own columns."""
        return self.own.shape[1]

    def derived(self, **fields: torch.Tensor | None) -> OwnerData:
        """As :meth:`ClientData.derived` (the transforms change the core's units, never its rows); the
        own columns are kept as they are."""
        made = super().derived(**fields)
        for name in ("own", "own_names", "own_test"):
            object.__setattr__(made, name, getattr(self, name))
        return made

    def split(self, test_fraction: float, rng: Any) -> OwnerData:
        """As :meth:`ClientData.split`: the same rows move to the test split in the core and the own
        columns (one split of the joined columns, cut apart again)."""
        width = self.n_features
        joined = {name: getattr(self, name) for name in _FIELDS}
        whole = ClientData._unchecked(**{**joined, "X": torch.cat([self.X, self.own], 1)})
        parts = ClientData.split(whole, test_fraction, rng)
        made = ClientData.derived(
            self,
            X=parts.X[:, :width],
            y=parts.y,
            X_test=parts.X_test[:, :width],
            y_test=parts.y_test,
            noise=parts.noise,
        )
        for name, value in (
            ("own", parts.X[:, width:]),
            ("own_names", self.own_names),
            ("own_test", parts.X_test[:, width:]),
        ):
            object.__setattr__(made, name, value)
        return made

    def __repr__(self) -> str:
        test = f", n_test={self.X_test.shape[0]}" if self.has_test else ""
        return f"OwnerData(id={self.id!r}, n={self.n}, d={self.n_features}, own={self.n_own}{test})"


def split_core(client: ClientData, core: tuple[str, ...]) -> ClientData:
    """``client`` (its columns named) as an owner of the ``core``: ``X`` the core columns in the
    core's order, the rest its own (an :class:`OwnerData`; a plain ``ClientData`` when it has none).
    A core column the client lacks is refused, naming the client and the column."""
    names = client.feature_names
    if names is None:
        raise InputError(
            f"client {client.id!r}: its columns have no names, so its core and own columns cannot be told "
            "apart; give X as a DataFrame with named columns, or ClientData(..., feature_names=[...])"
        )
    missing = [n for n in core if n not in names]
    if missing:
        raise InputError(
            f"client {client.id!r}: missing core feature(s) {missing}; every owner records the core "
            f"{list(core)} (its columns are {list(names)})"
        )
    position = {n: i for i, n in enumerate(names)}
    core_index = torch.tensor([position[n] for n in core])
    own = [n for n in names if n not in set(core)]
    kept = {name: getattr(client, name) for name in ("y", "id", "y_test", "metadata", "noise")}
    columns = {"X": client.X[:, core_index], "feature_names": tuple(core)}
    if client.X_test is not None:
        columns["X_test"] = client.X_test[:, core_index]
    if not own:
        return ClientData(**kept, **columns)
    own_index = torch.tensor([position[n] for n in own])
    own_test = None if client.X_test is None else client.X_test[:, own_index]
    return OwnerData(**kept, **columns, own=client.X[:, own_index], own_names=tuple(own), own_test=own_test)
