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
* :class:`NLLPlateau` — the history's ``train_nll`` (rounds where it is NaN are skipped) and the
  state: it compares the mean of the last ``patience`` rounds with the mean of the ``patience``
  rounds before. A fall of more than ``min_delta`` (nats per point) means the run still
  improves; a rise of more than ``min_delta`` and twice the standard error of the difference of
  the two means means it is rising, and a rising objective is never reported as convergence.
  Otherwise the objective is flat, and the rule holds once the state has also settled: its
  relative change over the last ``patience`` rounds is below ``state_tol`` (a flat minibatch NLL
  is not proof of a still state). Means, not the best value as
  in Keras' ``EarlyStopping``: a minibatch NLL is noisy, and its best value is a lucky draw that
  later rounds rarely beat, which stopped a still-improving FGPR run early.
* :class:`AnyOf` — the first of its rules that holds. ``stop="auto"`` is :func:`auto_rule`.

A rule's :meth:`~StopRule.statistics` go into every history row as ``stop_*`` columns, so
``result.history`` shows how close each round was to the rule. When the budget runs out first,
:meth:`~StopRule.diverging` tells a run that diverges (its objective ended above its best while
the state still moves: a :class:`~fedgp.errors.DivergenceWarning`) from one that needs more rounds
(a :class:`~fedgp.errors.ConvergenceWarning`).

A rise is never convergence, whatever the rule and the optimiser: at every round where a rule
holds, :meth:`~StopRule.risen` compares the training NLL's last window with its best window
(:func:`rise_above_best`). A state that settled (``StateChange``), or windows that look flat next to
each other (``NLLPlateau``), after the objective climbed from its best — Adam restarted every round
at a constant lr can walk a run up a slope and keep it there — end the run as *diverging*, with a
``DivergenceWarning``, not as converged. A rise counts when it exceeds :data:`RISE_TOL` nats per
point and two standard errors: a federated fixed point may sit a few hundredths above the best
window it passed on the way (up to 0.029 on the convergence benchmark's panels,
``benchmarks/stop_rise.py``), while the failures this guards against rose by 1 to 31.

Rules are frozen dataclasses: their ``repr`` goes into a checkpoint's fingerprint, and the states
they remember go into the checkpoint, so a resumed run stops at the same round as an unbroken one.
"""

from __future__ import annotations

import math
import numbers
import statistics
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from fedgp.errors import InputError, InputTypeError
from fedgp.models.state import HyperState

__all__ = [
    "RISE_TOL",
    "rise_above_best",
    "StopRule",
    "StateChange",
    "NLLPlateau",
    "AnyOf",
    "auto_rule",
    "resolve_stop",
    "state_rows",
]


#: The least rise, in nats per point, of the training NLL's last window above its best window that
#: :meth:`StopRule.risen` calls a rise (it must also exceed two standard errors). Standardised data
#: (``fit``'s default transforms) put a per-point NLL near 1; see the module docstring.
RISE_TOL = 0.05


def _finite(nll: Sequence[float]) -> list[float]:
    return [v for v in nll if v is not None and math.isfinite(v)]


def _rise(before: Sequence[float], after: Sequence[float]) -> tuple[float, float]:
    """The rise of ``after``'s mean over ``before``'s (windows of one length) and twice the standard
    error of that difference."""
    se = math.sqrt((statistics.variance(before) + statistics.variance(after)) / len(after))
    return statistics.fmean(after) - statistics.fmean(before), 2 * se


def rise_above_best(nll: Sequence[float], window: int) -> tuple[float, float, float, int] | None:
    """How far the mean of the last ``window`` finite NLLs is above the lowest mean of any
    ``window`` consecutive ones before: ``(rise, two standard errors, best mean, best window's first
    index)``, or ``None`` with fewer than ``2 * window`` values (or ``window < 2``)."""
    finite = _finite(nll)
    if window < 2 or len(finite) < 2 * window:
        return None
    means = [statistics.fmean(finite[i : i + window]) for i in range(len(finite) - 2 * window + 1)]
    best = min(range(len(means)), key=means.__getitem__)
    rise, bound = _rise(finite[best : best + window], finite[-window:])
    return rise, bound, means[best], best


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

    def diverging(self, states: Sequence[torch.Tensor], nll: Sequence[float]) -> str | None:
        """Asked when the budget ran out before :meth:`check` held: why the run diverges (its
        objective ended above its best while the state still moves), or ``None``."""
        return None

    def statistics(self, states: Sequence[torch.Tensor], nll: Sequence[float]) -> dict[str, float]:
        """What the rule measured this round (NaN until it can tell), for the history's ``stop_*``
        columns."""
        return {}

    @property
    def uses_nll(self) -> bool:
        """Whether :meth:`check` reads the training NLL (then every round computes it)."""
        return False

    @property
    def rise_window(self) -> int:
        """The window, in rounds, over which :meth:`risen` compares the training NLL."""
        return 10

    @property
    def accepts_rise(self) -> bool:
        """Whether the rule stops on a rise by design (``NLLPlateau(stop_on_rise=True)``: "no longer
        improving"); then :meth:`risen` is not asked."""
        return False

    def risen(self, nll: Sequence[float]) -> str | None:
        """Asked at every round where :meth:`check` holds: why the run's training NLL has risen above
        its best (its last :attr:`rise_window` rounds' mean above the best such window's by more than
        :data:`RISE_TOL` and two standard errors), so that stopping now is no convergence; or ``None``."""
        found = None if self.accepts_rise else rise_above_best(nll, self.rise_window)
        if found is None:
            return None
        rise, bound, best_mean, best = found
        if not rise > max(RISE_TOL, bound):
            return None
        w = self.rise_window
        return (
            f"the mean train_nll of the last {w} rounds, {best_mean + rise:.4g}, is {rise:.3g} above its "
            f"best, {best_mean:.4g} (rounds {best + 1}-{best + w} of those with a train_nll)"
        )


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

    @property
    def rise_window(self) -> int:
        """The state's window."""
        return self.window

    def change(self, states: Sequence[torch.Tensor]) -> torch.Tensor:
        """The relative change of each row over the window (needs ``window + 1`` states)."""
        new, old = states[-1], states[-1 - self.window]
        return (new - old).norm(dim=1) / old.norm(dim=1).clamp_min(1e-12)

    def statistics(self, states, nll) -> dict[str, float]:
        """``state_change``: the largest row's relative change over the window."""
        enough = len(states) > self.window
        return {"state_change": float(self.change(states).max()) if enough else math.nan}

    def check(self, states, nll) -> str | None:
        worst = self.statistics(states, nll)["state_change"]
        if not worst < self.tol:  # NaN (too few rounds yet, or a NaN state) never converges
            return None
        rows = f" (largest of {len(states[-1])} states)" if len(states[-1]) > 1 else ""
        return f"StateChange: relative change {worst:.3g}{rows} < tol {self.tol:g} over {self.window} rounds"


@dataclass(frozen=True)
class NLLPlateau(StopRule):
    """Stop when the training NLL is flat and the state has settled: the mean ``train_nll`` of the
    last ``patience`` rounds is neither below that of the ``patience`` rounds before by more than
    ``min_delta`` nor above it by more than ``min_delta`` and two standard errors, and the state
    changed by less than ``state_tol`` (relative) over the last ``patience`` rounds
    (``state_tol=None``: the NLL alone). Rounds without a finite ``train_nll`` do not count.

    ``stop_on_rise=True`` also stops when the NLL rose: "no longer improving" rather than "flat",
    the rule Table 1's FGPR-converged results were made with; a rise then reads as convergence,
    which is why it is not the default."""

    patience: int = 20
    min_delta: float = 1e-4
    state_tol: float | None = 1e-3
    stop_on_rise: bool = False

    def __post_init__(self) -> None:
        _check_positive("NLLPlateau", "patience", self.patience, integer=True)
        if isinstance(self.min_delta, bool) or not isinstance(self.min_delta, numbers.Real):
            raise InputError(f"NLLPlateau: min_delta must be a number >= 0, got {self.min_delta!r}")
        if not (self.min_delta >= 0 and math.isfinite(self.min_delta)):
            raise InputError(f"NLLPlateau: min_delta must be a finite number >= 0, got {self.min_delta!r}")
        if self.state_tol is not None:
            _check_positive("NLLPlateau", "state_tol", self.state_tol)
        if not isinstance(self.stop_on_rise, bool):
            raise InputTypeError(f"NLLPlateau: stop_on_rise must be True or False, got {self.stop_on_rise!r}")

    @property
    def memory(self) -> int:
        return 0 if self.state_tol is None else self.patience + 1

    @property
    def uses_nll(self) -> bool:
        """Yes: the rule reads the training NLL."""
        return True

    @property
    def rise_window(self) -> int:
        """The rule's ``patience``."""
        return self.patience

    @property
    def accepts_rise(self) -> bool:
        """``stop_on_rise``."""
        return self.stop_on_rise

    def _rise_bound(self, before: Sequence[float], after: Sequence[float]) -> tuple[float, float]:
        """The rise of ``after``'s mean over ``before``'s, and the least rise that counts: above
        ``min_delta`` and twice the standard error of the difference of the two means."""
        rise, bound = _rise(before, after)
        return rise, max(self.min_delta, bound)

    def _moved(self, states: Sequence[torch.Tensor]) -> float:
        """The state's largest relative change over the last ``patience`` rounds (NaN: too few)."""
        return StateChange(self.state_tol or 1.0, self.patience).statistics(states, ())["state_change"]

    def statistics(self, states, nll) -> dict[str, float]:
        """``nll_rise``: the last window's mean NLL minus the one before's (negative: improving);
        ``nll_rise_bound``: the least rise that counts as rising; ``plateau_state_change``: the
        state's largest relative change over the last ``patience`` rounds (with ``state_tol``)."""
        finite, p = _finite(nll), self.patience
        rise = bound = math.nan
        if len(finite) >= 2 * p and p > 1:
            rise, bound = self._rise_bound(finite[-2 * p : -p], finite[-p:])
        elif len(finite) >= 2 * p:
            rise, bound = finite[-1] - finite[-2], self.min_delta
        out = {"nll_rise": rise, "nll_rise_bound": bound}
        if self.state_tol is not None:
            out["plateau_state_change"] = self._moved(states)
        return out

    def check(self, states, nll) -> str | None:
        stats = self.statistics(states, nll)
        rise, bound, p = stats["nll_rise"], stats["nll_rise_bound"], self.patience
        if not math.isfinite(rise) or rise < -self.min_delta:
            return None  # too few rounds yet, or still improving
        if rise > bound and not self.stop_on_rise:
            return None  # rising: never reported as convergence
        still = ""
        if self.state_tol is not None:
            moved = stats["plateau_state_change"]
            if not moved < self.state_tol:
                return None  # a flat objective, but the state still moves (or too few states yet)
            still = f", and the state moved {moved:.3g} < state_tol {self.state_tol:g}"
        return (
            f"NLLPlateau: mean train_nll of the last {p} rounds is not below that of the {p} before "
            f"by more than min_delta {self.min_delta:g} (change {rise:+.3g}){still}"
        )

    def diverging(self, states, nll) -> str | None:
        """The last window's mean NLL is above the best window's (by more than ``min_delta`` and
        two standard errors) while the state still moves (by ``state_tol``, when given)."""
        p = self.patience
        found = rise_above_best(nll, p)
        if found is None:
            return None
        rise, bound, best_mean, best = found
        moved = self._moved(states) if self.state_tol is not None else math.nan
        if not rise > max(self.min_delta, bound) or moved < (self.state_tol or 0.0):
            return None
        motion = f" while the state still moves ({moved:.3g} over {p} rounds)" if self.state_tol else ""
        return (
            f"the mean train_nll of the last {p} rounds, {best_mean + rise:.4g}, is {rise:.3g} "
            f"above its best, {best_mean:.4g} (rounds {best + 1}-{best + p} of those with a train_nll)"
            f"{motion}"
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

    def statistics(self, states, nll) -> dict[str, float]:
        """Every rule's statistics (a later rule's of the same name wins)."""
        return {k: v for rule in self.rules for k, v in rule.statistics(states, nll).items()}

    def check(self, states, nll) -> str | None:
        for rule in self.rules:
            reason = rule.check(states, nll)
            if reason is not None:
                return reason
        return None

    @property
    def rise_window(self) -> int:
        """The longest of the rules' windows."""
        return max(rule.rise_window for rule in self.rules)

    @property
    def accepts_rise(self) -> bool:
        """Whether any of the rules stops on a rise by design."""
        return any(rule.accepts_rise for rule in self.rules)

    def diverging(self, states, nll) -> str | None:
        """The first of the rules' reasons to call the run diverging."""
        return next((r for r in (rule.diverging(states, nll) for rule in self.rules) if r), None)


def auto_rule() -> AnyOf:
    """``stop="auto"``: a state change below 1e-4 over 10 rounds, or no gain above 1e-4 nats per
    point between the mean NLLs of two 20-round windows while the state moved less than 1e-3 over
    the last 20; a significant rise ends the run as diverging. Sized for standardised data
    (``fit``'s default transforms)."""
    return AnyOf(StateChange(tol=1e-4, window=10), NLLPlateau(patience=20, min_delta=1e-4, state_tol=1e-3))


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
