"""Coordinate-wise robust rules (Yin, Chen, Ramchandran & Bartlett 2018): median and trimmed mean."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedgp.aggregators.base import StateAggregator, check_count, check_space
from fedgp.errors import InputError

__all__ = ["CoordinateMedian", "TrimmedMean"]


@dataclass(frozen=True)
class CoordinateMedian(StateAggregator):
    """The median of every coordinate over the participants (for an even count, the mean of the two
    middle values, as ``numpy.median``). It ignores the weights p_k, so inflating one's reported
    size buys nothing. With fewer than half the participants arbitrary, each coordinate stays within
    the range of the honest values."""

    space: str = "raw"
    coordinatewise = True

    def __post_init__(self) -> None:
        check_space(self.space)

    def combine(self, values, weights, rng=None) -> torch.Tensor:
        return torch.quantile(values, 0.5, dim=0)


@dataclass(frozen=True)
class TrimmedMean(StateAggregator):
    """Per coordinate, drop the ``f`` largest and ``f`` smallest values and average the rest
    (uniformly: the weights p_k are ignored, so a Byzantine client cannot buy influence by
    inflating its size). With at most ``f`` arbitrary participants every coordinate stays within
    the range of the honest values. Needs more than ``2f`` participants."""

    f: int = 1
    space: str = "raw"
    coordinatewise = True

    def __post_init__(self) -> None:
        check_space(self.space)
        check_count("TrimmedMean: f", self.f, 0)

    def combine(self, values, weights, rng=None) -> torch.Tensor:
        n = values.shape[0]
        if n <= 2 * self.f:
            raise InputError(f"TrimmedMean(f={self.f}) needs more than {2 * self.f} participants, got {n}")
        ordered = torch.sort(values, dim=0).values
        return ordered[self.f : n - self.f].mean(0)
