"""Attacks: who is attacked, and where in a round the attack acts.

``fedgp.fit(..., attack=...)`` binds an :class:`Attack` to the run: the attacked clients are
drawn once from the master seed (``fraction`` or ``count`` of the registry; the draw is a function
of the seed only) or given by id (``clients``). Then, every training round:

* a **reply attack** (:mod:`fedgp.attacks.replies`) replaces the attacked clients' replies
  *on the server side*, after the engine returned them and before the strategy aggregates them —
  in :func:`fedgp.run.exchange.exchange`, on the engine's outcome — so every engine goes through the same
  code. Omniscient attacks see every honest reply of the round. They act on *updates* in raw units,
  as the strategy describes them (:class:`~fedgp.strategies.surface.AttackSurface`): a forged
  variance stays positive, and the engine's reply checks have already run (a forged reply is
  finite by construction). Summed fields are never touched: the server sees them only as sums, so
  an attacker's contribution to them is its honest one.
* a **data attack** (:class:`~fedgp.attacks.LabelFlip`) changes the attacked clients' own data,
  on the client side: they learn of it through the task's options, like ``simulate_failures``.

Attackers answer non-training tasks (evaluation, prediction) honestly; report metrics over the
honest clients (``FitResult.attackers`` lists the others).
"""

from __future__ import annotations

from abc import ABC
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from fedgp.errors import InputError
from fedgp.messages import Configurable, Outcome
from fedgp.rng import generator

__all__ = ["Attack", "BoundAttack"]


@dataclass(frozen=True)
class Attack(Configurable, ABC):
    """Base of every attack: which clients are attacked. Give exactly one of ``fraction`` (of all
    registered clients, rounded to the nearest count), ``count``, or ``clients`` (their ids)."""

    fraction: float | None = None
    count: int | None = None
    clients: tuple | None = None

    #: Whether the attack forges replies (server side) rather than data (client side).
    forges = True

    def __post_init__(self) -> None:
        given = [x is not None for x in (self.fraction, self.count, self.clients)]
        if sum(given) != 1:
            raise InputError(f"{type(self).__name__}: give exactly one of fraction, count or clients")
        if self.fraction is not None and not 0.0 < self.fraction < 1.0:
            raise InputError(f"{type(self).__name__}: fraction must be in (0, 1), got {self.fraction}")
        if self.count is not None and (isinstance(self.count, bool) or not isinstance(self.count, int)):
            raise InputError(f"{type(self).__name__}: count must be an int, got {self.count!r}")
        if self.count is not None and self.count < 1:
            raise InputError(f"{type(self).__name__}: count must be >= 1, got {self.count}")
        if self.clients is not None:
            object.__setattr__(self, "clients", tuple(self.clients))

    def attackers(self, ids: Sequence[Any], seed: int) -> torch.Tensor:
        """Registry positions of the attacked clients (ascending)."""
        n = len(ids)
        if self.clients is not None:
            missing = [c for c in self.clients if c not in ids]
            if missing:
                raise InputError(f"{type(self).__name__}: no client with id(s) {missing[:5]}")
            chosen = sorted({list(ids).index(c) for c in self.clients})
        else:
            count = self.count if self.count is not None else int(round(self.fraction * n))
            if not 1 <= count < n:
                raise InputError(
                    f"{type(self).__name__}: {count} attacked clients of {n}; need at least one of each"
                )
            chosen = sorted(generator(seed, "attackers").choice(n, size=count, replace=False).tolist())
        if len(chosen) >= n:
            raise InputError(f"{type(self).__name__}: every client is attacked; at least one must be honest")
        return torch.tensor(chosen, dtype=torch.long)

    def task_options(self, attackers: torch.Tensor) -> dict[str, Any]:
        """Settings the attacked clients receive with every training task (data attacks)."""
        return {}

    def check(self, num_clients: int) -> None:
        """Raise ``ValueError`` if the attack cannot apply to a registry of this size."""

    def forge(self, updates, honest, attacked, owners, positions, rng) -> torch.Tensor:
        """The attacked rows' new updates ``(n_attacked, S, D)`` from one group's rows: ``updates``
        ``(m, S, D)``, masks ``(m,)``, slot ``owners`` ``(m, S)``, registry ``positions`` ``(m,)``
        (reply attacks implement it)."""
        raise NotImplementedError

    def bind(self, strategy, spec, ids: Sequence[Any], seed: int) -> BoundAttack:
        """This attack for one run: the attackers drawn, the strategy and spec it reads replies with."""
        self.check(len(ids))
        positions = self.attackers(ids, seed)
        return BoundAttack(self, strategy, spec, positions, [ids[p] for p in positions.tolist()], seed)


@dataclass(frozen=True)
class BoundAttack:
    """An attack bound to a run. ``tamper(rnd, plan)`` is the hook :func:`fedgp.run.exchange.exchange`
    applies to the engine's outcome."""

    attack: Attack
    strategy: Any
    spec: Any
    positions: torch.Tensor
    ids: list
    seed: int

    @property
    def options(self) -> dict[str, Any]:
        """The task options that tell the attacked clients their role (for client-side attacks such as
        :class:`~fedgp.attacks.LabelFlip`)."""
        return self.attack.task_options(self.positions)

    def tamper(self, rnd: int, plan) -> Callable[[Outcome], Outcome] | None:
        """The outcome hook of round ``rnd`` (``None`` for data attacks: nothing to do on the server)."""
        if not self.attack.forges:
            return None
        return lambda outcome: self._forge(rnd, plan, outcome)

    def _forge(self, rnd: int, plan, outcome):
        clients = outcome.clients
        attacked = torch.isin(clients, self.positions)
        if not bool(attacked.any()) or not outcome.individual:
            return outcome
        participants = torch.as_tensor(plan.participants, dtype=torch.long)
        first = torch.tensor([int(torch.nonzero(participants == c)[0]) for c in clients.tolist()])
        personal = plan.personal.rows(first)
        surface = self.strategy.attack_surface(plan, personal, outcome.individual, self.spec)
        if surface is None:
            return outcome
        updates = surface.updates(outcome.individual)
        forged = updates.clone()
        rng = generator(self.seed, "attack", rnd)
        for g in torch.unique(surface.groups[attacked]).tolist():
            rows = surface.groups == g
            mine = attacked & rows
            made = self.attack.forge(
                updates[rows], (~attacked)[rows], attacked[rows], surface.owners[rows], clients[rows], rng
            )
            forged[mine] = made.to(forged.dtype)
        individual = dict(outcome.individual)
        individual.update(surface.write(forged, attacked, outcome.individual))
        return replace(outcome, individual=individual)
