"""``Outcome``: what an engine hands back for one task — replies, sums, failures, bytes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from fedgp.messages.fields import Field

__all__ = ["Outcome", "merge_outcomes", "withhold_small_sums"]


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
