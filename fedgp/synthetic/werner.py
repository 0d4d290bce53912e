"""The settings of Werner, He, Jordan, Jaggi & Karimireddy's experiments, and the digest's GP one.

* :func:`dx_federation` — the authors' synthetic linear regression "DX(K, n_k, n, d)": cluster k
  has θ*_k ∈ R·{0, 1}^d; each of its clients draws n inputs x ~ N(k, 1)^d and noise-free targets
  y = xᵀθ*_k. With d > n no client can identify θ*_k alone. The draws follow the authors' code in
  order (one numpy generator: θ*_k, then each client's x and its zero noise, cluster by cluster,
  then the oracle start θ*_k + N(0, 0.1²) per cluster), so a seed gives the authors' data.
* :func:`bump_federation` — the digest's §7 GP experiment: K clusters of clients with y =
  φ(x)ᵀw*_k + ε, φ = Gaussian bumps, more bumps than points per client, plus optional extra
  (Byzantine) clients holding data like a randomly chosen cluster's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fedgp.data.client import ClientData, Federation
from fedgp.errors import InputError

__all__ = ["WernerDX", "dx_federation", "BumpClusters", "bump_federation"]


@dataclass(frozen=True)
class WernerDX:
    """``federation`` (client ids 0..N−1, cluster by cluster), ``labels`` ``(N,)``, ``thetas``
    ``(K, d)`` the cluster optima, ``start`` ``(K, d)`` the authors' oracle start θ*_k + N(0, 0.1²)."""

    federation: Federation
    labels: torch.Tensor
    thetas: torch.Tensor
    start: torch.Tensor


def dx_federation(
    clusters: int = 4,
    clients_per_cluster: int = 16,
    n: int = 9,
    d: int = 10,
    scale: float = 100.0,
    start_noise: float = 0.1,
    seed: int = 0,
) -> WernerDX:
    """The authors' ``DX(K, n_k, n, d)`` (R = ``scale``), with their oracle start."""
    if min(clusters, clients_per_cluster, n, d) < 1 or n < 2:
        raise InputError("dx_federation: clusters, clients_per_cluster, d must be >= 1 and n >= 2")
    rng = np.random.default_rng(seed)
    clients, labels, thetas = [], [], []
    for k in range(clusters):
        theta = rng.integers(low=0, high=2, size=d) * scale
        thetas.append(theta)
        for _ in range(clients_per_cluster):
            x = rng.normal(loc=k, scale=1.0, size=(n, d))
            eps = rng.normal(loc=0.0, scale=0.0, size=(n,))  # σ² = 0, drawn as the authors' code does
            y = x @ theta + eps
            clients.append(ClientData(torch.from_numpy(x), torch.from_numpy(y), id=len(clients)))
            labels.append(k)
    thetas = np.stack(thetas)
    start = thetas + rng.normal(loc=0.0, scale=start_noise, size=thetas.shape)
    return WernerDX(
        Federation(clients), torch.tensor(labels), torch.from_numpy(thetas).double(), torch.from_numpy(start)
    )


@dataclass(frozen=True)
class BumpClusters:
    """``federation`` (honest clients cluster by cluster, then the extra ones), ``labels`` ``(N,)``
    (-1 for the extra clients), ``weights`` ``(K, F)`` the true w*_k, the bump ``centres`` and
    ``width``, and ``extra`` the ids of the extra clients."""

    federation: Federation
    labels: torch.Tensor
    weights: torch.Tensor
    centres: torch.Tensor
    width: float
    extra: tuple


def bump_federation(
    clusters: int = 4,
    clients_per_cluster: int = 8,
    n: int = 5,
    n_test: int = 100,
    features: int = 8,
    width: float = 0.8,
    weight_scale: float = 1.5,
    noise: float = 0.01,
    domain: tuple[float, float] = (-3.0, 3.0),
    extra: int = 0,
    seed: int = 0,
) -> BumpClusters:
    """The digest's §7 setting: w*_k ~ N(0, weight_scale² I_F), x ~ U(domain), y = φ(x)ᵀw*_k + ε
    with ε ~ N(0, noise) (a variance), φ_j(x) = exp(−(x − c_j)²/(2 width²)), c = linspace(domain, F).
    ``extra`` more clients (the Byzantine ones) hold data of a uniformly drawn cluster."""
    if min(clusters, clients_per_cluster, features) < 1 or n < 2 or extra < 0:
        raise InputError("bump_federation: clusters, clients_per_cluster, features >= 1, n >= 2, extra >= 0")
    if not noise > 0:
        raise InputError(f"bump_federation: noise must be a variance > 0, got {noise}")
    gen = torch.Generator().manual_seed(int(seed))
    centres = torch.linspace(domain[0], domain[1], features, dtype=torch.float64)
    weights = weight_scale * torch.randn(clusters, features, generator=gen, dtype=torch.float64)

    def draw(k: int, cid) -> ClientData:
        X = domain[0] + (domain[1] - domain[0]) * torch.rand(
            n + n_test, 1, generator=gen, dtype=torch.float64
        )
        phi = torch.exp(-((X - centres) ** 2) / (2 * width**2))
        y = phi @ weights[k] + noise**0.5 * torch.randn(n + n_test, generator=gen, dtype=torch.float64)
        test = {"X_test": X[n:], "y_test": y[n:]} if n_test else {}
        return ClientData(X[:n], y[:n], id=cid, **test)

    clients, labels = [], []
    for k in range(clusters):
        for _ in range(clients_per_cluster):
            clients.append(draw(k, len(clients)))
            labels.append(k)
    ids = []
    for _ in range(extra):
        k = int(torch.randint(clusters, (1,), generator=gen))
        ids.append(len(clients))
        clients.append(draw(k, len(clients)))
        labels.append(-1)
    return BumpClusters(Federation(clients), torch.tensor(labels), weights, centres, width, tuple(ids))
