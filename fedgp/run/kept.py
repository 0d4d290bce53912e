"""The owners' kept values (personal hyper-parameters) in a file: a saved result's or a checkpoint's.

``FGPR(personal=...)`` leaves each owner's personal hyper-parameters with the owner
(:mod:`fedgp.strategies.memory`). In a simulation one process plays every owner, so the user holds
them all (:meth:`fedgp.engines.Engine.read_client_memory`), and a saved result or a checkpoint
holds them too, keyed by the client's id; in a deployment each node keeps its own, which the
server never sees. The file stores, per personal hyper-parameter, the ids of the owners that keep
it (those that trained) and their values stacked in that order (float64, in the run's units),
encoded by :mod:`fedgp.messages.codec` (the values as a tensor of the file)::

    {"likelihood.noise_covar.noise": {"ids": ["a", "c"], "values": <tensor (2, 1)>}, ...}

Reading checks every entry as a client's reply is checked (:mod:`fedgp.run.stored`) before any
owner conditions on it: a name that is not one of the model's personal hyper-parameters, an id
that is not one of its clients (or repeated), values of another dtype or shape than the spec's,
a NaN or a value outside the hyper-parameter's constraint are refused, naming the field and,
where one owner's row is wrong, the client.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from fedgp.errors import FileFormatError
from fedgp.messages import Field, Record, check_reply, reply_structure, state_fields
from fedgp.models.spec import GPSpec
from fedgp.strategies.shrinkage import OFFSET

__all__ = ["Kept", "kept_record", "read_kept"]

#: Each owner's kept values, by client id: ``{id: {state name: tensor of its event shape}}``.
Kept = dict[Any, dict[str, torch.Tensor]]


def kept_record(kept: Mapping[Any, Mapping[str, torch.Tensor]], ids: Sequence) -> dict:
    """``kept`` as a file's record (the module docstring's layout; the caller encodes it with
    :func:`fedgp.messages.encode`), the owners in the order of ``ids`` (the roster's)."""
    names = sorted({name for values in kept.values() for name in values})
    record = {}
    for name in names:
        owners = [i for i in ids if name in kept.get(i, {})]
        values = torch.stack([kept[i][name].detach().to(torch.float64) for i in owners])
        record[name] = {"ids": owners, "values": values}
    return record


def read_kept(record: Any, spec: GPSpec, names: frozenset[str], ids: Sequence, where: str) -> Kept:
    """The kept values a file's ``record`` holds (decoded: its values are tensors), each checked
    against the model: ``names`` (its personal hyper-parameters) and ``ids`` (its clients). A
    :class:`~fedgp.errors.FileFormatError` names the field, and the client where one owner's row is
    wrong."""
    if not isinstance(record, dict):
        raise FileFormatError(f"{where} must map personal hyper-parameters to their owners' values")
    known, fields, out = set(ids), state_fields(spec, "state/"), {}
    for name, entry in record.items():
        field = f"{where}[{name!r}]"
        if name not in names:
            raise FileFormatError(
                f"{field}: {name!r} is not one of this model's personal hyper-parameters {sorted(names)}"
            )
        owners = entry.get("ids") if isinstance(entry, dict) else None
        if not isinstance(owners, list) or set(entry) != {"ids", "values"}:
            raise FileFormatError(f"{field} must be a record of 'ids' (a list) and 'values' (a tensor)")
        seen: set = set()
        for owner in owners:
            if isinstance(owner, bool) or not _hashable(owner) or owner not in known:
                raise FileFormatError(f"{field}.ids: client {owner!r} is not one of this model's clients")
            if owner in seen:
                raise FileFormatError(f"{field}.ids: client {owner!r} appears twice")
            seen.add(owner)
        values = entry["values"]
        if not isinstance(values, torch.Tensor):
            raise FileFormatError(f"{field}.values must be a tensor, got {type(values).__name__}")
        if values.dim() == 0 or len(values) != len(owners):
            rows = "a scalar" if values.dim() == 0 else f"{len(values)} rows"
            raise FileFormatError(
                f"{field}.values holds {rows} for its {len(owners)} clients {_some(owners)}"
            )
        checked = Record({field: values})
        declared = {field: _declared(fields, name)}
        problem = reply_structure(checked, declared, len(owners))
        if problem:
            raise FileFormatError(f"{problem} for each of its {len(owners)} clients {_some(owners)}")
        for owner, reason in zip(owners, check_reply(checked, declared, len(owners))):
            if reason is not None:
                raise FileFormatError(f"{reason} for client {owner!r}")
        for owner, value in zip(owners, values):
            out.setdefault(owner, {})[name] = value.clone()
    return out


def _declared(fields: Mapping[str, Field], name: str) -> Field:
    """How ``name``'s value is checked: a hyper-parameter's as its state field (its constraint's
    domain); a shrunk one's offset (``"offset/<name>"``, :mod:`fedgp.strategies.shrinkage`) is a raw,
    unconstrained value of the same shape."""
    if name.startswith(OFFSET):
        return Field(fields[f"state/{name[len(OFFSET) :]}"].shape, torch.float64)
    return fields[f"state/{name}"]


def _some(ids: Sequence, k: int = 3) -> str:
    """The first ``k`` ids, for an error message."""
    return "[" + ", ".join(map(repr, ids[:k])) + (", ...]" if len(ids) > k else "]")


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True
