"""``Faults``: what a run tolerates and what it simulates — failing clients, forged replies.

A real federation loses clients mid-round; a robust strategy must be shown to survive attackers.
Both are settings of a run, not of a strategy: the same FGPR runs with or without them.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any

from fedgp.attacks.base import Attack, BoundAttack
from fedgp.errors import InputError, InputTypeError
from fedgp.run.exchange import required_replies

__all__ = ["Faults"]


@dataclass(frozen=True)
class Faults:
    """Failure tolerance and simulated faults of a run (``fit(..., faults=Faults(...))``).

    Args:
        min_replies: the fewest clients that must reply for a round to count: a count (int) or a
            fraction of the round's participants (float in (0, 1]). Below it the run stops with
            :class:`~fedgp.errors.RoundFailedError` naming the clients that failed and why. A failed
            client is dropped from its round (weights renormalised over the replies) and asked again
            next round.
        min_contributors: the fewest replies a summed field may add up before the server sees the
            sum (the transforms' summary, Su-Xu-Yang's moments, clustered gradient sums, DP-FGPR's
            clipped updates). Below it the sum is not released: the minimum travels in the task
            (``Task.min_contributors``) and the engine withholds the sum where it forms it, so
            nothing it returns holds it; its contributors fail the round with the reason, and
            ``min_replies`` decides whether the run goes on. 1 (default): every sum is released;
            the Flower app's default is 2.
        simulate: each participating client fails its local update with this probability per round
            (drawn from (seed, round, client), so the same clients fail on every engine).
        attack: a :class:`fedgp.attacks.Attack`; its clients (drawn from the seed or given by id,
            listed in ``FitResult.attackers``) forge their training replies or train on flipped
            labels, the same way on every engine.
    """

    min_replies: int | float = 1
    min_contributors: int = 1
    simulate: float = 0.0
    attack: Attack | None = None

    def __post_init__(self) -> None:
        required_replies(self.min_replies, 1)  # a wrong type or range is refused here, not in round 1
        if isinstance(self.min_contributors, bool) or not isinstance(self.min_contributors, numbers.Integral):
            raise InputTypeError(
                f"Faults(min_contributors=...) must be an int, got {self.min_contributors!r}"
            )
        if self.min_contributors < 1:
            raise InputError(
                f"Faults(min_contributors=...) must be at least 1, got {self.min_contributors!r}"
            )
        if isinstance(self.simulate, bool) or not isinstance(self.simulate, numbers.Real):
            raise InputTypeError(f"Faults(simulate=...) must be a probability, got {self.simulate!r}")
        if not 0.0 <= float(self.simulate) < 1.0:
            raise InputError(f"Faults(simulate=...) must be a probability in [0, 1), got {self.simulate!r}")
        if self.attack is not None and not isinstance(self.attack, Attack):
            raise InputTypeError(
                f"Faults(attack=...) must be a fedgp.attacks.Attack, got {type(self.attack).__name__}"
            )

    def bind(self, strategy, spec, ids, seed: int) -> BoundAttack | None:
        """The attack bound to this run's clients (``None`` without one)."""
        return None if self.attack is None else self.attack.bind(strategy, spec, ids, seed)

    def task_options(self, bound: BoundAttack | None) -> dict[str, Any]:
        """The options every training task carries: the failure rate, and the attackers' roles."""
        options: dict[str, Any] = {"simulate_failures": float(self.simulate)} if self.simulate else {}
        if bound is not None:
            options.update(bound.options)
        return options

    def fingerprint(self, bound: BoundAttack | None) -> dict[str, str]:
        """What a resumed run must share with the one that wrote the checkpoint."""
        out = {
            "faults.min_replies": repr(self.min_replies),
            "faults.simulate": repr(float(self.simulate)),
            "faults.attack": repr(None if bound is None else (repr(self.attack), list(bound.ids))),
        }
        if self.min_contributors != 1:  # absent at its default, as in checkpoints that predate it
            out["faults.min_contributors"] = repr(int(self.min_contributors))
        return out
