"""Bucketing (Karimireddy, He & Jaggi 2022): a pre-aggregator that averages random buckets first."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from fedgp.aggregators.base import StateAggregator, check_count, check_space
from fedgp.aggregators.coordinate import CoordinateMedian
from fedgp.errors import InputError

__all__ = ["Bucketing"]


@dataclass(frozen=True)
class Bucketing(StateAggregator):
    """Shuffle the participants' updates, average them in buckets of ``size``, then apply ``inner``
    to the bucket means. Averaging shrinks the honest spread (heterogeneity) by about √size, which
    is what lets a robust ``inner`` rule tell honest from forged; at most ``f`` buckets hold an
    attacker, so ``inner`` must tolerate that many.

    The shuffle uses the round's ``rng`` when the strategy passes one (FGPR does: a function of the
    seed and round), else a generator seeded with ``seed``. Buckets are plain means: the weights
    p_k are ignored. ``inner`` works on the updates in this aggregator's ``space`` (its own
    ``space`` is not used).
    """

    size: int = 2
    inner: StateAggregator = field(default_factory=CoordinateMedian)
    seed: int = 0
    space: str = "raw"

    def __post_init__(self) -> None:
        check_space(self.space)
        check_count("Bucketing: size", self.size, 1)
        if isinstance(self.inner, Bucketing):
            raise InputError("Bucketing: the inner rule cannot itself be Bucketing")

    def combine(self, values, weights, rng=None) -> torch.Tensor:
        n = values.shape[0]
        rng = np.random.default_rng(self.seed) if rng is None else rng
        order = torch.from_numpy(rng.permutation(n))
        buckets = torch.stack([values[order[i : i + self.size]].mean(0) for i in range(0, n, self.size)])
        uniform = torch.full((len(buckets),), 1.0 / len(buckets), dtype=torch.float64)
        return self.inner.combine(buckets, uniform, rng)
