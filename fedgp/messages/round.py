"""A round from the server's side: what the server knows, what it plans, what comes back.

A strategy's ``configure`` returns a :class:`RoundPlan` (participants, weights, the shared record,
one personal row each, the declared reply fields) given the :class:`ServerContext`; its
``aggregate`` receives the :class:`Replies` that arrived — individual fields per participant,
summed fields only as sums, failures with reasons.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch

from fedgp.errors import InputError, UnknownNameError
from fedgp.messages.fields import Field, read_state
from fedgp.messages.records import Record
from fedgp.messages.roster import Roster
from fedgp.models.spec import GPSpec
from fedgp.models.state import HyperState

__all__ = ["ServerContext", "RoundPlan", "Replies"]


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
