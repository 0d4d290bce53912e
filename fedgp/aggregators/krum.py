"""Krum and Multi-Krum (Blanchard, El Mhamdi, Guerraoui & Stainer 2017)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedgp.aggregators.base import StateAggregator, check_count, check_space
from fedgp.errors import InputError

__all__ = ["Krum", "MultiKrum", "krum_scores"]


def krum_scores(points: torch.Tensor, f: int) -> torch.Tensor:
    """Each point's sum of squared distances to its ``n − f − 2`` nearest other points."""
    n = points.shape[0]
    k = n - f - 2
    if k < 1:
        raise InputError(f"Krum with f = {f} needs at least f + 3 = {f + 3} participants, got {n}")
    d2 = ((points.unsqueeze(0) - points.unsqueeze(1)) ** 2).sum(-1)
    d2.fill_diagonal_(float("inf"))
    return torch.sort(d2, dim=1).values[:, :k].sum(1)


@dataclass(frozen=True)
class Krum(StateAggregator):
    """The one update with the smallest Krum score (ties to the first). It ignores the weights p_k
    (a Byzantine client cannot buy influence by inflating its size). With ``n > 2f + 2`` and at most
    ``f`` arbitrary participants, every attacker farther than the honest cloud scores worse than some
    honest update, so outliers (10⁶) are never chosen and the result is an honest update."""

    f: int = 1
    space: str = "raw"

    def __post_init__(self) -> None:
        check_space(self.space)
        check_count("Krum: f", self.f, 0)

    def combine(self, values, weights, rng=None) -> torch.Tensor:
        return values[int(torch.argmin(krum_scores(values, self.f)))]


@dataclass(frozen=True)
class MultiKrum(StateAggregator):
    """The plain average of the ``m`` updates with the smallest Krum scores (``m = 1`` is Krum;
    ``m = n − f`` the default when ``m`` is None). Weights p_k are ignored, as for Krum."""

    f: int = 1
    m: int | None = None
    space: str = "raw"

    def __post_init__(self) -> None:
        check_space(self.space)
        check_count("MultiKrum: f", self.f, 0)
        if self.m is not None:
            check_count("MultiKrum: m", self.m, 1)

    def combine(self, values, weights, rng=None) -> torch.Tensor:
        n = values.shape[0]
        m = n - self.f if self.m is None else self.m
        if m > n:
            raise InputError(f"MultiKrum: m = {m} exceeds the {n} participants")
        chosen = torch.sort(krum_scores(values, self.f), stable=True).indices[:m]
        return values[chosen].mean(0)
