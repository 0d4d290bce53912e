"""Federations drawn from a mixture of models: clients of k clusters, with the truth kept.

* :func:`gaussian_mixed_regression` — Su, Xu & Yang's mixed linear regression: θ*_j ~ scale · N(0, I_d),
  x ~ N(0, I_d), y = ⟨x, θ*_{z_i}⟩ + σ ε, client labels z_i drawn i.i.d. with probabilities p (or
  optional random effects θ_i = θ*_{z_i} + τ N(0, I) — within-cluster variation).
* :func:`su_xu_yang_setting` — their settings C.1–C.3 (k = 3, d = 100, σ = 0.2).
* :func:`gp_mixture_federation` — clients drawn from one of several GP priors (clustered FGPR).

:func:`fedgp.synthetic.mixed_linear_regression` is the IFCA paper's variant (Bernoulli θ*, contiguous
cluster blocks).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from fedgp.data.client import ClientData, Federation
from fedgp.errors import InputError
from fedgp.models.spec import GPSpec
from fedgp.models.state import HyperState
from fedgp.synthetic.draws import GPDraws, MixedRegression, gp_federation

__all__ = [
    "gaussian_mixed_regression",
    "su_xu_yang_setting",
    "SU_XU_YANG_SETTINGS",
    "GPMixture",
    "gp_mixture_federation",
]

#: The three settings of Su, Xu & Yang's Appendix C (N = 10,000 each; the paper's "N = 1000" is a typo).
SU_XU_YANG_SETTINGS: dict[str, dict] = {
    "C1": {"sizes": [50] * 200, "shares": (1 / 3, 1 / 3, 1 / 3)},
    "C2": {"sizes": [10] * 900 + [50] * 20, "shares": (1 / 3, 1 / 3, 1 / 3)},
    "C3": {"sizes": [10] * 900 + [50] * 20, "shares": (0.2, 0.3, 0.5)},
}


def gaussian_mixed_regression(
    k: int = 3,
    d: int = 100,
    sizes: Sequence[int] = (50,) * 200,
    shares: Sequence[float] | None = None,
    noise: float = 0.2,
    theta_scale: float | None = None,
    labels: str = "iid",
    random_effect: float = 0.0,
    n_test: int = 0,
    seed: int = 0,
) -> MixedRegression:
    """Mixed linear regression with Gaussian cluster models (Su, Xu & Yang's experiments).

    ``theta_scale`` defaults to ``2/√d`` (so ‖θ*_j‖ ≈ 2). ``labels="iid"`` draws each client's
    cluster with probabilities ``shares`` (the paper's model); ``"balanced"`` deals the clients out
    in exact proportions in random order; ``"data_shares"`` makes ``shares`` the clusters' shares of
    the *data* (with unequal client sizes the client counts then differ): clients, in random order,
    each join the cluster furthest below its target number of points. ``random_effect = τ > 0``
    gives each client its own θ_i = θ*_z + τ N(0, I_d) (within-cluster heterogeneity, the
    linear-kernel GP's model).
    """
    sizes = [int(s) for s in sizes]
    m = len(sizes)
    if k < 1 or d < 1 or m < 1:
        raise InputError(f"need k, d and the number of clients >= 1, got k={k}, d={d}, clients={m}")
    if any(s < 2 for s in sizes):
        raise InputError(f"every client needs at least 2 points; sizes include {min(sizes)}")
    shares = np.full(k, 1.0 / k) if shares is None else np.asarray(shares, dtype=np.float64)
    if len(shares) != k or not np.isclose(shares.sum(), 1.0) or (shares < 0).any():
        raise InputError(f"shares must be {k} non-negative fractions summing to 1, got {shares}")
    if noise < 0 or random_effect < 0:
        raise InputError("noise and random_effect must be >= 0")
    rng = np.random.default_rng(seed)
    scale = 2.0 / np.sqrt(d) if theta_scale is None else float(theta_scale)
    thetas = scale * rng.standard_normal((k, d))
    if labels == "iid":
        z = rng.choice(k, size=m, p=shares)
    elif labels == "balanced":
        counts = np.floor(shares * m).astype(int)
        counts[np.argsort(-(shares * m - counts))[: m - counts.sum()]] += 1
        z = rng.permutation(np.repeat(np.arange(k), counts))
    elif labels == "data_shares":
        z = np.empty(m, dtype=np.int64)
        target, held = shares * float(sum(sizes)), np.zeros(k)
        for i in rng.permutation(m):
            z[i] = int(np.argmax(target - held))
            held[z[i]] += sizes[i]
    else:
        raise InputError(f"labels must be 'iid', 'balanced' or 'data_shares', got {labels!r}")
    clients = []
    for i, n in enumerate(sizes):
        theta_i = thetas[z[i]] + (random_effect * rng.standard_normal(d) if random_effect else 0.0)
        X = rng.standard_normal((n + n_test, d))
        y = X @ theta_i + noise * rng.standard_normal(n + n_test)
        test = dict(X_test=X[n:], y_test=y[n:]) if n_test else {}
        clients.append(ClientData(X[:n], y[:n], id=i, metadata={"cluster": int(z[i])}, **test))
    return MixedRegression(Federation(clients), torch.from_numpy(thetas), torch.from_numpy(z), noise)


def su_xu_yang_setting(name: str, seed: int = 0, n_test: int = 0) -> MixedRegression:
    """Setting ``"C1"`` (200 × 50 points, balanced clusters), ``"C2"`` (900 × 10 + 20 × 50) or
    ``"C3"`` (as C2, cluster shares 0.2/0.3/0.5): k = 3, d = 100, σ = 0.2, θ*_j ~ (2/√d) N(0, I)."""
    try:
        cfg = SU_XU_YANG_SETTINGS[name.upper()]
    except KeyError:
        raise InputError(
            f"unknown setting {name!r}; choose one of {', '.join(SU_XU_YANG_SETTINGS)}"
        ) from None
    return gaussian_mixed_regression(
        k=3, d=100, sizes=cfg["sizes"], shares=cfg["shares"], noise=0.2, n_test=n_test, seed=seed
    )


@dataclass(frozen=True)
class GPMixture:
    """Clients drawn from several GP priors: the federation, the spec, each population's true state
    (batch ``(k,)``) and each client's population."""

    federation: Federation
    spec: GPSpec
    truth: HyperState
    labels: torch.Tensor


def gp_mixture_federation(
    populations: Sequence[Mapping[str, object]],
    clients_per_population: int | Sequence[int] = 8,
    n: int = 60,
    d: int = 1,
    kernel: str = "rbf",
    n_test: int = 0,
    seed: int = 0,
) -> GPMixture:
    """Clients of several GP populations: population j's clients are independent draws from
    GP(0, k_θj) (see :func:`~fedgp.synthetic.gp_federation`), θj given in constrained units by state name
    (missing entries drawn as in FGPR's Example 1). Clients are interleaved in random order and carry
    ``metadata["cluster"]``."""
    if not populations:
        raise InputError("give at least one population")
    counts = (
        [int(clients_per_population)] * len(populations)
        if np.isscalar(clients_per_population)
        else [int(c) for c in clients_per_population]
    )
    if len(counts) != len(populations):
        raise InputError(f"{len(counts)} client counts for {len(populations)} populations")
    draws: list[GPDraws] = []
    clients, labels = [], []
    for j, (theta, count) in enumerate(zip(populations, counts)):
        g = gp_federation(
            num_clients=count, n=n, d=d, kernel=kernel, theta=dict(theta), n_test=n_test, seed=seed * 1000 + j
        )
        draws.append(g)
        for c in g.federation:
            clients.append(replace(c, id=f"p{j}-{c.id}", metadata={"cluster": j}))
            labels.append(j)
    order = np.random.default_rng(seed).permutation(len(clients))
    federation = Federation([clients[i] for i in order])
    truth = HyperState.stack([g.truth for g in draws])
    return GPMixture(federation, draws[0].spec, truth, torch.tensor(labels)[torch.from_numpy(order)])
