"""What a round's replies mean to an attacker: the strategy's description of what may be forged.

Omniscient attacks (:mod:`fedgp.attacks`) replace the attacked clients' replies with vectors built
from the honest replies. They need to know, per reply field, the value a client that did nothing
would send (the state it was given, or a zero gradient) — so that they act on *updates* — and how
to reach raw (unconstrained) units, so that a forged variance stays positive. Only the strategy
knows this, so it says it with :meth:`~fedgp.strategies.base.Strategy.attack_surface`, returning an
:class:`AttackSurface`. Summed fields are never part of it: the server sees them only as sums.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

import torch

from fedgp.models.spec import ParamInfo

__all__ = ["AttackSurface"]


@dataclass(frozen=True)
class AttackSurface:
    """The forgeable individual fields of one round's replies (rows = the clients that replied).

    ``references[name]``: the no-op value of field ``name``, shaped like the field's rows
    ``(n, *slots, *event)``; ``params[name]``: the hyper-parameter whose constraint maps the field
    to raw units (``None``: the field is raw already, e.g. a gradient); ``slot_dims``: how many
    dimensions after the row are *slots* — separate questions the client answered (the models of
    its group in Federated-Clustering, the restarts of a clustered model); ``owners`` ``(n, S)``:
    the registry position whose model each slot is about (-1: a shared model); ``groups`` ``(n,)``:
    rows with the same group answered the same questions, so an attacker is built from its own
    group's honest rows.
    """

    references: Mapping[str, torch.Tensor]
    params: Mapping[str, ParamInfo | None]
    slot_dims: int
    owners: torch.Tensor
    groups: torch.Tensor

    @classmethod
    def of_states(
        cls,
        spec,
        prefix: str,
        reference,
        slot_dims: int = 0,
        owners: torch.Tensor | None = None,
        groups: torch.Tensor | None = None,
        exclude: Collection[str] = (),
    ) -> AttackSurface:
        """The trained hyper-parameters of states sent back as ``prefix + name``, each client's
        no-op being ``reference`` (a :class:`~fedgp.models.HyperState` of batch ``(n, *slots)``);
        those in ``exclude`` (personal ones, never sent) are not."""
        sent = [p for p in spec.params if p.trainable and p.name not in exclude]
        refs = {prefix + p.name: reference[p.name] for p in sent}
        params = {prefix + p.name: p for p in sent}
        return cls._build(refs, params, slot_dims, owners, groups)

    @classmethod
    def of_gradients(
        cls,
        spec,
        prefix: str,
        shape: tuple[int, ...],
        slot_dims: int = 0,
        owners: torch.Tensor | None = None,
        groups: torch.Tensor | None = None,
    ) -> AttackSurface:
        """Raw gradients (or momenta) of the trained hyper-parameters sent back as ``prefix + name``
        with rows of shape ``shape = (n, *slots)``; the no-op is zero."""
        refs = {
            prefix + p.name: torch.zeros(*shape, *p.shape, dtype=torch.float64)
            for p in spec.params
            if p.trainable
        }
        return cls._build(refs, dict.fromkeys(refs), slot_dims, owners, groups)

    @classmethod
    def _build(cls, refs, params, slot_dims, owners, groups) -> AttackSurface:
        first = next(iter(refs.values()))
        n = first.shape[0]
        slots = int(torch.Size(first.shape[1 : 1 + slot_dims]).numel())
        owners = torch.full((n, slots), -1, dtype=torch.long) if owners is None else owners.reshape(n, slots)
        groups = torch.zeros(n, dtype=torch.long) if groups is None else groups
        return cls(refs, params, slot_dims, owners, groups)

    def _raw(self, name: str, value: torch.Tensor) -> torch.Tensor:
        p = self.params[name]
        return value if p is None else p.inverse_transform(value)

    def updates(self, replies: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Every row's update in raw units, ``(n, S, D)``: fields concatenated along D."""
        parts = []
        for name, ref in self.references.items():
            value = replies[name]
            n = value.shape[0]
            slots = int(torch.Size(value.shape[1 : 1 + self.slot_dims]).numel())
            parts.append((self._raw(name, value) - self._raw(name, ref)).reshape(n, slots, -1))
        return torch.cat(parts, dim=-1)

    def write(
        self, updates: torch.Tensor, rows: torch.Tensor, replies: Mapping[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """The fields with the ``rows`` (bool ``(n,)``) replaced by ``updates`` (``(n, S, D)``, raw)."""
        out, start = {}, 0
        for name, ref in self.references.items():
            value = replies[name]
            width = int(torch.Size(value.shape[1 + self.slot_dims :]).numel())
            raw = self._raw(name, ref) + updates[..., start : start + width].reshape(value.shape)
            p = self.params[name]
            forged = raw if p is None else p.transform(raw)
            mask = rows.reshape(-1, *([1] * (value.dim() - 1)))
            out[name] = torch.where(mask, forged.to(value.dtype), value)
            start += width
        return out
