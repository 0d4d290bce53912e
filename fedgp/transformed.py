"""Clients' data in a data transform's units: what an engine holds once the run's transforms are known.

A :class:`~fedgp.transforms.DataTransform` says *which* map applies; these functions apply it to a
federation's clients, every field of a block of clients by one elementwise operation over their
rows (each value has the bits the client alone would compute) and checked once. An engine that
reads its clients one by one takes them made (:func:`apply_all`); one that holds every client's rows
stacked takes those rows mapped in place (:func:`stacked`) and each client's own made when a task
first reads it (:func:`lazy_all`, :class:`TransformedClients`): at 10⁴ clients the start of a run
then copies no client. A transformed value the data checks would refuse is refused naming the client
and the transform that made it, not blamed on the data.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from fedgp.data.client import ClientData, within_limits
from fedgp.errors import InputError
from fedgp.summaries import own_outcome_maps

__all__ = [
    "apply_all",
    "lazy_all",
    "outcome_maps",
    "stacked",
    "check_all",
    "apply_block",
    "TransformedClients",
]

#: Clients transformed together (one elementwise operation over their rows per field).
BLOCK = 4096


def apply_all(
    transform, clients: Sequence[ClientData]
) -> tuple[list[ClientData], torch.Tensor, torch.Tensor]:
    """Every client's data in transformed units, with the outcome offsets and scales ``(K,)``.

    Each field of a block of clients is transformed by one elementwise operation over their
    rows (so each value has the bits the client alone would compute) and checked once; each
    client gets a copy of its piece, not re-validated per client (:meth:`ClientData.derived`)."""
    offsets, scales = outcome_maps(transform, clients)
    if transform.is_identity:
        return list(clients), offsets, scales
    made: list[ClientData] = []
    for start in range(0, len(clients), BLOCK):
        block = slice(start, start + BLOCK)
        made += apply_block(transform, clients[block], offsets[block], scales[block])
    return made, offsets, scales


def lazy_all(
    transform, clients: Sequence[ClientData]
) -> tuple[Sequence[ClientData], torch.Tensor, torch.Tensor]:
    """:func:`apply_all`, each client's data made when first read (:class:`TransformedClients`):
    for an engine that holds every client's rows stacked (:func:`stacked`) and reads a client's
    own only now and then (its test split, a fallback), not 10⁴ copies at the start of a run."""
    if transform.is_identity:
        return apply_all(transform, clients)
    offsets, scales = outcome_maps(transform, clients)
    return TransformedClients(transform, clients, offsets, scales), offsets, scales


def outcome_maps(transform, clients: Sequence[ClientData]) -> tuple[torch.Tensor, torch.Tensor]:
    """Each client's outcome map ``y = offset + scale·y'``: ``(K,)`` offsets and scales."""
    if transform.y_local:
        return own_outcome_maps([c.y for c in clients])
    offset, scale = transform.outcome_map(torch.empty(0))
    return (
        torch.full((len(clients),), offset, dtype=torch.float64),
        torch.full((len(clients),), scale, dtype=torch.float64),
    )


def stacked(
    transform, clients: Sequence[ClientData], X, y, sizes, offsets, scales
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every client's training rows end to end (``X``, ``y``: the ``clients``' own, float64,
    owned by the caller and overwritten) in this transform's units: the bits :func:`apply_all`
    gives each client, by the same elementwise operations, and no client made. A value of any
    field (the test splits and known noise too) that :func:`apply_all` would refuse is refused
    here, naming the client."""
    check_all(transform, clients, offsets, scales, ("noise", "X_test", "y_test"))
    if transform.per_output:  # each row by its output's map (the raw X's last column)
        offset, scale = transform.row_maps(X)
    else:
        offset, scale = offsets.repeat_interleave(sizes), scales.repeat_interleave(sizes)
    if transform.x_offset is not None:
        X = X.sub_(transform.x_offset.to(X)).div_(transform.x_scale.to(X))
    y = y.sub_(offset).div_(scale)
    if not (within_limits(X) and within_limits(y)):
        check_all(transform, clients, offsets, scales, ("X", "y"))
    return X, y


def check_all(
    transform,
    clients: Sequence[ClientData],
    offsets: torch.Tensor,
    scales: torch.Tensor,
    names: tuple[str, ...],
) -> None:
    """Refuse, naming the client, a value of the fields ``names`` that :func:`apply_all` would
    refuse, without making any client (block by block, as it computes them)."""
    for start in range(0, len(clients), BLOCK):
        block = slice(start, start + BLOCK)
        apply_block(transform, clients[block], offsets[block], scales[block], names, make=False)


def apply_block(
    transform,
    clients: Sequence[ClientData],
    offsets: torch.Tensor,
    scales: torch.Tensor,
    only: tuple[str, ...] | None = None,
    make: bool = True,
) -> list[ClientData]:
    """One block of clients: each field (``only`` those named) of every client that holds it mapped
    by one elementwise operation over their joined rows and checked once; each client made with a
    copy of its piece (``make``), or nothing made (a check alone)."""
    fields: list[dict[str, torch.Tensor]] = [{} for _ in clients]
    names = (
        ("y", "noise", "y_test") if transform.x_offset is None else ("X", "y", "noise", "X_test", "y_test")
    )
    for name in names if only is None else [n for n in names if n in only]:
        holders = [i for i, c in enumerate(clients) if getattr(c, name) is not None]
        if not holders:
            continue
        values = [getattr(clients[i], name) for i in holders]
        rows = torch.tensor([len(v) for v in values])
        joined = torch.cat(values)
        if name.startswith("X"):
            out = transform.inputs(joined)
        elif transform.per_output:  # each row by its output's map
            at = torch.cat([getattr(clients[i], "X_test" if name == "y_test" else "X") for i in holders])
            offset, scale = transform.row_maps(at)
            out = joined / (scale * scale) if name == "noise" else (joined - offset) / scale
        else:
            scale = scales[holders].repeat_interleave(rows)
            if name == "noise":  # known per-point noise variances are in y's units squared
                out = joined / (scale * scale)
            else:
                out = (joined - offsets[holders].repeat_interleave(rows)) / scale
        pieces = torch.split(out, rows.tolist())
        if not within_limits(out):
            for i, piece in zip(holders, pieces):
                _check_made(transform, clients[i], name, piece, float(scales[i]))
        for i, piece in zip(holders, pieces) if make else ():  # a copy: a view would hold the block
            fields[i][name] = piece.clone()
    return [client.derived(**changed) for client, changed in zip(clients, fields)] if make else []


def _check_made(transform, client: ClientData, name: str, values: torch.Tensor, scale: float) -> None:
    """A transformed value the data checks would refuse is the transform's doing, not the
    user's: say so, with the box or scale that made it, before ``ClientData`` blames the data."""
    if within_limits(values):
        return
    finite = torch.isfinite(values)
    peak = float(values[finite].abs().max()) if bool(finite.any()) else math.inf
    if name.startswith("X"):
        width = float(transform.x_scale.min())
        cause = (
            f"the federation's training inputs span only {width:.3g} in some feature, and "
            f"{name} lies far outside that box"
        )
        fix = "pass Normalize(bounds=[lower, upper]) covering every input, or Transforms(inputs=None)"
    else:
        cause = f"the federation's targets have sd {scale:.3g}"
        fix = "rescale y, or pass Transforms(outcome=None)"
    raise InputError(
        f"client {client.id!r}: the data transforms map {name} to values up to {peak:.3g} "
        f"(the data themselves passed every check): {cause}; {fix}"
    )


class TransformedClients(Sequence):
    """Clients' data in a transform's units, each client's made when first read and kept (the bits
    :func:`apply_all` gives it; a value the data checks would refuse is refused then,
    naming the client)."""

    def __init__(self, transform, clients: Sequence[ClientData], offsets, scales):
        self._transform, self._clients = transform, clients
        self._offsets, self._scales = offsets, scales
        self._made: dict[int, ClientData] = {}

    def __len__(self) -> int:
        return len(self._clients)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        i = range(len(self))[index]  # an int, negative or out of range as a list reads it
        if i not in self._made:
            block = slice(i, i + 1)
            made = apply_block(self._transform, [self._clients[i]], self._offsets[block], self._scales[block])
            self._made[i] = made[0]
        return self._made[i]
