"""k-means (Lloyd) with k-means++ seeding: Myopic-Clustering's clustering step, Momentum-Clustering's
first centres, and the 1-D clustering of distances in the "cd" radius rule."""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["kmeans_plus_plus", "kmeans"]


def _check(points: torch.Tensor, k: int) -> torch.Tensor:
    points = torch.as_tensor(points, dtype=torch.float64)
    if points.dim() != 2 or points.shape[0] == 0:
        raise ValueError(f"k-means needs points of shape (N, P) with N >= 1, got {tuple(points.shape)}")
    if not bool(torch.isfinite(points).all()):
        raise ValueError("k-means: the points contain NaN or inf")
    if not 1 <= k <= points.shape[0]:
        raise ValueError(f"k-means: k must be in [1, {points.shape[0]}] (the number of points), got {k}")
    return points


def kmeans_plus_plus(points: torch.Tensor, k: int, rng: np.random.Generator) -> torch.Tensor:
    """Indices of ``k`` distinct seed points (Arthur & Vassilvitskii 2007): the first uniformly,
    each next one with probability ∝ its squared distance to the nearest seed so far (uniformly
    among the unchosen when every distance is zero)."""
    points = _check(points, k)
    n = points.shape[0]
    chosen = [int(rng.integers(n))]
    nearest = ((points - points[chosen[0]]) ** 2).sum(-1)
    for _ in range(1, k):
        weights = nearest.numpy().copy()
        weights[chosen] = 0.0
        total = weights.sum()
        if total > 0:
            pick = int(rng.choice(n, p=weights / total))
        else:
            pick = int(rng.choice(np.setdiff1d(np.arange(n), chosen)))
        chosen.append(pick)
        nearest = torch.minimum(nearest, ((points - points[pick]) ** 2).sum(-1))
    return torch.tensor(chosen, dtype=torch.long)


def assign(points: torch.Tensor, centres: torch.Tensor) -> torch.Tensor:
    """The nearest centre of each point (ties to the lower index)."""
    distances = ((points[:, None, :] - centres[None, :, :]) ** 2).sum(-1)
    return distances.argmin(dim=1)


def kmeans(
    points: torch.Tensor,
    k: int,
    rng: np.random.Generator | None = None,
    init: torch.Tensor | None = None,
    iterations: int = 100,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Lloyd's algorithm from ``init`` centres (``(k, P)``) or k-means++ seeds drawn with ``rng``.

    Returns ``(centres (k, P), labels (N,))``; it stops when no label changes. A centre that loses
    all its points keeps its place.
    """
    points = _check(points, k)
    if init is None:
        if rng is None:
            raise ValueError("k-means needs initial centres or an rng for k-means++ seeding")
        centres = points[kmeans_plus_plus(points, k, rng)].clone()
    else:
        centres = torch.as_tensor(init, dtype=torch.float64).clone()
        if centres.shape != (k, points.shape[1]):
            raise ValueError(
                f"k-means: init has shape {tuple(centres.shape)}, expected ({k}, {points.shape[1]})"
            )
    labels = assign(points, centres)
    for _ in range(iterations):
        for j in range(k):
            members = labels == j
            if bool(members.any()):
                centres[j] = points[members].mean(0)
        new = assign(points, centres)
        if torch.equal(new, labels):
            break
        labels = new
    return centres, labels
