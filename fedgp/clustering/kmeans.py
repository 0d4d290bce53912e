"""k-means (Lloyd) with k-means++ seeding and restarts: one-shot clustering's server step,
Myopic-Clustering's clustering, Momentum-Clustering's first centres, and the 1-D clustering of
distances in Threshold-Clustering's "cd" radius rule. Points are numpy arrays or tensors."""

from __future__ import annotations

import numpy as np
import torch

from fedgp.errors import InputError

__all__ = ["kmeans_plus_plus", "lloyd", "kmeans", "assign"]


def _array(points) -> np.ndarray:
    points = points.numpy() if isinstance(points, torch.Tensor) else np.asarray(points)
    points = np.asarray(points, dtype=np.float64)
    if points.ndim != 2 or len(points) == 0:
        raise InputError(f"k-means needs points of shape (N, P) with N >= 1, got {points.shape}")
    if not np.isfinite(points).all():
        raise InputError("k-means: the points contain NaN or inf")
    return points


def kmeans_plus_plus(points, k: int, rng: np.random.Generator) -> np.ndarray:
    """Indices of ``k`` seeds (Arthur & Vassilvitskii 2007): the first uniformly, each next with
    probability ∝ its squared distance to the nearest seed so far (uniformly when all are zero)."""
    points = _array(points)
    n = len(points)
    if not 1 <= k <= n:
        raise InputError(f"k-means: k must be in [1, {n}] (the number of points), got {k}")
    chosen = [int(rng.integers(n))]
    for _ in range(1, k):
        d2 = np.min(((points[:, None, :] - points[chosen][None]) ** 2).sum(-1), axis=1)
        total = d2.sum()
        chosen.append(int(rng.choice(n, p=d2 / total) if total > 0 else rng.integers(n)))
    return np.asarray(chosen, dtype=np.int64)


def lloyd(points, centres, iterations: int = 100) -> tuple[np.ndarray, np.ndarray]:
    """Lloyd's iterations from ``centres`` until no label changes; an empty cluster is reseeded at
    the point farthest from its centre. Returns ``(centres (k, P), labels (N,))``."""
    points, c = _array(points), _array(centres).copy()
    n, k = len(points), len(c)
    labels = np.zeros(n, dtype=np.int64)
    for it in range(iterations):
        d2 = ((points[:, None, :] - c[None]) ** 2).sum(-1)
        new = d2.argmin(1)
        for j in range(k):
            if not (new == j).any():
                far = int(d2[np.arange(n), new].argmax())
                new[far] = j
        if it and np.array_equal(new, labels):
            break
        labels = new
        c = np.stack([points[labels == j].mean(0) for j in range(k)])
    return c, labels


def kmeans(
    points, k: int, rng: np.random.Generator, restarts: int = 10, iterations: int = 100
) -> tuple[np.ndarray, np.ndarray]:
    """Lloyd's k-means with k-means++ seeding and ``restarts``; the restart with the lowest
    within-cluster sum of squares wins. Returns ``(centres (k, P), labels (N,))`` as numpy arrays."""
    points = _array(points)
    if len(points) < k:
        raise InputError(f"k-means needs at least k = {k} points, got {len(points)}")
    best = None
    for _ in range(restarts):
        c, labels = lloyd(points, points[kmeans_plus_plus(points, k, rng)], iterations)
        inertia = float(((points - c[labels]) ** 2).sum())
        if best is None or inertia < best[0]:
            best = (inertia, c, labels.copy())
    return best[1], best[2]


def assign(points: torch.Tensor, centres: torch.Tensor) -> torch.Tensor:
    """The nearest centre of each point (ties to the lower index)."""
    return ((points[:, None, :] - centres[None, :, :]) ** 2).sum(-1).argmin(dim=1)
