"""The threshold mean: Threshold-Clustering with one centre as a robust aggregator."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from fedgp.aggregators.base import StateAggregator, check_count, check_space
from fedgp.clustering.threshold import QuantileRadius, Radius, threshold_clustering
from fedgp.errors import InputError

__all__ = ["ThresholdMean"]


@dataclass(frozen=True)
class ThresholdMean(StateAggregator):
    """Werner et al.'s TC (Algorithm 3) with K = 1 on the participants' updates: from ``start``
    (``"median"``, the coordinate-wise median, the default; ``"previous"``, the previous state,
    update 0, like centred clipping), ``iterations`` rounds of "keep the points within τ, replace
    the others by the centre, average all n". A start among the points matters for the quantile
    rule: from a point outside the cloud, equidistant points (e.g. all participants agreeing)
    fall just outside ``0.99 ×`` their own quantile and the centre never moves.

    Uniform over participants (weights p_k ignored). A point never inside the ball has no
    influence at all (it is replaced by the centre), so updates of 10⁶ leave the result where
    the honest points put it; one inside the ball moves it by at most τ/n per round.
    """

    radius: Radius = field(default_factory=lambda: QuantileRadius(0.5))
    iterations: int = 10
    start: str = "median"
    space: str = "raw"

    def __post_init__(self) -> None:
        check_space(self.space)
        check_count("ThresholdMean: iterations", self.iterations, 1)
        if self.start not in ("previous", "median"):
            raise InputError(f"ThresholdMean: start must be 'previous' or 'median', got {self.start!r}")

    def combine(self, values, weights, rng=None) -> torch.Tensor:
        if self.start == "median":
            centre = torch.quantile(values, 0.5, dim=0)
        else:
            centre = torch.zeros(values.shape[1], dtype=values.dtype)
        return threshold_clustering(values, centre.unsqueeze(0), self.iterations, self.radius).centres[0]
