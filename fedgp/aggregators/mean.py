"""The weighted mean: FedAvg, and the one rule with no robustness at all (breakdown point 0)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedgp.aggregators.base import StateAggregator, check_space

__all__ = ["WeightedMean"]


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
