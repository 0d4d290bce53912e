"""Partitioners: how a pooled dataset is divided among clients.

The names and semantics follow Flower Datasets (``flwr_datasets.partitioner``) so that a Flower
user recognises them, but they work on plain arrays: Flower's versions need the Hugging Face
``datasets`` stack and the hub, which fedgp's users often cannot reach. Each partitioner maps a
number of rows (or a column of ids/feature values) to a list of row-index arrays, one per client.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedgp.errors import InputError
from fedgp.rng import generator

__all__ = [
    "IidPartitioner",
    "SizeSkewedPartitioner",
    "ContinuousPartitioner",
    "NaturalIdPartitioner",
    "skewed_sizes",
]


@dataclass(frozen=True)
class IidPartitioner:
    """Shuffle the rows and cut them into ``num_partitions`` near-equal parts."""

    num_partitions: int
    seed: int = 0

    def __call__(self, n: int) -> list[np.ndarray]:
        _check_count(self.num_partitions, n)
        perm = generator(self.seed, "partition-iid").permutation(n)
        return [np.sort(p) for p in np.array_split(perm, self.num_partitions)]


def skewed_sizes(
    num_partitions: int,
    min_size: int = 10,
    max_size: int = 10_000,
    distribution: str = "loguniform",
    seed: int = 0,
    pareto_shape: float = 1.0,
) -> np.ndarray:
    """Client sizes between ``min_size`` and ``max_size``: log-uniform, or Pareto (heavy tail).

    This is the unbalanced design of FGPR's Example 2 (sizes from 10 to 10,000 per device).
    """
    if not 2 <= min_size <= max_size:
        raise InputError(f"need 2 <= min_size <= max_size, got {min_size}, {max_size}")
    rng = generator(seed, "partition-sizes")
    if distribution == "loguniform":
        sizes = np.exp(rng.uniform(np.log(min_size), np.log(max_size + 1), num_partitions))
    elif distribution == "pareto":
        sizes = min_size * (1.0 + rng.pareto(pareto_shape, num_partitions))
    else:
        raise InputError(f"distribution must be 'loguniform' or 'pareto', got {distribution!r}")
    return np.clip(np.floor(sizes), min_size, max_size).astype(np.int64)


@dataclass(frozen=True)
class SizeSkewedPartitioner:
    """Random rows, but client sizes drawn log-uniform or Pareto between min and max size.

    The drawn sizes are scaled down proportionally (never below ``min_size``) when they add up
    to more rows than there are; rows left over stay unassigned and are reported by
    ``unassigned``. Nothing is duplicated.
    """

    num_partitions: int
    min_size: int = 10
    max_size: int = 10_000
    distribution: str = "loguniform"
    seed: int = 0

    def sizes(self, n: int) -> np.ndarray:
        """The clients' sizes for ``n`` rows: skewed draws, shrunk to fit ``n`` while keeping ``min_size``."""
        sizes = skewed_sizes(self.num_partitions, self.min_size, self.max_size, self.distribution, self.seed)
        if sizes.sum() > n:
            if self.min_size * self.num_partitions > n:
                raise InputError(
                    f"{n} rows cannot give {self.num_partitions} clients of at least {self.min_size}"
                )
            extra = sizes - self.min_size
            budget = n - self.min_size * self.num_partitions
            sizes = self.min_size + np.floor(extra * budget / extra.sum()).astype(np.int64)
        return sizes

    def __call__(self, n: int) -> list[np.ndarray]:
        sizes = self.sizes(n)
        perm = generator(self.seed, "partition-size-skewed").permutation(n)
        bounds = np.concatenate([[0], np.cumsum(sizes)])
        return [np.sort(perm[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]


@dataclass(frozen=True)
class ContinuousPartitioner:
    """Non-IID split by a real-valued feature, as Flower's ``ContinuousPartitioner``.

    Rows are ordered by ``strictness * z(feature) + (1 - strictness) * noise`` (both standardised)
    and cut into equal contiguous parts: strictness 0 is IID, 1 sorts clients by the feature.
    """

    num_partitions: int
    strictness: float = 1.0
    seed: int = 0

    def __call__(self, feature: Sequence[float] | np.ndarray) -> list[np.ndarray]:
        values = np.asarray(feature, dtype=np.float64)
        if values.ndim != 1:
            raise InputError(f"feature must be 1-D, got shape {values.shape}")
        if not np.isfinite(values).all():
            raise InputError("feature contains NaN or inf")
        if not 0.0 <= self.strictness <= 1.0:
            raise InputError(f"strictness must be in [0, 1], got {self.strictness}")
        _check_count(self.num_partitions, len(values))
        std = values.std()
        z = (values - values.mean()) / (std if std > 0 else 1.0)
        noise = generator(self.seed, "partition-continuous").standard_normal(len(values))
        key = self.strictness * z + (1.0 - self.strictness) * noise
        order = np.argsort(key, kind="stable")
        return [np.sort(p) for p in np.array_split(order, self.num_partitions)]


@dataclass(frozen=True)
class NaturalIdPartitioner:
    """One client per distinct id (e.g. a C-MAPSS engine unit), in order of first appearance."""

    def __call__(self, ids: Sequence[Any] | np.ndarray) -> tuple[list[Any], list[np.ndarray]]:
        ids = np.asarray(ids)
        if ids.ndim != 1:
            raise InputError(f"ids must be 1-D, got shape {ids.shape}")
        _, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
        order = np.argsort(first)
        # numpy scalars become Python values; an object column (pandas strings) holds them already
        labels = [_plain(ids[first[k]]) for k in order]
        return labels, [np.flatnonzero(inverse == k) for k in order]


def _plain(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def _check_count(num_partitions: int, n: int) -> None:
    if num_partitions < 1:
        raise InputError(f"num_partitions must be >= 1, got {num_partitions}")
    if n < 2 * num_partitions:
        raise InputError(f"{n} rows are too few for {num_partitions} clients of at least 2 points")
