"""Synthetic federations with known ground truth.

* :func:`gp_federation` — each client holds an independent draw from one GP prior with known
  hyper-parameters θ* (FGPR §4, Examples 1–2), balanced or unbalanced.
* :func:`sin_personalisation` — two clients, y = sin x and y = −sin x (FGPR Fig. 1): no single
  global function fits both, one shared prior conditioned locally fits each.
* :func:`mixed_linear_regression` — k clusters of linear regressions (IFCA §6.1, Su–Xu–Yang).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import gpytorch
import numpy as np
import torch

from fedgp.data.client import ClientData, Federation
from fedgp.errors import InputError
from fedgp.models.spec import GPSpec
from fedgp.models.state import HyperState

__all__ = [
    "GPDraws",
    "gp_spec",
    "example1_theta",
    "gp_federation",
    "sin_personalisation",
    "MixedRegression",
    "mixed_linear_regression",
]


def gp_spec(d: int, kernel: str = "rbf", ard: bool = True) -> GPSpec:
    """``ScaleKernel(RBF or Matérn-ν)`` with ARD over ``d`` inputs, zero mean, Gaussian noise."""
    ard_dims = d if ard else None
    if kernel == "rbf":
        base = gpytorch.kernels.RBFKernel(ard_num_dims=ard_dims)
    elif kernel in ("matern12", "matern32", "matern52"):
        base = gpytorch.kernels.MaternKernel(
            nu={"matern12": 0.5, "matern32": 1.5, "matern52": 2.5}[kernel], ard_num_dims=ard_dims
        )
    else:
        raise InputError(f"kernel must be 'rbf', 'matern12', 'matern32' or 'matern52', got {kernel!r}")
    return GPSpec(kernel=gpytorch.kernels.ScaleKernel(base))


def example1_theta(d: int, rng: np.random.Generator, min_lengthscale: float = 0.01) -> dict[str, np.ndarray]:
    """θ* drawn as in FGPR Example 1: outputscale ∈ [0.1, 10], noise ∈ [0.01, 1], ℓ ∈ [0.01, 1]^d.

    The paper's θ1, θ2 are read as variances, as in its proofs and code. ``min_lengthscale``
    can raise the lower lengthscale bound: ℓ ≈ 0.01 in 1-D is barely identifiable (digest §6.10).
    """
    return {
        "covar_module.outputscale": rng.uniform(0.1, 10.0),
        "likelihood.noise_covar.noise": rng.uniform(0.01, 1.0),
        "covar_module.base_kernel.lengthscale": rng.uniform(min_lengthscale, 1.0, size=(1, d)),
    }


_DRAW_BLOCK = 256  # clients whose covariances are factorised in one batched call


@dataclass(frozen=True)
class GPDraws:
    """A federation of independent GP draws, the spec that generated it, and the true state."""

    federation: Federation
    spec: GPSpec
    truth: HyperState


def _draw(
    model: gpytorch.models.ExactGP, noise: torch.Tensor, X: torch.Tensor, z: torch.Tensor
) -> torch.Tensor:
    """``f + ε = L z`` for a batch of inputs ``X`` ``(B, n, d)`` and standard normals ``z`` ``(B, n)``,
    with ``L L^T = K(X, X) + σ²I`` under the true hyper-parameters loaded in ``model``."""
    with torch.no_grad():
        K = model.covar_module(X).to_dense()
        K = K + noise * torch.eye(X.shape[-2], dtype=X.dtype)
        L = torch.linalg.cholesky(K)
    return (L @ z.unsqueeze(-1)).squeeze(-1)


def gp_federation(
    num_clients: int = 20,
    n: int | Sequence[int] = 250,
    d: int = 1,
    kernel: str = "rbf",
    theta: dict | None = None,
    n_test: int = 0,
    seed: int = 0,
) -> GPDraws:
    """Clients holding independent draws ``y = f + ε``, f ~ GP(0, k_θ*), X ~ U[0, 1]^d.

    ``n`` is one size for all clients or a sequence of sizes (e.g. from
    :func:`~fedgp.data.partition.skewed_sizes`). ``theta`` maps state names to true values
    (missing ones are drawn by :func:`example1_theta`). Every client is an independent realisation,
    so each local likelihood is exact (digest §6.8). ``n_test`` extra points per client form its
    test split, drawn jointly with its training points.
    """
    sizes = [int(n)] * num_clients if np.isscalar(n) else [int(s) for s in n]
    if len(sizes) != num_clients:
        raise InputError(f"{len(sizes)} sizes for {num_clients} clients")
    rng = np.random.default_rng(seed)
    spec = gp_spec(d, kernel)
    values = example1_theta(d, rng)
    values.update(theta or {})
    truth = spec.state(values)
    gen = torch.Generator().manual_seed(int(rng.integers(2**62)))
    # The random streams are consumed client by client (X_k, then the standard normals z_k), so the
    # data do not depend on how the covariances are batched below. Draws go into one buffer before
    # any client is built: each client's small tensors kept between the draws' large temporaries
    # fragmented the heap (about 70 kB per client where the data take 5 kB). The model is built once
    # and runs of equal-size clients are factorised together: 10^5 clients take seconds, not minutes.
    counts = [size + n_test for size in sizes]
    X_all = torch.empty(sum(counts), d, dtype=torch.float64)
    z_all = torch.empty(sum(counts), dtype=torch.float64)
    for X, z in zip(X_all.split(counts), z_all.split(counts)):
        torch.rand(X.shape, generator=gen, dtype=torch.float64, out=X)
        torch.randn(z.shape, generator=gen, dtype=torch.float64, out=z)
    model = spec.build()
    spec.load(model, truth)
    noise = truth["likelihood.noise_covar.noise"].reshape(())
    y_all = torch.empty_like(z_all)
    start = offset = 0
    while start < num_clients:
        stop = start + 1
        while stop < num_clients and stop - start < _DRAW_BLOCK and counts[stop] == counts[start]:
            stop += 1
        rows = slice(offset, offset + (stop - start) * counts[start])
        shape = (stop - start, counts[start])
        y_all[rows] = _draw(model, noise, X_all[rows].view(*shape, d), z_all[rows].view(shape)).reshape(-1)
        start, offset = stop, rows.stop
    clients = []
    for k, (size, X, y) in enumerate(zip(sizes, X_all.split(counts), y_all.split(counts))):
        test = dict(X_test=X[size:], y_test=y[size:]) if n_test else {}
        clients.append(ClientData(X[:size], y[:size], id=k, **test))
    return GPDraws(Federation(clients), spec, truth)


def sin_personalisation(
    n: int = 100,
    n_test: int = 50,
    domain: tuple[float, float] = (0.0, 10.0),
    noise_std: float = 0.0,
    seed: int = 0,
) -> Federation:
    """Two clients on the same inputs: ``"sin"`` with y = sin x and ``"-sin"`` with y = −sin x.

    Training inputs are an even grid on ``domain`` (the authors' script); test inputs uniform.
    The best single global function in squared error is f ≡ 0: its RMSE is that of sin x over the
    points scored (0.69 over all of [0, 10]; 0.60 on the 50 test points of ``seed=0``).
    """
    rng = np.random.default_rng(seed)
    x = np.linspace(*domain, n)
    x_test = np.sort(rng.uniform(*domain, n_test))
    clients = []
    for sign, name in ((1.0, "sin"), (-1.0, "-sin")):
        y = sign * np.sin(x) + noise_std * rng.standard_normal(n)
        y_test = sign * np.sin(x_test) + noise_std * rng.standard_normal(n_test)
        clients.append(ClientData(x[:, None], y, id=name, X_test=x_test[:, None], y_test=y_test))
    return Federation(clients)


@dataclass(frozen=True)
class MixedRegression:
    """A mixed-linear-regression federation: true regressors (k, d) and each client's cluster."""

    federation: Federation
    thetas: torch.Tensor
    labels: torch.Tensor
    noise: float


def mixed_linear_regression(
    k: int = 2,
    d: int = 20,
    m: int = 100,
    n: int | Sequence[int] = 50,
    noise: float = 0.1,
    separation: float = 1.0,
    scale: str = "norm",
    shares: Sequence[float] | None = None,
    n_test: int = 0,
    seed: int = 0,
) -> MixedRegression:
    """Clients in k clusters; client i in cluster j has y = ⟨x, θ*_j⟩ + N(0, noise²), x ~ N(0, I_d).

    θ*_j ~ Bernoulli(½)^d, then ``scale="norm"`` rescales each to norm ``separation`` (IFCA paper
    text) and ``scale="coordinate"`` multiplies by it (IFCA authors' code). Clients are assigned to
    clusters in contiguous blocks with proportions ``shares`` (default equal).
    """
    rng = np.random.default_rng(seed)
    thetas = rng.binomial(1, 0.5, size=(k, d)).astype(np.float64)
    for j in range(k):  # an all-zero draw has no direction; redraw it
        while not thetas[j].any():
            thetas[j] = rng.binomial(1, 0.5, size=d)
    if scale == "norm":
        thetas *= separation / np.linalg.norm(thetas, axis=1, keepdims=True)
    elif scale == "coordinate":
        thetas *= separation
    else:
        raise InputError(f"scale must be 'norm' or 'coordinate', got {scale!r}")
    shares = np.full(k, 1.0 / k) if shares is None else np.asarray(shares, dtype=np.float64)
    if len(shares) != k or not np.isclose(shares.sum(), 1.0):
        raise InputError(f"shares must be {k} fractions summing to 1, got {shares}")
    bounds = np.round(np.cumsum(shares) * m).astype(int)
    labels = np.searchsorted(bounds, np.arange(m), side="right")
    sizes = [int(n)] * m if np.isscalar(n) else [int(s) for s in n]
    clients = []
    for i in range(m):
        X = rng.standard_normal((sizes[i] + n_test, d))
        y = X @ thetas[labels[i]] + noise * rng.standard_normal(sizes[i] + n_test)
        test = dict(X_test=X[sizes[i] :], y_test=y[sizes[i] :]) if n_test else {}
        clients.append(
            ClientData(X[: sizes[i]], y[: sizes[i]], id=i, metadata={"cluster": int(labels[i])}, **test)
        )
    return MixedRegression(Federation(clients), torch.from_numpy(thetas), torch.from_numpy(labels), noise)
