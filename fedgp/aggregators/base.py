"""How the server combines the participants' states: the hook robust aggregation plugs into.

An aggregator maps the states of a round's participants (batch ``(P,)``), their weights and the
previous state to one state. Fixed (untrained) hyper-parameters are copied from the previous state,
so aggregation never perturbs them.

Two kinds of rules share one interface, :meth:`StateAggregator.combine`, over a matrix of P rows:

* *coordinate-wise* rules (:class:`~fedgp.aggregators.WeightedMean`, ``CoordinateMedian``,
  ``TrimmedMean``) are translation-equivariant coordinate by coordinate, so they act on the values
  themselves, parameter by parameter (FedAvg's arithmetic is exactly the paper's);
* *vector* rules (geometric median, Krum, centred clipping, threshold mean, bucketing) see each
  participant's **update** ``u_i = θ_i − θ_prev``, flattened over every trained hyper-parameter into
  one vector, and return ``θ_prev + rule(u)``. Updates are taken in ``space``: ``"raw"`` (GPyTorch's
  unconstrained parameters, the default of every robust rule: a forged update can never make a
  variance negative) or ``"constrained"``.

:class:`WeightedMean` (FedAvg) lives here, beside the interface, because it is the rule the
interface defaults to and the one every robust rule is measured against; each robust rule has a
module of its own.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np
import torch

from fedgp.errors import InputError
from fedgp.messages import Configurable
from fedgp.models.spec import GPSpec
from fedgp.models.state import HyperState

__all__ = ["StateAggregator", "WeightedMean", "SPACES", "check_space", "check_count"]

#: Where a rule may average: GPyTorch's constrained values (FedAvg's default) or the raw parameters.
SPACES = ("constrained", "raw")


def check_space(space: str) -> None:
    """Refuse an ``average_space`` other than ``"constrained"`` or ``"raw"`` with a ``ValueError``."""
    if space not in SPACES:
        raise InputError(f"average_space must be 'constrained' or 'raw', got {space!r}")


def check_count(name: str, value, minimum: int) -> None:
    """Refuse a count that is not an ``int`` of at least ``minimum`` (a ``bool`` is refused too), naming the
    setting."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InputError(f"{name} must be an int >= {minimum}, got {value!r}")


class StateAggregator(Configurable, ABC):
    """One state from the participants' states (first batch dimension), weights and the previous state."""

    space: str = "raw"
    #: True for rules that act coordinate by coordinate on values (no flattening, no centring).
    coordinatewise: bool = False

    def __call__(
        self,
        spec: GPSpec,
        states: HyperState,
        weights: torch.Tensor,
        previous: HyperState,
        rng: np.random.Generator | None = None,
    ) -> HyperState:
        """Combine ``states`` (batch ``(P,)``) with ``weights`` ``(P,)``; ``rng`` drives randomised
        rules (bucketing), which otherwise use their own seed."""
        if len(weights) == 0:
            raise InputError(f"{type(self).__name__}: cannot aggregate an empty set of states")
        if tuple(states.batch_shape[:1]) != (len(weights),):
            raise InputError(
                f"{type(self).__name__}: {tuple(states.batch_shape)} states for {len(weights)} weights"
            )
        check_space(self.space)
        trained = [p for p in spec.params if p.trainable]
        values = states if self.space == "constrained" else spec.to_raw(states)
        centre = previous if self.space == "constrained" else spec.to_raw(previous)
        weights = weights.to(torch.float64)
        if self.coordinatewise:
            combined = {p.name: self.combine(values[p.name], weights, rng) for p in trained}
        else:
            combined = self._vector(values, centre, trained, weights, rng)
        out = {p.name: previous[p.name] for p in spec.params}
        for p in trained:
            out[p.name] = combined[p.name] if self.space == "constrained" else p.transform(combined[p.name])
        return HyperState(out, spec.event_shapes)

    def _vector(self, values, centre, trained, weights, rng) -> dict[str, torch.Tensor]:
        if len(values.batch_shape) != 1:
            raise InputError(
                f"{type(self).__name__} combines one state per participant, "
                f"got batch {tuple(values.batch_shape)}"
            )
        P = len(weights)
        if not trained:
            return {}
        updates = torch.cat([(values[p.name] - centre[p.name]).reshape(P, -1) for p in trained], dim=1)
        step = self.combine(updates, weights, rng)
        out, start = {}, 0
        for p in trained:
            size = int(torch.Size(p.shape).numel())
            out[p.name] = centre[p.name] + step[start : start + size].reshape(p.shape)
            start += size
        return out

    @abstractmethod
    def combine(
        self, values: torch.Tensor, weights: torch.Tensor, rng: np.random.Generator | None = None
    ) -> torch.Tensor:
        """Combine ``values`` (``(P, *rest)``: updates ``(P, D)`` for vector rules) over the first
        dimension."""


@dataclass(frozen=True)
class WeightedMean(StateAggregator):
    """``Σ_i w_i θ_i`` (weights need not sum to one): FedAvg, in constrained units by default as
    in the FGPR paper and its code. It uses the weights p_k as given, so a client that inflates its
    reported size, or sends one value of 10⁶, moves the result as far as it likes."""

    space: str = "constrained"
    coordinatewise = True

    def __post_init__(self) -> None:
        check_space(self.space)

    def combine(self, values, weights, rng=None) -> torch.Tensor:
        return torch.tensordot(weights.to(values.dtype), values, dims=([0], [0]))
