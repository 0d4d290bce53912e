"""Owners whose objectives are draws from one GP prior: the benchmark family where sharing helps.

Each owner's function is ``f_k(x) = φ(x)ᵀw_k``, ``w_k ~ N(0, I)``, on ``features`` random Fourier
features of ``σ² RBF_ℓ`` drawn once for the family (:class:`~fedgp.bo.features.FourierFeatures`),
so every ``f_k`` is (approximately) a draw from ``GP(0, σ² RBF_ℓ)`` that can be queried anywhere;
evaluations add ``N(0, noise)``. Owners differ in their functions, not in the prior: a federated
estimate of ``ℓ``, ``σ²`` and the noise is what they have in common. ``optimum`` is the best of a
Sobol design of ``2048 d`` points, polished by L-BFGS-B from its 5 best points.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fedgp.bo.features import DTYPE, FourierFeatures
from fedgp.bo.maximise import maximise
from fedgp.bo.owner import Owner
from fedgp.rng import generator

__all__ = ["PriorDraw", "shared_prior_owners"]


@dataclass(frozen=True)
class PriorDraw:
    """``f(x) = φ(x)ᵀ w``: one function of the family."""

    features: FourierFeatures
    weight: torch.Tensor

    def __call__(self, X: torch.Tensor) -> torch.Tensor:
        return self.features(X) @ self.weight

    def maximum(self, bounds: torch.Tensor, seed: int = 0) -> float:
        """The function's maximum over ``bounds``, as the module docstring says."""
        d = bounds.shape[1]
        sobol = torch.quasirandom.SobolEngine(d, scramble=True, seed=seed).draw(2048 * d).to(DTYPE)
        return maximise(self, bounds[0] + sobol * (bounds[1] - bounds[0]), bounds, starts=5)[1]


def shared_prior_owners(
    num_owners: int,
    dim: int = 2,
    *,
    lengthscale: float = 0.15,
    outputscale: float = 1.0,
    noise: float = 1e-3,
    features: int = 1000,
    seed: int = 0,
) -> list[Owner]:
    """``num_owners`` owners on ``[0, 1]^dim``, each with its own draw from ``GP(0, outputscale ·
    RBF_lengthscale)`` observed with noise variance ``noise``; ``truth`` and ``optimum`` set for the
    regret."""
    rng = generator(seed, "bo shared prior")
    basis = FourierFeatures.sample(features, dim, lengthscale, outputscale, rng)
    bounds = torch.stack([torch.zeros(dim, dtype=DTYPE), torch.ones(dim, dtype=DTYPE)])
    owners = []
    for k in range(num_owners):
        draw = PriorDraw(basis, torch.as_tensor(rng.standard_normal(features), dtype=DTYPE))
        noise_rng = generator(seed, "bo shared prior noise", k)

        def objective(X, draw=draw, noise_rng=noise_rng):
            eps = torch.as_tensor(noise_rng.standard_normal(len(X)), dtype=DTYPE)
            return draw(X) + float(np.sqrt(noise)) * eps

        owners.append(Owner(k, objective, bounds, truth=draw, optimum=draw.maximum(bounds, seed)))
    return owners
