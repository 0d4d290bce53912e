"""The growing posterior: a Cholesky factor extended by rank-k blocks equals factorising every row
again, and its predictions equal GPyTorch's exact posterior on all the rows (float64, to 1e-8)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fedgp
from fedgp.models.posterior import condition
from fedgp.models.streaming import BlockCholesky, GrowingPosterior

TOL = 1e-8


def _spec(d: int):
    spec = fedgp.GPSpec(input_dim=d, mean="constant")
    return spec, spec.state({"likelihood.noise_covar.noise": 0.03, "mean_module.constant": 0.4})


def _data(n: int, d: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=torch.float64)
    return X, torch.sin(5 * X).sum(1) + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)


def _assert_refit(posterior: GrowingPosterior, spec, state, X, y, at) -> None:
    """Predictions and factor of ``posterior`` against conditioning on all of ``(X, y)`` at once."""
    ref = condition(spec, state, X, y, at, full_cov=True)
    got = posterior.predict(at, full_cov=True)
    marginal = posterior.predict(at)
    torch.testing.assert_close(got.mean, ref.mean, rtol=0, atol=TOL)
    torch.testing.assert_close(got.covariance_f, ref.covariance_f, rtol=0, atol=TOL)
    torch.testing.assert_close(got.variance_y, ref.variance_y, rtol=0, atol=TOL)
    torch.testing.assert_close(marginal.mean, ref.mean, rtol=0, atol=TOL)
    torch.testing.assert_close(marginal.variance_f, ref.variance_f, rtol=0, atol=TOL)
    torch.testing.assert_close(marginal.variance_y, ref.variance_y, rtol=0, atol=TOL)
    model = spec.build()
    spec.load(model, state)
    K = model.covar_module(X).to_dense() + model.likelihood.noise * torch.eye(len(X), dtype=torch.float64)
    torch.testing.assert_close(posterior.factor.dense(), torch.linalg.cholesky(K), rtol=0, atol=TOL)
    torch.testing.assert_close(posterior.factor.log_det(), torch.logdet(K), rtol=0, atol=TOL)


@pytest.mark.parametrize(
    "n, ks",
    [(5, [1]), (20, [1, 1, 1]), (4, [9]), (10, [25, 3]), (30, [7, 1, 12])],
    ids=["k=1", "k=1 three times", "k>n", "k>n then k<n", "mixed"],
)
def test_a_rank_k_update_equals_a_refit(n, ks):
    spec, state = _spec(2)
    X, y = _data(n + sum(ks), 2, seed=n)
    at, _ = _data(6, 2, seed=99)
    posterior = GrowingPosterior(spec, state, X[:n], y[:n])
    start = n
    for k in ks:
        posterior.extend(X[start : start + k], y[start : start + k])
        start += k
    assert posterior.n == len(X)
    _assert_refit(posterior, spec, state, X, y, at)


@settings(max_examples=25)
@given(
    d=st.integers(1, 3),
    n=st.integers(1, 15),
    ks=st.lists(st.integers(1, 12), min_size=1, max_size=3),
    seed=st.integers(0, 10_000),
)
def test_a_rank_k_update_equals_a_refit_for_any_shapes(d, n, ks, seed):
    spec, state = _spec(d)
    X, y = _data(n + sum(ks), d, seed)
    at, _ = _data(4, d, seed + 1)
    posterior = GrowingPosterior(spec, state, X[:n], y[:n])
    start = n
    for k in ks:
        posterior.extend(X[start : start + k], y[start : start + k])
        start += k
    _assert_refit(posterior, spec, state, X, y, at)


def test_retargeting_solves_for_new_targets_on_the_same_factor():
    spec, state = _spec(2)
    X, y = _data(12, 2, seed=3)
    at, _ = _data(5, 2, seed=4)
    posterior = GrowingPosterior(spec, state, X[:8], y[:8])
    posterior.extend(X[8:], y[8:])
    posterior.retarget(3 * y - 1)
    _assert_refit(posterior, spec, state, X, 3 * y - 1, at)
    with pytest.raises(fedgp.errors.InputError, match="retarget: \\(3,\\) targets for 12 rows"):
        posterior.retarget(y[:3])


def test_block_solves_are_triangular_solves_of_the_whole_factor():
    g = torch.Generator().manual_seed(0)
    A = torch.randn(9, 9, generator=g, dtype=torch.float64)
    L = torch.linalg.cholesky(A @ A.T + 9 * torch.eye(9, dtype=torch.float64))
    blocks = BlockCholesky(L[:4, :4].clone())
    blocks.append(L[4:6, :4].clone(), L[4:6, 4:6].clone())
    blocks.append(L[6:, :6].clone(), L[6:, 6:].clone())
    B = torch.randn(9, 3, generator=g, dtype=torch.float64)
    torch.testing.assert_close(blocks.solve(B), torch.linalg.solve_triangular(L, B, upper=False))
    assert torch.equal(blocks.dense(), L)


def test_a_variational_spec_is_refused():
    spec = fedgp.models.variational.VariationalGPSpec(4, input_dim=1)
    X, y = _data(6, 1, seed=0)
    with pytest.raises(fedgp.errors.InputError, match="client 'a'.*variational"):
        GrowingPosterior(spec, spec.initial_state(), X, y, client="a")
