"""Stopping rules: train to convergence, not to a round budget.

``fit(..., rounds=R, stop=rule)`` checks ``rule`` after every round and ends the run at the first
round where it holds; ``rounds`` is then a budget. A run that spends the whole budget without
meeting the rule ends with a :class:`ConvergenceWarning`, so under-training is never silent.

What the rules look at, after each round ``t``:

* :class:`StateChange` — the state ``strategy.global_state(server)`` in constrained units (what
  ``FitResult.state`` shows). A batched state is one state per batch row: the k clusters of a
  clustered strategy (IFCA, the clustered GP), or every client's personal state for a personal
  strategy (``FederatedClustering``). The relative change of row ``b`` over ``window`` rounds is
  ``||θ_b(t) - θ_b(t - window)|| / max(||θ_b(t - window)||, 1e-12)`` (Euclidean norm over all of
  the row's hyper-parameter values); the rule holds when the *largest* row's change is below
  ``tol``: every cluster (every client) must have settled, not only the big ones.
* :class:`NLLPlateau` — the history's ``train_nll`` (rounds where it is NaN are skipped): it holds
  when the mean of the last ``patience`` rounds is not below the mean of the ``patience`` rounds
  before them by more than ``min_delta`` (nats per point). Means, not the best value as in Keras'
  ``EarlyStopping``: a minibatch NLL is noisy, and its best value is a lucky draw that later rounds
  rarely beat, which stopped a still-improving FGPR run early.
* :class:`AnyOf` — the first of its rules that holds. ``stop="auto"`` is :func:`auto_rule`.

Rules are frozen dataclasses: their ``repr`` goes into a checkpoint's fingerprint, and the states
they remember go into the checkpoint, so a resumed run stops at the same round as an unbroken one.
"""

from __future__ import annotations

import math
import numbers
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from fedgp.errors import InputError, InputTypeError
from fedgp.models.state import HyperState

__all__ = [
    "StopRule",
    "StateChange",
    "NLLPlateau",
    "AnyOf",
    "auto_rule",
    "resolve_stop",
    "state_rows",
]


def state_rows(state: HyperState) -> torch.Tensor:
    """The state as a matrix: one row per batch element (cluster, client), all values flattened."""
    batch = state.batch_shape
    rows = 1 if not batch else int(torch.Size(batch).numel())
    parts = [v.detach().to(torch.float64).reshape(rows, -1) for v in state.values()]
    return torch.cat(parts, dim=1).cpu()


def _check_positive(owner: str, name: str, value, integer: bool = False) -> None:
    kind = numbers.Integral if integer else numbers.Real
    if isinstance(value, bool) or not isinstance(value, kind) or not value > 0 or not math.isfinite(value):
        what = "a positive integer" if integer else "a positive finite number"
        raise InputError(f"{owner}: {name} must be {what}, got {value!r}")


class StopRule(ABC):
    """A stopping rule: :meth:`check` says why the run may stop after the latest round, or ``None``.

    Your own rule subclasses this; make it a frozen dataclass, so that its ``repr`` (part of a
    checkpoint's fingerprint) is the same in the run that resumes."""

    @property
    @abstractmethod
    def memory(self) -> int:
        """How many of the latest states (one per round, newest last) :meth:`check` needs."""

    @abstractmethod
    def check(self, states: Sequence[torch.Tensor], nll: Sequence[float]) -> str | None:
        """``states``: the last :attr:`memory` (or fewer, early on) states as :func:`state_rows`
        matrices; ``nll``: the ``train_nll`` of every round so far. The reason to stop, or ``None``."""

    @property
    def uses_nll(self) -> bool:
        """Whether :meth:`check` reads the training NLL (then every round computes it)."""
        return False


@dataclass(frozen=True)
class StateChange(StopRule):
    """Stop when every row of the global state (every cluster; every client for personal
    strategies) changed by less than ``tol`` (relative) over the last ``window`` rounds."""

    tol: float = 1e-4
    window: int = 10

    def __post_init__(self) -> None:
        _check_positive("StateChange", "tol", self.tol)
        _check_positive("StateChange", "window", self.window, integer=True)

    @property
    def memory(self) -> int:
        return self.window + 1

    def change(self, states: Sequence[torch.Tensor]) -> torch.Tensor:
        """The relative change of each row over the window (needs ``window + 1`` states)."""
        new, old = states[-1], states[-1 - self.window]
        return (new - old).norm(dim=1) / old.norm(dim=1).clamp_min(1e-12)

    def check(self, states, nll):
        if len(states) <= self.window:
            return None
        change = self.change(states)
        worst = float(change.max())
        if not worst < self.tol:  # NaN never converges
            return None
        rows = f" (largest of {len(change)} states)" if len(change) > 1 else ""
        return f"StateChange: relative change {worst:.3g}{rows} < tol {self.tol:g} over {self.window} rounds"


@dataclass(frozen=True)
class NLLPlateau(StopRule):
    """Stop when the mean training NLL of the last ``patience`` rounds is not below that of the
    ``patience`` rounds before by more than ``min_delta`` (rounds without a finite ``train_nll``
    do not count)."""

    patience: int = 20
    min_delta: float = 1e-4

    def __post_init__(self) -> None:
        _check_positive("NLLPlateau", "patience", self.patience, integer=True)
        if isinstance(self.min_delta, bool) or not isinstance(self.min_delta, numbers.Real):
            raise InputError(f"NLLPlateau: min_delta must be a number >= 0, got {self.min_delta!r}")
        if not (self.min_delta >= 0 and math.isfinite(self.min_delta)):
            raise InputError(f"NLLPlateau: min_delta must be a finite number >= 0, got {self.min_delta!r}")

    @property
    def memory(self) -> int:
        return 0

    @property
    def uses_nll(self) -> bool:
        """Yes: the rule reads the training NLL."""
        return True

    def check(self, states, nll):
        finite = [v for v in nll if v is not None and math.isfinite(v)]
        p = self.patience
        if len(finite) < 2 * p:
            return None
        before, recent = sum(finite[-2 * p : -p]) / p, sum(finite[-p:]) / p
        if recent < before - self.min_delta:
            return None
        return (
            f"NLLPlateau: mean train_nll {recent:.6g} of the last {p} rounds is not below the "
            f"{before:.6g} of the {p} before by more than min_delta {self.min_delta:g}"
        )


@dataclass(frozen=True)
class AnyOf(StopRule):
    """Stop when any of ``rules`` holds (the first one's reason is reported)."""

    rules: tuple[StopRule, ...]

    def __init__(self, *rules: StopRule):
        if len(rules) == 1 and isinstance(rules[0], (list, tuple)):
            rules = tuple(rules[0])
        if not rules:
            raise InputError("AnyOf needs at least one rule, e.g. AnyOf(StateChange(), NLLPlateau())")
        for rule in rules:
            if not isinstance(rule, StopRule):
                raise InputTypeError(
                    f"AnyOf: every rule must be a fedgp.run.StopRule (StateChange, NLLPlateau, ...), "
                    f"got {type(rule).__name__}"
                )
        object.__setattr__(self, "rules", tuple(rules))

    def __repr__(self) -> str:
        return f"AnyOf({', '.join(map(repr, self.rules))})"

    @property
    def memory(self) -> int:
        return max(rule.memory for rule in self.rules)

    @property
    def uses_nll(self) -> bool:
        """Whether any of the rules reads the training NLL."""
        return any(rule.uses_nll for rule in self.rules)

    def check(self, states, nll):
        for rule in self.rules:
            reason = rule.check(states, nll)
            if reason is not None:
                return reason
        return None


def auto_rule() -> AnyOf:
    """``stop="auto"``: a state change below 1e-4 over 10 rounds, or no gain above 1e-4 nats per
    point between the mean NLLs of two 20-round windows. Sized for standardised data (``fit``'s
    default transforms)."""
    return AnyOf(StateChange(tol=1e-4, window=10), NLLPlateau(patience=20, min_delta=1e-4))


def resolve_stop(stop: StopRule | str | None) -> StopRule | None:
    """``fit``'s ``stop`` argument as a rule (or ``None``: run the whole budget, no warning)."""
    if stop is None or isinstance(stop, StopRule):
        return stop
    if isinstance(stop, str) and stop == "auto":
        return auto_rule()
    raise InputError(
        f"stop must be None (run every round), 'auto', or a fedgp.run stopping rule such as "
        f"StateChange(tol=1e-4, window=10), NLLPlateau(patience=20) or AnyOf(...); got {stop!r}"
    )
