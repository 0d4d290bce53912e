"""The geometric median by Weiszfeld's iterations (RFA, Pillutla, Kakade & Harchaoui 2022)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedgp.aggregators.base import StateAggregator, check_count, check_space
from fedgp.errors import InputError

__all__ = ["GeometricMedian", "weiszfeld"]


def weiszfeld(points: torch.Tensor, iterations: int, smoothing: float) -> torch.Tensor:
    """``argmin_z Σ_i ‖x_i − z‖`` approximately: ``iterations`` Weiszfeld steps from the
    coordinate-wise median (a robust start, so few steps suffice), each distance floored at
    ``smoothing`` (RFA's ν) so a step never divides by zero."""
    z = torch.quantile(points, 0.5, dim=0)
    for _ in range(iterations):
        beta = 1.0 / ((points - z).norm(dim=1).clamp_min(smoothing))
        z = (beta.unsqueeze(1) * points).sum(0) / beta.sum()
    return z


@dataclass(frozen=True)
class GeometricMedian(StateAggregator):
    """The geometric median of the participants' updates (``iterations`` = T Weiszfeld steps).

    Uniform over participants: the weights p_k are ignored, because a Byzantine client can inflate
    its reported size. Breakdown point 1/2: with a fraction α < 1/2 of arbitrary updates the result
    stays within ``2(1 − α)/(1 − 2α)`` times the largest distance of an honest update from the
    honest geometric median (Minsker 2015, Lemma 2.1), whatever the attackers send.
    """

    iterations: int = 10
    smoothing: float = 1e-8
    space: str = "raw"

    def __post_init__(self) -> None:
        check_space(self.space)
        check_count("GeometricMedian: iterations", self.iterations, 1)
        if not self.smoothing > 0:
            raise InputError(f"GeometricMedian: smoothing must be > 0, got {self.smoothing}")

    def combine(self, values, weights, rng=None) -> torch.Tensor:
        return weiszfeld(values, self.iterations, self.smoothing)
