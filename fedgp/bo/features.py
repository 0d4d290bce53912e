"""Random Fourier features of the RBF kernel, and the Bayesian linear model on them (FTS's surrogate).

``φ(x) = √(2σ²/M) · cos(S x + b)``, rows ``s_i ~ N(0, ℓ⁻² I)`` (the RBF kernel's normalised
spectral density), ``b_i ~ U[0, 2π]``: then ``E[φ(x)ᵀφ(x')] = σ² exp(-‖x - x'‖² / 2ℓ²)`` (Rahimi &
Recht, NIPS 2007, §2). Each of the M terms of ``φ(x)ᵀφ(x')`` lies in ``[-2σ², 2σ²]``, so by
Hoeffding's inequality ``P(|φ(x)ᵀφ(x') - k(x, x')| ≥ ε) ≤ 2 exp(-M ε² / 8σ⁴)`` at each pair: the
error shrinks like ``1/√M``. The tests check that bound, and that it fails for frequencies drawn
with the wrong scale.

On the features, the GP is a linear model ``f(x) = φ(x)ᵀω``, ``ω ~ N(0, I)``, noise variance λ;
its weight posterior is ``N(ν, λΣ⁻¹)`` with ``Σ = ΦᵀΦ + λI`` and ``ν = Σ⁻¹Φᵀy`` (Dai, Low & Jaillet,
NeurIPS 2020, the FTS paper; the authors' ``federated_bayesian_optimization.py``). A draw ``ω`` of it
is M numbers: what an FTS agent shares.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from fedgp.errors import FactorizationError, InputError

__all__ = ["FourierFeatures", "WeightPosterior"]

DTYPE = torch.float64


@dataclass(frozen=True)
class FourierFeatures:
    """``M`` random Fourier features of ``σ² RBF_ℓ`` on ``d`` inputs: ``frequencies`` (M x d, already
    divided by ℓ), ``phases`` (M), ``outputscale`` σ²."""

    frequencies: torch.Tensor
    phases: torch.Tensor
    outputscale: float

    @classmethod
    def sample(
        cls, num: int, dim: int, lengthscale: float, outputscale: float, rng: np.random.Generator
    ) -> FourierFeatures:
        """Draw ``num`` features; ``lengthscale`` a number or one per input (ARD)."""
        if isinstance(num, bool) or not isinstance(num, int) or num < 1:
            raise InputError(f"the number of Fourier features must be an int >= 1, got {num!r}")
        ls = torch.as_tensor(
            np.broadcast_to(np.asarray(lengthscale, dtype=float), (dim,)).copy(), dtype=DTYPE
        )
        if not (ls > 0).all() or not float(outputscale) > 0:
            raise InputError(f"lengthscale and outputscale must be > 0, got {lengthscale!r}, {outputscale!r}")
        omega = torch.as_tensor(rng.standard_normal((num, dim)), dtype=DTYPE) / ls
        phases = torch.as_tensor(rng.uniform(0.0, 2 * math.pi, num), dtype=DTYPE)
        return cls(omega, phases, float(outputscale))

    @property
    def num(self) -> int:
        """M, the number of features."""
        return len(self.phases)

    def __call__(self, X: torch.Tensor) -> torch.Tensor:
        """``Φ``: ``n x M`` features of the rows of ``X``."""
        scale = math.sqrt(2.0 * self.outputscale / self.num)
        return scale * torch.cos(X.to(DTYPE) @ self.frequencies.T + self.phases)

    def kernel(self, X: torch.Tensor, Z: torch.Tensor) -> torch.Tensor:
        """The approximated kernel matrix ``Φ(X) Φ(Z)ᵀ``."""
        return self(X) @ self(Z).T


@dataclass(frozen=True)
class WeightPosterior:
    """``N(mean, noise · Σ⁻¹)`` over the weights of ``features``, given ``Σ``'s Cholesky factor."""

    features: FourierFeatures
    mean: torch.Tensor
    chol: torch.Tensor
    noise: float

    @classmethod
    def fit(
        cls, features: FourierFeatures, X: torch.Tensor, y: torch.Tensor, noise: float
    ) -> WeightPosterior:
        """The posterior after observing ``y`` at ``X`` with noise variance ``noise``."""
        if not float(noise) > 0:
            raise InputError(f"the noise variance must be > 0, got {noise!r}")
        Phi = features(X)
        sigma = Phi.T @ Phi + float(noise) * torch.eye(features.num, dtype=DTYPE)
        chol, info = torch.linalg.cholesky_ex(sigma)
        if int(info):
            raise FactorizationError(
                f"the Fourier-feature posterior (M = {features.num}) could not be factorised"
            )
        mean = torch.cholesky_solve((Phi.T @ y.to(DTYPE)).unsqueeze(-1), chol).squeeze(-1)
        return cls(features, mean, chol, float(noise))

    def sample(self, rng: np.random.Generator) -> torch.Tensor:
        """One draw ``ω = ν + √λ L⁻ᵀ z`` (``Σ = LLᵀ``, so its covariance is ``λ Σ⁻¹``)."""
        z = torch.as_tensor(rng.standard_normal(self.features.num), dtype=DTYPE)
        step = torch.linalg.solve_triangular(self.chol.T, z.unsqueeze(-1), upper=True).squeeze(-1)
        return self.mean + math.sqrt(self.noise) * step

    def predict_mean(self, X: torch.Tensor) -> torch.Tensor:
        """The posterior mean ``φ(x)ᵀν``."""
        return self.features(X) @ self.mean
