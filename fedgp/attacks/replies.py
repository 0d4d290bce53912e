"""Reply attacks: what the attacked clients send instead of their honest replies.

Each works on one group of rows at a time (rows that answered the same questions) and on the
updates in raw units, slot by slot (``(m, S, D)``: a slot is one model a client was asked about).
"Honest client 0" is the honest row with the lowest registry position in the group.

=================  ====================================================================================
``Gaussian``       ``N(mean, std²)`` in every coordinate: the authors' ``randn·200 + 1e6``
``BitFlip``        the negated update of honest client 0 (the authors' ``BitFlippingWorker``)
``SignFlip``       the attacker's own honest update, negated
``IPM``            ``−ε ×`` the mean honest update (inner-product manipulation, Xie, Koyejo & Gupta 2020)
``ALIE``           ``μ − z σ`` per coordinate over the honest updates, z from Baruch, Baruch & Goldberg
                   (2019): ``s = ⌊n/2 + 1⌋ − f``, ``z = Φ⁻¹((n − s)/n)``
``Mimic``          a copy of the honest update farthest along the honest updates' top principal
                   direction (Karimireddy, He & Jaggi 2022; chosen afresh each round)
``EdgeOfBall``     per slot, ``a + t (o − a)`` with ``a`` the victim's own update (the slot's owner, else
                   honest client 0) and ``o`` the nearest honest update of another cluster (given
                   ``labels``) or else the farthest honest update: halfway (t = ½) toward another
                   cluster, the digest's "edge" attack on Threshold-Clustering
=================  ====================================================================================
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedgp.attacks.base import Attack
from fedgp.errors import InputError

__all__ = ["Gaussian", "BitFlip", "SignFlip", "IPM", "ALIE", "Mimic", "EdgeOfBall"]


def _first_honest(honest: torch.Tensor) -> int | None:
    rows = torch.nonzero(honest).flatten()
    return int(rows[0]) if len(rows) else None


def _copies(update: torch.Tensor, attacked: torch.Tensor) -> torch.Tensor:
    return update.unsqueeze(0).expand(int(attacked.sum()), *update.shape).clone()


@dataclass(frozen=True)
class Gaussian(Attack):
    """Every coordinate ``mean + std · N(0, 1)``, drawn from the round's attack generator."""

    mean: float = 1e6
    std: float = 200.0

    def forge(self, updates, honest, attacked, owners, positions, rng) -> torch.Tensor:
        shape = (int(attacked.sum()), *updates.shape[1:])
        return torch.from_numpy(rng.standard_normal(shape)) * self.std + self.mean


@dataclass(frozen=True)
class SignFlip(Attack):
    """The attacker's own honest update, negated."""

    def forge(self, updates, honest, attacked, owners, positions, rng) -> torch.Tensor:
        return -updates[attacked]


@dataclass(frozen=True)
class BitFlip(Attack):
    """The negated update of honest client 0 (unchanged replies if the group has no honest row)."""

    def forge(self, updates, honest, attacked, owners, positions, rng) -> torch.Tensor:
        first = _first_honest(honest)
        if first is None:
            return updates[attacked]
        return _copies(-updates[first], attacked)


@dataclass(frozen=True)
class IPM(Attack):
    """``−ε`` times the mean honest update: with enough attackers the mean's inner product with the
    true direction turns negative."""

    epsilon: float = 0.1

    def forge(self, updates, honest, attacked, owners, positions, rng) -> torch.Tensor:
        if not bool(honest.any()):
            return updates[attacked]
        return _copies(-self.epsilon * updates[honest].mean(0), attacked)


@dataclass(frozen=True)
class ALIE(Attack):
    """ "A little is enough": ``μ − z σ`` per coordinate (σ the sample standard deviation of the
    honest updates). ``z=None`` takes Baruch et al.'s value for the group's n rows and f attackers;
    when f ≥ n/2 + 1 that formula has no finite z and a given ``z`` is required."""

    z: float | None = None

    def z_value(self, n: int, f: int) -> float:
        """The z of "A Little Is Enough" for ``n`` participants and ``f`` attackers: the given ``z``,
        else the largest that still hides among the honest updates (Baruch et al. 2019)."""
        if self.z is not None:
            return float(self.z)
        s = (n // 2 + 1) - f
        p = (n - s) / n
        if not 0.0 < p < 1.0:
            raise InputError(f"ALIE: no finite z for n = {n} participants and f = {f} attackers; give z")
        return float(torch.special.ndtri(torch.tensor(p, dtype=torch.float64)))

    def forge(self, updates, honest, attacked, owners, positions, rng) -> torch.Tensor:
        if int(honest.sum()) < 2:
            return updates[attacked]
        good = updates[honest]
        z = self.z_value(len(updates), int(attacked.sum()))
        return _copies(good.mean(0) - z * good.std(0), attacked)


@dataclass(frozen=True)
class Mimic(Attack):
    """Every attacker copies one honest update: the one with the largest projection (in absolute
    value) on the top principal direction of the centred honest updates, which over-weights that
    client's data and the direction honest clients disagree on most."""

    def forge(self, updates, honest, attacked, owners, positions, rng) -> torch.Tensor:
        rows = torch.nonzero(honest).flatten()
        if not len(rows):
            return updates[attacked]
        flat = updates[rows].reshape(len(rows), -1)
        centred = flat - flat.mean(0)
        if len(rows) < 2 or not bool(centred.abs().max() > 0):
            return _copies(updates[rows[0]], attacked)
        direction = torch.linalg.svd(centred, full_matrices=False).Vh[0]
        target = rows[int(torch.argmax((centred @ direction).abs()))]
        return _copies(updates[target], attacked)


@dataclass(frozen=True)
class EdgeOfBall(Attack):
    """Per slot, ``toward`` of the way from the victim's update to another cluster's (see the module
    table). ``labels``: each registry position's true cluster (-1 unknown), known to this omniscient
    attacker; without them the farthest honest update stands in for "another cluster"."""

    toward: float = 0.5
    labels: tuple | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.labels is not None:
            object.__setattr__(self, "labels", tuple(int(x) for x in self.labels))

    def check(self, num_clients: int) -> None:
        if self.labels is not None and len(self.labels) != num_clients:
            raise InputError(f"EdgeOfBall: {len(self.labels)} labels for {num_clients} clients")

    def forge(self, updates, honest, attacked, owners, positions, rng) -> torch.Tensor:
        good = torch.nonzero(honest).flatten()
        if not len(good):
            return updates[attacked]
        out = torch.empty(updates.shape[1:], dtype=updates.dtype)
        where = {int(p): i for i, p in enumerate(positions.tolist())}
        for s in range(updates.shape[1]):
            owner = where.get(int(owners[0, s]), -1)
            anchor = owner if owner >= 0 and bool(honest[owner]) else int(good[0])
            others = good[good != anchor]
            if not len(others):
                out[s] = updates[anchor, s]
                continue
            gaps = (updates[others, s] - updates[anchor, s]).norm(dim=-1)
            if self.labels is not None:
                mine = self.labels[int(positions[anchor])]
                foreign = torch.tensor([self.labels[int(positions[o])] != mine for o in others.tolist()])
                if bool(foreign.any()):
                    other = others[foreign][int(torch.argmin(gaps[foreign]))]
                else:
                    other = others[int(torch.argmax(gaps))]
            else:
                other = others[int(torch.argmax(gaps))]
            out[s] = updates[anchor, s] + self.toward * (updates[other, s] - updates[anchor, s])
        return _copies(out, attacked)
