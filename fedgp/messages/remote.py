"""What crosses between a server and a remote host of clients (a Ray actor, a Flower node): records.

A host receives the round's task for its clients together with the reply declaration, runs them
with an in-process engine, and returns its clients' outcome. Every piece here becomes a
:class:`~fedgp.messages.Record` (or JSON), so the host and the server exchange bytes only:
clients' data sent once to a simulation actor, the reply declaration, and the outcome — the
clients that replied, their individual fields, the *host's sum* of the summed fields, the
failures and the byte counts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import torch

from fedgp.data.client import ClientData
from fedgp.errors import InputTypeError
from fedgp.messages.records import Record
from fedgp.messages.roster import Roster
from fedgp.messages.round import Field, Outcome

__all__ = [
    "fields_to_json",
    "fields_from_json",
    "outcome_to_record",
    "outcome_from_record",
    "client_to_record",
    "client_from_record",
    "roster_to_record",
    "roster_from_record",
]

_DTYPES = {"float64": torch.float64, "int64": torch.int64, "bool": torch.bool}


def fields_to_json(fields: Mapping[str, Field]) -> str:
    """A reply declaration (``name -> Field``) as JSON: shape, dtype, summed and bounds of each field."""
    return json.dumps(
        {
            name: {
                "shape": list(f.shape),
                "dtype": str(f.dtype).removeprefix("torch."),
                "summed": f.summed,
                "bounds": list(f.bounds) if f.bounds is not None else None,
            }
            for name, f in fields.items()
        }
    )


def fields_from_json(text: str) -> dict[str, Field]:
    """The reply declaration written by :func:`fields_to_json`."""
    out = {}
    for name, f in json.loads(text).items():
        bounds = tuple(f["bounds"]) if f["bounds"] is not None else None
        out[name] = Field(tuple(f["shape"]), _DTYPES[f["dtype"]], bool(f["summed"]), bounds)
    return out


def outcome_to_record(outcome: Outcome, keys: torch.Tensor | None = None) -> Record:
    """An outcome as a record; ``keys`` maps the host's local positions to the server's."""
    clients = outcome.clients if keys is None else keys[outcome.clients]
    failures = outcome.failures if keys is None else {int(keys[p]): r for p, r in outcome.failures.items()}
    tensors = {"clients": clients}
    tensors.update({f"i/{k}": v for k, v in outcome.individual.items()})
    tensors.update({f"s/{k}": v for k, v in outcome.sums.items()})
    settings = {
        "failures": json.dumps({str(k): v for k, v in failures.items()}),
        "bytes_down": int(outcome.bytes_down),
        "bytes_up": int(outcome.bytes_up),
    }
    return Record(tensors, settings)


def outcome_from_record(record: Record) -> Outcome:
    """The :class:`~fedgp.messages.Outcome` written by :func:`outcome_to_record`."""
    tensors, settings = record.tensors, record.settings
    return Outcome(
        tensors["clients"].to(torch.long),
        {k[2:]: v for k, v in tensors.items() if k.startswith("i/")},
        {k[2:]: v for k, v in tensors.items() if k.startswith("s/")},
        {int(k): v for k, v in json.loads(settings["failures"]).items()},
        int(settings["bytes_down"]),
        int(settings["bytes_up"]),
    )


def client_to_record(client: ClientData) -> Record:
    """One client's data as a record (sent once, to the host that will keep it)."""
    tensors = {"X": client.X, "y": client.y}
    if client.X_test is not None:
        tensors.update(X_test=client.X_test, y_test=client.y_test)
    try:
        ident = json.dumps(client.id)
    except TypeError:
        raise InputTypeError(
            f"client id {client.id!r} cannot travel: ids must be JSON numbers or strings"
        ) from None
    return Record(tensors, {"id": ident})


def client_from_record(record: Record) -> ClientData:
    """The :class:`~fedgp.data.ClientData` written by :func:`client_to_record` (checked again on arrival)."""
    t = record.tensors
    return ClientData(
        t["X"], t["y"], id=json.loads(record.settings["id"]), X_test=t.get("X_test"), y_test=t.get("y_test")
    )


def roster_to_record(roster: Roster) -> Record:
    """The server's view of the clients (ids, sizes, test sizes, input dimensions) as a record."""
    tensors = {"n": roster.sizes, "n_test": roster.n_test, "d": roster.dims}
    return Record(tensors, {"ids": json.dumps(list(roster.ids))})


def roster_from_record(record: Record) -> Roster:
    """The :class:`~fedgp.messages.Roster` written by :func:`roster_to_record`."""
    t = record.tensors
    return Roster(json.loads(record.settings["ids"]), t["n"], t["n_test"], t["d"])
