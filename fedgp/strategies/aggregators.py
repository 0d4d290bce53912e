"""How the server combines the participants' states: the hook robust aggregation plugs into.

An aggregator maps the states of a round's participants (batch ``(P, *extra)``) and their weights
to one state (batch ``extra``). Fixed (untrained) hyper-parameters are copied from the previous
state, so aggregation never perturbs them. :class:`WeightedMean` in constrained units is FGPR's
FedAvg (the paper and its code); :class:`CoordinateMedian` is the coordinate-wise median of Yin et
al. (2018), robust to a minority of arbitrary states. Both work in constrained or raw units.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from fedgp.messages import Configurable
from fedgp.models.spec import GPSpec
from fedgp.models.state import HyperState

__all__ = ["StateAggregator", "WeightedMean", "CoordinateMedian", "SPACES"]

SPACES = ("constrained", "raw")


def _check_space(space: str) -> None:
    if space not in SPACES:
        raise ValueError(f"average_space must be 'constrained' or 'raw', got {space!r}")


class StateAggregator(Configurable, ABC):
    """One state from the participants' states (first batch dimension) and weights."""

    space: str = "constrained"

    def __call__(
        self, spec: GPSpec, states: HyperState, weights: torch.Tensor, previous: HyperState
    ) -> HyperState:
        if len(weights) == 0:
            raise ValueError("cannot aggregate an empty set of states")
        _check_space(self.space)
        values = states if self.space == "constrained" else spec.to_raw(states)
        combined = HyperState(
            {p.name: self.combine(values[p.name], weights) for p in spec.params if p.trainable},
            {p.name: p.shape for p in spec.params if p.trainable},
        )
        out = {p.name: previous[p.name] for p in spec.params}
        for p in spec.params:
            if p.trainable:
                out[p.name] = (
                    combined[p.name] if self.space == "constrained" else p.transform(combined[p.name])
                )
        return HyperState(out, spec.event_shapes)

    @abstractmethod
    def combine(self, values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Combine ``values`` (``(P, *rest)``) over the first dimension."""


@dataclass(frozen=True)
class WeightedMean(StateAggregator):
    """``Σ_i w_i θ_i`` (weights need not sum to one): FedAvg."""

    space: str = "constrained"

    def __post_init__(self) -> None:
        _check_space(self.space)

    def combine(self, values, weights):
        return torch.tensordot(weights.to(torch.float64), values, dims=([0], [0]))


@dataclass(frozen=True)
class CoordinateMedian(StateAggregator):
    """The median of every coordinate over the participants, ignoring the weights (for an even
    count, the mean of the two middle values, as ``numpy.median``). Robust to fewer than half of
    the participants sending arbitrary values (Yin, Chen, Ramchandran & Bartlett 2018)."""

    space: str = "constrained"

    def __post_init__(self) -> None:
        _check_space(self.space)

    def combine(self, values, weights):
        return torch.quantile(values, 0.5, dim=0)
