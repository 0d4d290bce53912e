"""Random Fourier features against their closed forms: the kernel they approximate (within
Hoeffding's bound, which frequencies of the wrong scale fail) and the weight posterior."""

import math

import numpy as np
import pytest
import torch

from fedgp.bo import FourierFeatures, WeightPosterior


def rbf(X, Z, lengthscale, outputscale):
    return outputscale * torch.exp(-0.5 * torch.cdist(X / lengthscale, Z / lengthscale).pow(2))


def hoeffding_radius(num: int, outputscale: float, pairs: int, delta: float = 1e-6) -> float:
    """ε with P(some of ``pairs`` errors ≥ ε) ≤ δ: each of the M terms lies in [-2σ², 2σ²], so
    P(|error| ≥ ε) ≤ 2 exp(-M ε² / 8σ⁴) per pair, union over pairs."""
    return math.sqrt(8 * outputscale**2 * math.log(2 * pairs / delta) / num)


def max_error(features, X, Z, lengthscale, outputscale):
    return float((features.kernel(X, Z) - rbf(X, Z, lengthscale, outputscale)).abs().max())


@pytest.mark.parametrize("lengthscale, outputscale, d", [(0.2, 1.0, 2), (0.5, 2.5, 3), (0.05, 0.7, 1)])
def test_kernel_error_within_hoeffding_bound(lengthscale, outputscale, d):
    rng = np.random.default_rng(0)
    # pairs at distances comparable to the lengthscale, where a wrong scale shows
    X = torch.as_tensor(rng.uniform(size=(8, d)) * 3 * lengthscale, dtype=torch.float64)
    for num in (500, 20000):
        features = FourierFeatures.sample(num, d, lengthscale, outputscale, rng)
        assert max_error(features, X, X, lengthscale, outputscale) <= hoeffding_radius(num, outputscale, 64)


def test_bound_rejects_frequencies_of_the_wrong_scale():
    """The check above has power: frequencies scaled by 1/ℓ² (or not at all) instead of 1/ℓ fail it."""
    rng = np.random.default_rng(1)
    lengthscale, num, d = 0.2, 20000, 2
    X = torch.as_tensor(rng.uniform(size=(8, d)) * 3 * lengthscale, dtype=torch.float64)
    right = FourierFeatures.sample(num, d, lengthscale, 1.0, rng)
    radius = hoeffding_radius(num, 1.0, 64)
    assert max_error(right, X, X, lengthscale, 1.0) <= radius
    for wrong in (right.frequencies / lengthscale, right.frequencies * lengthscale):
        features = FourierFeatures(wrong, right.phases, 1.0)
        assert max_error(features, X, X, lengthscale, 1.0) > radius


def test_error_shrinks_like_one_over_root_m():
    """The root-mean-square error over pairs and draws at M = 10,000 is about a tenth of M = 100's."""
    rng = np.random.default_rng(2)
    X = torch.as_tensor(rng.uniform(size=(6, 2)) * 0.6, dtype=torch.float64)
    rms = {}
    for num in (100, 10000):
        errors = [
            FourierFeatures.sample(num, 2, 0.2, 1.0, rng).kernel(X, X) - rbf(X, X, 0.2, 1.0)
            for _ in range(40)
        ]
        rms[num] = float(torch.stack(errors).pow(2).mean().sqrt())
    assert 6 < rms[100] / rms[10000] < 16


def test_weight_posterior_mean_is_the_gp_posterior_mean_of_the_feature_kernel():
    """Bayesian linear regression on φ is the GP with kernel φᵀφ: the same posterior mean."""
    rng = np.random.default_rng(3)
    features = FourierFeatures.sample(50, 2, 0.3, 1.5, rng)
    X, Xs = (torch.as_tensor(rng.uniform(size=(n, 2)), dtype=torch.float64) for n in (30, 7))
    y = torch.as_tensor(rng.standard_normal(30), dtype=torch.float64)
    noise = 0.05
    post = WeightPosterior.fit(features, X, y, noise)
    K = features.kernel(X, X) + noise * torch.eye(30, dtype=torch.float64)
    expected = features.kernel(Xs, X) @ torch.linalg.solve(K, y)
    torch.testing.assert_close(post.predict_mean(Xs), expected, rtol=1e-8, atol=1e-10)


def test_weight_draws_have_the_posterior_covariance():
    rng = np.random.default_rng(4)
    features = FourierFeatures.sample(4, 1, 0.3, 1.0, rng)
    X = torch.as_tensor(rng.uniform(size=(6, 1)), dtype=torch.float64)
    y = torch.as_tensor(rng.standard_normal(6), dtype=torch.float64)
    post = WeightPosterior.fit(features, X, y, 0.1)
    draws = torch.stack([post.sample(rng) for _ in range(20000)])
    Phi = features(X)
    cov = 0.1 * torch.linalg.inv(Phi.T @ Phi + 0.1 * torch.eye(4, dtype=torch.float64))
    torch.testing.assert_close(
        draws.mean(0), post.mean, atol=4 * float(cov.diag().max().sqrt()) / 100, rtol=0
    )
    torch.testing.assert_close(torch.cov(draws.T), cov, atol=0.05 * float(cov.diag().max()), rtol=0)
