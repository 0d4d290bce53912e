"""A privacy budget for a whole federated BO loop, not for one fit.

``FederatedBO(spec, ClientDP(FGPR(), epsilon=ε, delta=δ, rate=q), rounds=r, initial_rounds=r0)`` in
a loop of T iterations releases the shared hyper-parameters after every round of every fit: r0
rounds at the start, r more after each iteration, warm-started, so the round count (and the
accounting) runs on across fits. The budget covers them all. What one round releases is the sampled
Gaussian mechanism (Poisson rate q, noise multiplier z; a ``GaussianDpEvent`` at q = 1), and the
loop's ε after n rounds is dp-accounting's RDP accountant of its n-fold composition
(:func:`fedgp.run.privacy.epsilon_spent`, the history's ``epsilon``).

* Without ``noise``, z is calibrated by dp-accounting so that the planned ``r0 + r T`` rounds cost at
  most ε: the loop runs all T iterations, its last ε at or just below the budget.
* With ``noise``, the loop stops before an iteration whose r rounds would take ε past the budget (the
  stop reason says so): no release the budget does not afford is ever made. A budget that does not
  afford the start and one iteration is refused before any round, naming the noise that would fit.
* A loop resumed from a :class:`~fedgp.bo.BOCheckpoint` goes on at the noise multiplier its rounds so
  far were run and accounted with (the saved fit's), from the rounds already spent.

Proposals cost nothing: an owner's proposal is made on its own posterior, on its own machine, and
never leaves it (the Privacy page).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from fedgp.errors import InputError
from fedgp.run.privacy import ClientDP, calibrate_noise, epsilon_spent

__all__ = ["LoopBudget"]


@dataclass(frozen=True)
class LoopBudget:
    """The loop's budget: ``privacy`` as the user gave it, ``strategy`` the ClientDP each fit runs
    (at the loop's noise multiplier ``noise``), ``rate`` the sampling rate accounted, ``planned``
    the rounds of the planned iterations."""

    privacy: ClientDP
    strategy: ClientDP
    noise: float
    rate: float
    planned: int

    @classmethod
    def plan(
        cls, strategy: Any, method: Any, loop: Any, used: dict[str, Any] | None = None
    ) -> LoopBudget | None:
        """The budget of ``method`` (a FederatedBO: ``initial_rounds``, ``rounds``) in ``loop`` (its
        ``owners`` and ``iterations``), or ``None`` when ``strategy`` is not a ClientDP with a budget.
        ``used``: a resumed fit's privacy summary, whose noise multiplier the loop keeps."""
        if not isinstance(strategy, ClientDP) or strategy.epsilon is None:
            return None
        strategy.check_federation(len(loop.owners))
        rate = strategy.accounted_rate()
        planned = method.initial_rounds + method.rounds * loop.iterations
        if used and used.get("noise") is not None:
            noise = float(used["noise"])
        elif strategy.noise is not None:
            noise = float(strategy.noise)
        else:
            noise = calibrate_noise(strategy.epsilon, strategy.delta, rate, planned)
        budget = cls(strategy, replace(strategy, noise=noise), noise, rate, planned)
        first = method.initial_rounds + method.rounds
        if not used and budget.spent(first) > strategy.epsilon:
            fits = calibrate_noise(strategy.epsilon, strategy.delta, rate, planned)
            raise InputError(
                f"FederatedBO: the budget ε = {strategy.epsilon:g} (δ = {strategy.delta:g}) does not afford "
                f"the start's {method.initial_rounds} rounds and one iteration's {method.rounds} at noise "
                f"{noise:g} and rate {rate:g} (they would spend ε = {budget.spent(first):.4g}). The "
                f"{planned} planned rounds ({method.initial_rounds} + {method.rounds} x {loop.iterations} "
                f"iterations) fit at noise={fits:.4g}: give that, leave noise out to calibrate it, raise "
                "epsilon, or plan fewer rounds"
            )
        return budget

    def spent(self, rounds: int) -> float:
        """ε at the budget's δ after ``rounds`` rounds (dp-accounting's RDP accountant)."""
        return epsilon_spent(self.noise, self.rate, int(rounds), float(self.privacy.delta))

    def declines(self, completed: int, rounds: int, iteration: int) -> str | None:
        """Why iteration ``iteration``'s ``rounds`` rounds, after ``completed``, are not run (they
        would pass the budget), or ``None``."""
        after = self.spent(completed + rounds)
        if after <= self.privacy.epsilon:
            return None
        return (
            f"privacy budget: iteration {iteration}'s {rounds} rounds would spend ε = {after:.4g} > "
            f"{self.privacy.epsilon:g} (δ = {self.privacy.delta:g}); the {completed} rounds so far spent "
            f"ε = {self.spent(completed):.4g}"
        )
