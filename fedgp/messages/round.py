"""A round's messages: what the server knows and plans, what a reply may contain, what comes back.

A strategy's ``configure`` returns a :class:`RoundPlan` (participants, weights, the shared record,
one personal row each, the declared reply fields) given the :class:`ServerContext`; an engine hands
back an :class:`Outcome` (replies, sums, failures, bytes); the strategy's ``aggregate`` receives the
:class:`Replies` that arrived — individual fields per participant, summed fields only as sums,
failures with reasons.

**Declared fields.** A strategy declares every :class:`Field` it expects back: its shape (per
client), its dtype, whether the server may see each client's value (*individual*: a state, a loss,
a cluster choice) or only the sum over the round's clients (*summed*: moment matrices, sufficient
statistics — anything from which a client's rows could be rebuilt). Engines check each reply
against the declaration before it reaches the server (:func:`check_reply`): a missing or extra
field, a wrong shape or dtype, a NaN or an infinite value, an integer out of its declared range, or
a float outside its declared domain (a state's hyper-parameter beyond its GPyTorch constraint or
±1e150, a positive one below 1e-150) makes that client a failure with the reason, never part of an
average. Files check the states they hold the same way (:mod:`fedgp.run.stored`). Summed fields
reach ``aggregate`` only as sums: in process over the round's clients, from a Ray actor or a Flower
node as the sum over the clients it hosts (Flower's SecAgg+ cannot carry them exactly: README,
"Beyond one machine").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch

from fedgp.errors import InputError, InputTypeError, UnknownNameError
from fedgp.messages.records import TENSOR_DTYPES, Record
from fedgp.messages.roster import Roster
from fedgp.models.spec import GPSpec
from fedgp.models.state import HyperState

__all__ = [
    "ServerContext",
    "RoundPlan",
    "Replies",
    "Outcome",
    "merge_outcomes",
    "withhold_small_sums",
    "Field",
    "check_reply",
    "reply_structure",
    "state_fields",
    "state_tensors",
    "read_state",
]


@dataclass(frozen=True)
class ServerContext:
    """What the server knows: the spec, the clients' ids and sizes (from registration), the seed."""

    spec: GPSpec
    sizes: torch.Tensor
    weights: torch.Tensor
    ids: Sequence[Any]
    seed: int

    @classmethod
    def from_roster(cls, spec: GPSpec, roster: Roster, seed: int) -> ServerContext:
        """The context after registration: sizes, weights p_k = n_k / N, ids, seed."""
        sizes = roster.sizes.to(torch.long)
        return cls(spec, sizes, sizes.to(torch.float64) / sizes.sum(), roster.ids, seed)

    @property
    def num_clients(self) -> int:
        """The number of registered clients."""
        return len(self.sizes)


@dataclass(frozen=True)
class RoundPlan:
    """A round as the server plans it.

    ``participants``: registry positions (may repeat: sampling with replacement); ``weights``: their
    aggregation weights; ``shared``: what every participant receives; ``personal``: one row per
    participant (aligned with ``participants``); ``replies``: the declared reply fields.
    """

    participants: torch.Tensor
    weights: torch.Tensor
    shared: Record = field(default_factory=Record)
    personal: Record = field(default_factory=Record)
    replies: Mapping[str, Field] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, value in self.personal.tensors.items():
            if value.shape[:1] != self.participants.shape:
                raise InputError(
                    f"personal field {name!r} has {value.shape[0] if value.dim() else 0} rows for "
                    f"{len(self.participants)} participants"
                )
        object.__setattr__(self, "replies", MappingProxyType(dict(self.replies)))


#: The row an arrival-driven exchange (:func:`fedgp.run.exchange.exchange_arrivals`) adds to each
#: reply: the seconds since the engine's first dispatch at which it arrived (wall clock).
ARRIVED = "arrived"


@dataclass(frozen=True)
class Replies(Mapping[str, torch.Tensor]):
    """The replies of a round as ``aggregate`` sees them.

    Indexing gives an *individual* field, one row per participant that replied (in participant
    order, duplicates included). Summed fields exist only as ``sums`` over the clients that replied.
    ``weights`` are the plan's weights of the participants that replied, renormalised to the plan's
    total when some failed; ``failures`` maps the positions of failed clients to the reason.
    """

    participants: torch.Tensor
    weights: torch.Tensor
    individual: Mapping[str, torch.Tensor]
    sums: Mapping[str, torch.Tensor]
    failures: Mapping[int, str]
    slots: torch.Tensor  # indices into the plan's participants of those that replied

    def __getitem__(self, name: str) -> torch.Tensor:
        try:
            return self.individual[name]
        except KeyError:
            if name in self.sums:
                raise UnknownNameError(
                    f"reply field {name!r} is summed: only replies.sums[{name!r}] exists"
                ) from None
            raise

    def __iter__(self):
        return iter(self.individual)

    def __len__(self) -> int:
        return len(self.individual)

    def state(self, spec: GPSpec, prefix: str) -> HyperState:
        """The individual state fields named ``prefix + name`` as a batched state."""
        return read_state(self.individual, spec, prefix)

    def summed_state(self, spec: GPSpec, prefix: str) -> HyperState:
        """The summed state fields named ``prefix + name`` as a state."""
        return read_state(self.sums, spec, prefix)


@dataclass
class Outcome:
    """What came back from one task: ``clients`` (positions that replied, ascending), their
    ``individual`` fields (rows aligned with ``clients``), ``sums`` of the summed fields over them,
    ``failures`` (position -> reason), the bytes of every message down and every reply up, and
    ``withheld``: why the summed fields were not released when a rule on the fewest contributions
    to a sum withheld them (too few clients or nodes; ``None`` otherwise)."""

    clients: torch.Tensor
    individual: dict[str, torch.Tensor]
    sums: dict[str, torch.Tensor]
    failures: dict[int, str] = field(default_factory=dict)
    bytes_down: int = 0
    bytes_up: int = 0
    withheld: str | None = None

    @classmethod
    def empty(cls, fields: Mapping[str, Field], failures: Mapping[int, str] | None = None) -> Outcome:
        """No reply: the declared individual fields with zero rows, no sums, and ``failures``."""
        individual = {k: torch.zeros(0, *f.shape, dtype=f.dtype) for k, f in fields.items() if not f.summed}
        return cls(torch.zeros(0, dtype=torch.long), individual, {}, dict(failures or {}))


def merge_outcomes(parts: list[Outcome], fields: Mapping[str, Field]) -> Outcome:
    """One outcome from those of several hosts (disjoint clients): rows by ascending client,
    summed fields added host by host, failures and bytes pooled."""
    out = Outcome.empty(fields)
    replied = [p for p in parts if len(p.clients)]
    for p in parts:
        out.failures.update(p.failures)
        out.bytes_down += p.bytes_down
        out.bytes_up += p.bytes_up
        for name, value in p.sums.items():
            out.sums[name] = value.clone() if name not in out.sums else out.sums[name] + value
    if replied:
        clients = torch.cat([p.clients for p in replied])
        order = torch.argsort(clients)
        out.clients = clients[order]
        out.individual = {
            k: torch.cat([p.individual[k] for p in replied])[order] for k in replied[0].individual
        }
    return out


def withhold_small_sums(outcome: Outcome, fields: Mapping[str, Field], min_contributors: int) -> Outcome:
    """``outcome``, or, when its summed fields add up fewer than ``min_contributors`` replies, no
    reply at all: each would-be contributor fails with the reason, and the sums are dropped.

    An engine applies this where it forms the sums it returns (``Task.min_contributors``), so no
    object outside the engine holds a sum of too few clients: a one-client "sum" is that client's
    value, and anything reading the engine's outcome would have it."""
    summed = sorted(k for k, f in fields.items() if f.summed)
    if not summed or not 0 < len(outcome.clients) < min_contributors:
        return outcome
    reason = (
        f"summed fields {summed} not released: {len(outcome.clients)} contributor(s), fewer than "
        f"the {min_contributors} a sum needs (Faults(min_contributors=...))"
    )
    failures = {**outcome.failures, **dict.fromkeys(outcome.clients.tolist(), reason)}
    withheld = Outcome.empty(fields, failures)
    withheld.bytes_down, withheld.bytes_up = outcome.bytes_down, outcome.bytes_up  # spent all the same
    withheld.withheld = reason
    return withheld


@dataclass(frozen=True)
class Field:
    """One reply field: per-client ``shape``, ``dtype``, ``summed`` or individual, integer ``bounds``."""

    shape: tuple[int, ...] = ()
    dtype: torch.dtype = torch.float64
    summed: bool = False
    bounds: tuple[int, int] | None = None  # inclusive range of an integer field (e.g. a cluster index)
    #: inclusive range of a float field's values (e.g. a positive variance), or ``None``
    domain: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        if self.dtype not in TENSOR_DTYPES:
            raise InputTypeError(f"field dtype {self.dtype} is not one of {TENSOR_DTYPES}")
        if self.summed and self.dtype == torch.bool:
            raise InputTypeError("a summed field must be numeric")
        if self.domain is not None:
            low, high = (float(v) for v in self.domain)
            if self.dtype != torch.float64 or not low <= high:
                raise InputError(f"a domain needs a float64 field and low <= high, got {self.domain}")
            object.__setattr__(self, "domain", (low, high))

    @property
    def kind(self) -> str:
        """``"summed"`` (the server sees only the sum over the round's clients) or ``"individual"``."""
        return "summed" if self.summed else "individual"


def reply_structure(reply: Record, fields: Mapping[str, Field], batch: int) -> str | None:
    """What is wrong with a stacked reply as a whole (a missing or extra field, a wrong dtype or
    shape), or ``None``."""
    problems = []
    missing = sorted(set(fields) - set(reply.tensors))
    extra = sorted(set(reply.tensors) - set(fields))
    if missing:
        problems.append(f"missing field(s) {missing}")
    if extra:
        problems.append(f"undeclared field(s) {extra}")
    for name, f in fields.items():
        value = reply.tensors.get(name)
        if value is None:
            continue
        if value.dtype != f.dtype:
            problems.append(f"field {name!r} has dtype {value.dtype}, expected {f.dtype}")
        elif tuple(value.shape) != (batch, *f.shape):
            problems.append(f"field {name!r} has shape {tuple(value.shape)[1:]}, expected {f.shape}")
    return "; ".join(problems) if problems else None


def check_reply(reply: Record, fields: Mapping[str, Field], batch: int) -> list[str | None]:
    """For each of the ``batch`` clients of a stacked reply, ``None`` if its row is valid, else why not.

    A structural problem (:func:`reply_structure`) fails every row: the reply as a whole does not
    match the declaration.
    """
    structure = reply_structure(reply, fields, batch)
    if structure:
        return [structure] * batch
    reasons: list[str | None] = [None] * batch
    for name, f in fields.items():
        value = reply.tensors[name].reshape(batch, -1)
        bad = torch.zeros(batch, dtype=torch.bool)
        what = ""
        if value.dtype == torch.float64:
            bad = ~torch.isfinite(value).all(dim=1)
            what = "is not finite (NaN or inf)"
            if f.domain is not None and value.shape[1]:
                lo, hi = f.domain
                outside = ((value < lo) | (value > hi)).any(dim=1) & ~bad
                for row in torch.nonzero(outside).flatten().tolist():
                    worst = value[row][(value[row] < lo) | (value[row] > hi)][0]
                    reasons[row] = f"{reasons[row]}; " if reasons[row] else ""
                    reasons[row] += (
                        f"field {name!r} is {float(worst):.4g}, outside its domain [{lo:g}, {hi:g}]"
                    )
        elif f.bounds is not None and value.dtype == torch.int64 and value.shape[1]:
            lo, hi = f.bounds
            bad = ((value < lo) | (value > hi)).any(dim=1)
            what = f"is outside [{lo}, {hi}]"
        for row in torch.nonzero(bad).flatten().tolist():
            reasons[row] = f"{reasons[row]}; " if reasons[row] else ""
            reasons[row] += f"field {name!r} {what}"
    return reasons


# -- hyper-parameter states in records --------------------------------------------------------------


#: The largest magnitude a hyper-parameter in a reply may have. Data are refused from 1e150 on
#: (their squares near float64's limit in a kernel), so no model fedgp fits has a larger value;
#: a reply beyond it is a client's error or a lie, and would overflow the round's average.
STATE_MAGNITUDE = 1e150


def param_domain(param) -> tuple[float, float]:
    """The values a hyper-parameter can take: its GPyTorch constraint's bounds, within
    ±:data:`STATE_MAGNITUDE` (a raw, unconstrained one: the magnitude bound only); one constrained
    positive (a lower bound of 0) at least ``1 / STATE_MAGNITUDE``: no model fedgp fits has a smaller
    lengthscale or scale, and a reply's 0 would divide its inputs by zero."""
    low, high = -STATE_MAGNITUDE, STATE_MAGNITUDE
    if param.constraint is not None:
        low = max(low, float(torch.as_tensor(param.constraint.lower_bound).min()))
        high = min(high, float(torch.as_tensor(param.constraint.upper_bound).max()))
    if low == 0.0:  # Positive: its reciprocal within the same bound (a lengthscale divides the
        low = 1 / STATE_MAGNITUDE  # inputs; 0 or 1e-300 makes a posterior of NaN, not a model)
    # an Interval's transform can round a value to a few ulps beyond its bound: not a lie
    return low - 1e-9 * abs(low), high + 1e-9 * abs(high)


def state_fields(spec: GPSpec, prefix: str, batch: tuple[int, ...] = (), summed: bool = False) -> dict:
    """The fields of a (batched) state in a reply: ``prefix + name`` for every hyper-parameter.

    A state (not a sum, not a difference or gradient: ``summed=False`` and a prefix naming
    states, ``state/``) declares each value's domain, so a reply outside its constraint is that
    client's failure, not an average's."""
    domains = not summed and prefix.rstrip("/").endswith("state")
    return {
        f"{prefix}{p.name}": Field(
            (*batch, *p.shape), torch.float64, summed, domain=param_domain(p) if domains else None
        )
        for p in spec.params
    }


def state_tensors(state: HyperState, prefix: str) -> dict[str, torch.Tensor]:
    """A state's values as record tensors named ``prefix + name`` (detached float64)."""
    return {f"{prefix}{k}": v.detach().to(torch.float64) for k, v in state.items()}


def read_state(tensors: Mapping[str, torch.Tensor], spec: GPSpec, prefix: str) -> HyperState:
    """The state named ``prefix + name`` in ``tensors``, shaped by the receiver's own spec."""
    try:
        values = {p.name: tensors[f"{prefix}{p.name}"].to(spec.dtype) for p in spec.params}
    except KeyError as err:
        raise InputError(f"the record has no {err.args[0]!r}; does the sender use the same GPSpec?") from None
    return HyperState(values, spec.event_shapes)
