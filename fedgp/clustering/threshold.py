"""Threshold-Clustering (TC; Werner, He, Jordan, Jaggi & Karimireddy, Algorithm 3).

From a start ``v``, take the ball of radius τ around it: points inside keep their value, points
outside are replaced by ``v``, and ``v`` becomes the average of all N values (eq. 24)::

    v ← (1/N) Σ_i [ z_i · 1(‖z_i − v‖ ≤ τ) + v · 1(‖z_i − v‖ > τ) ]  =  v + (|S|/N)(mean_S z − v)

The denominator counts *every* point, not just those inside: each step moves ``v`` only the
fraction |S|/N of the way to the inside mean, which makes TC conservative and keeps points far
away (another cluster, or a Byzantine client) from ever pulling it. A fixed point is the mean of
the points inside its own ball. The K centres are processed independently.

Radius rules (recomputed at every inner iteration, from the distances to the current centre):
:class:`FixedRadius` (τ), :class:`QuantileRadius` (``scale ×`` the q-quantile of the distances:
the authors' MNIST code, ``0.99 × sorted(d)[int(N q)]``; the experiments' rule) and
:class:`KMeansRadius` (the code's "cd" rule: 1-D k-means with 3 centres on the distances,
τ = (c₂ + c₃)/2; the digest's prototype found it spans several clusters and behaves like FedAvg,
so it is offered for comparison, never as a default).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from fedgp.clustering.kmeans import lloyd
from fedgp.errors import InputError
from fedgp.messages import Configurable

__all__ = [
    "Radius",
    "FixedRadius",
    "QuantileRadius",
    "KMeansRadius",
    "ThresholdResult",
    "threshold_clustering",
]


class Radius(Configurable, ABC):
    """A radius rule: τ for each centre from its distances to the points."""

    @abstractmethod
    def __call__(self, distances: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """τ of shape ``(R,)`` from ``distances`` ``(R, N)``; only entries where ``mask`` is true count."""


@dataclass(frozen=True)
class FixedRadius(Radius):
    """A fixed τ (the theory's τ ≈ sqrt(δ σ Δ)). ``math.inf`` (stored as ``"inf"``, so the config
    stays valid JSON) puts every point inside: TC is then the plain mean after one iteration."""

    tau: float | str

    def __post_init__(self) -> None:
        tau = self.tau
        if tau == "inf" or (isinstance(tau, float) and math.isinf(tau) and tau > 0):
            object.__setattr__(self, "tau", "inf")
        elif isinstance(tau, bool) or not isinstance(tau, (int, float)) or not tau >= 0:
            raise InputError(f"FixedRadius: tau must be a number >= 0 or math.inf, got {tau!r}")

    def __call__(self, distances, mask):
        return torch.full(distances.shape[:1], float(self.tau), dtype=torch.float64)


@dataclass(frozen=True)
class QuantileRadius(Radius):
    """τ = ``scale`` × the ``q``-quantile of the distances: ``sorted(d)[int(n q)]`` over the n
    points (clipped to the largest), as the authors' code. With ``scale < 1`` the point at the
    quantile itself falls outside, so the ball holds about ``q n`` points.

    Choose q below the smallest cluster's share of *all* participants, Byzantine ones included
    (digest §5.1); the experiments use 0.1–0.25.
    """

    q: float = 0.2
    scale: float = 0.99

    def __post_init__(self) -> None:
        if not 0.0 <= self.q <= 1.0:
            raise InputError(f"QuantileRadius: q must be in [0, 1], got {self.q}")
        if not self.scale > 0:
            raise InputError(f"QuantileRadius: scale must be > 0, got {self.scale}")

    def __call__(self, distances, mask):
        n = mask.sum(-1)
        ordered = torch.sort(distances.masked_fill(~mask, math.inf), dim=-1).values
        index = torch.minimum((n.to(torch.float64) * self.q).floor().to(torch.long), n - 1)
        return ordered.gather(-1, index.clamp_min(0).unsqueeze(-1)).squeeze(-1) * self.scale


@dataclass(frozen=True)
class KMeansRadius(Radius):
    """The authors' "cd" rule: 1-D k-means (``clusters`` = 3) on the distances, τ = the midpoint of
    the 2nd and 3rd smallest centres. Lloyd's iterations start from the minimum, median and maximum
    distance (deterministic; the authors' sklearn call seeds randomly). With fewer distinct
    distances than ``clusters`` the rule cannot split them and τ is the largest distance."""

    clusters: int = 3

    def __post_init__(self) -> None:
        if self.clusters < 2:
            raise InputError(f"KMeansRadius: clusters must be >= 2, got {self.clusters}")

    def __call__(self, distances, mask):
        out = torch.empty(distances.shape[0], dtype=torch.float64)
        for r in range(distances.shape[0]):
            d = distances[r][mask[r]]
            distinct = torch.unique(d)
            if len(distinct) < self.clusters:
                out[r] = d.max()
                continue
            start = torch.quantile(d, torch.linspace(0, 1, self.clusters, dtype=torch.float64))
            centres, _ = lloyd(d.unsqueeze(1), start.unsqueeze(1))
            c = torch.sort(torch.from_numpy(centres).flatten()).values
            out[r] = (c[1] + c[2]) / 2
        return out


@dataclass(frozen=True)
class ThresholdResult:
    """TC's output: the centres and which points were inside each ball at the last iteration."""

    centres: torch.Tensor  # (..., K, P)
    inside: torch.Tensor  # (..., K, N) bool


def threshold_clustering(
    points: torch.Tensor,
    centres: torch.Tensor,
    iterations: int = 10,
    radius: Radius | None = None,
    mask: torch.Tensor | None = None,
) -> ThresholdResult:
    """Run TC (Algorithm 3) on ``points`` from ``centres``.

    Args:
        points: ``(N, P)``, or ``(B, N, P)`` for B independent problems at once.
        centres: the start of each centre, ``(K, P)`` or ``(B, K, P)``.
        iterations: M, the inner rounds.
        radius: the radius rule (default :class:`QuantileRadius` with q = 0.2, scale 0.99).
        mask: ``(N,)`` or ``(B, N)`` bool, the points that exist (padding is False). The
            denominator N counts every point of the mask, inside the ball or not.
    """
    radius = QuantileRadius() if radius is None else radius
    if not isinstance(iterations, int) or iterations < 1:
        raise InputError(f"threshold_clustering: iterations must be an int >= 1, got {iterations!r}")
    points = torch.as_tensor(points, dtype=torch.float64)
    centres = torch.as_tensor(centres, dtype=torch.float64)
    single = points.dim() == 2
    if single:
        points, centres = points.unsqueeze(0), centres.unsqueeze(0)
        mask = None if mask is None else torch.as_tensor(mask).unsqueeze(0)
    if points.dim() != 3 or centres.dim() != 3:
        raise InputError(
            f"threshold_clustering: points must be (N, P) or (B, N, P) and centres (K, P) or (B, K, P); "
            f"got {tuple(points.shape)} and {tuple(centres.shape)}"
        )
    B, N, P = points.shape
    if centres.shape[0] != B or centres.shape[2] != P:
        raise InputError(
            f"threshold_clustering: centres {tuple(centres.shape)} do not match points {tuple(points.shape)}"
        )
    mask = torch.ones(B, N, dtype=torch.bool) if mask is None else torch.as_tensor(mask, dtype=torch.bool)
    if mask.shape != (B, N):
        raise InputError(f"threshold_clustering: mask has shape {tuple(mask.shape)}, expected {(B, N)}")
    count = mask.sum(-1)
    if bool((count == 0).any()):
        raise InputError("threshold_clustering: a problem has no points (its mask is all False)")
    if not bool(torch.isfinite(points[mask]).all()) or not bool(torch.isfinite(centres).all()):
        raise InputError("threshold_clustering: points or centres contain NaN or inf")
    K = centres.shape[1]
    v = centres.clone()
    rows_mask = mask.unsqueeze(1).expand(B, K, N)
    denominator = count.to(torch.float64).reshape(B, 1, 1)
    for _ in range(iterations):
        diff = points.unsqueeze(1) - v.unsqueeze(2)  # (B, K, N, P)
        distances = (diff**2).sum(-1).sqrt()
        tau = radius(distances.reshape(B * K, N), rows_mask.reshape(B * K, N)).reshape(B, K)
        inside = (distances <= tau.unsqueeze(-1)) & rows_mask
        # v + (1/N) Σ_inside (z − v): the outside points, replaced by v, add nothing
        v = v + torch.einsum("bkn,bknp->bkp", inside.to(torch.float64), diff) / denominator
    if single:
        return ThresholdResult(v[0], inside[0])
    return ThresholdResult(v, inside)
