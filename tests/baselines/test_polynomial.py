"""FedAvg polynomial regression: the maths checked against closed forms."""

import numpy as np
import pytest
import torch

from fedgp.baselines import FedAvgPolynomial, legendre_features, select_degree
from fedgp.data import ClientData, Federation
from fedgp.errors import NotFittedError, UnknownClientError


def federation(xs, f, noise=0.0, seed=0):
    rng = np.random.default_rng(seed)
    return Federation(
        ClientData(x[:, None], f(x) + noise * rng.normal(size=len(x)), id=k) for k, x in enumerate(xs)
    )


def pooled_lstsq(model, fed):
    X = torch.cat([c.X for c in fed])
    y = torch.cat([c.y for c in fed])
    return torch.linalg.lstsq(model.features(X), y).solution


def test_basis_is_orthonormal_for_uniform_inputs():
    nodes, weights = np.polynomial.legendre.leggauss(20)  # exact for polynomials of degree <= 39
    Phi = legendre_features(torch.from_numpy(nodes), 10, (-1.0, 1.0)).numpy()
    gram = Phi.T @ (weights[:, None] * Phi) / 2
    assert np.allclose(gram, np.eye(11), atol=1e-12)


def test_one_local_step_per_round_converges_to_pooled_least_squares_with_unequal_clients():
    rng = np.random.default_rng(1)
    xs = [rng.uniform(0, 3, size=n) for n in (15, 40, 90)]
    fed = federation(xs, np.sin, noise=0.3)
    model = FedAvgPolynomial(degree=4, rounds=4000, local_steps=1, lr=0.4).fit(fed)
    # E = 1 and p_k = N_k / N: each round is one gradient step on the pooled mean squared error
    assert torch.allclose(model.coef_, pooled_lstsq(model, fed), atol=1e-8)


def test_equal_clients_with_the_same_design_reach_pooled_least_squares_despite_local_steps():
    x = np.linspace(0, 2, 30)
    fed = federation([x, x, x], lambda v: v**2, noise=0.5, seed=2)
    model = FedAvgPolynomial(degree=3, rounds=800, local_steps=7, lr=0.3).fit(fed)
    assert torch.allclose(model.coef_, pooled_lstsq(model, fed), atol=1e-8)


def test_heterogeneous_clients_drift_away_from_pooled_least_squares_with_many_local_steps():
    """FedAvg's fixed point is not the pooled fit when clients' designs differ (client drift)."""
    rng = np.random.default_rng(3)
    fed = federation([rng.uniform(0, 1, 30), rng.uniform(2, 3, 30)], lambda v: v**3, noise=0.1)
    model = FedAvgPolynomial(degree=3, rounds=2000, local_steps=20, lr=0.3).fit(fed)
    assert float((model.coef_ - pooled_lstsq(model, fed)).abs().max()) > 1e-3


def test_exact_polynomial_is_recovered_and_degree_selection_finds_it():
    rng = np.random.default_rng(4)
    f = lambda v: 1 - 2 * v + 0.5 * v**3  # noqa: E731
    fit_fed = federation([rng.uniform(0, 2, 40) for _ in range(4)], f)
    val_fed = federation([rng.uniform(0, 2, 40) for _ in range(2)], f)
    degree, table = select_degree(fit_fed, val_fed, degrees=(1, 2, 3), rounds=3000, local_steps=5, lr=0.4)
    assert degree == 3 and table.set_index("degree").loc[3, "val_rmse_mean"] < 1e-6
    model = FedAvgPolynomial(degree=3, rounds=3000, local_steps=5, lr=0.4).fit(fit_fed)
    x = torch.linspace(0, 2, 7, dtype=torch.float64)[:, None]
    assert torch.allclose(model.curve(x), torch.from_numpy(f(x[:, 0].numpy())), atol=1e-6)
    with pytest.raises(ValueError, match="fits its training data exactly"):
        model.predict(x, 0)  # no noise to put around the curve
    model.noise_variance = 1e-6
    assert torch.equal(model.predict(x, 0).mean, model.curve(x))  # every client gets the curve
    assert model.history_["train_mse"].iloc[-1] < 1e-12


def test_prediction_and_errors():
    fed = federation([np.linspace(0, 1, 10), np.linspace(0, 1, 12)], np.cos)
    model = FedAvgPolynomial(degree=2, rounds=5, noise_variance=0.25).fit(fed)
    pred = model.predict(fed[0].X, 0)
    assert torch.all(pred.variance_y == 0.25) and torch.all(pred.variance_f == 0)
    assert torch.equal(pred.mean, model.curve(fed[0].X))
    # without a held-out variance, the federated training MSE of the fit
    plain = FedAvgPolynomial(degree=2, rounds=5).fit(fed).predict(fed[0].X, fed[1])
    assert torch.all(plain.variance_y == model.history_["train_mse"].iloc[-1])
    with pytest.raises(ValueError, match="one input"):
        rng = np.random.default_rng(0)
        FedAvgPolynomial().fit(Federation([ClientData(rng.random((5, 2)), rng.random(5))]))
    with pytest.raises(ValueError, match="shape"):
        model.predict(torch.zeros(3, 2), 0)
    with pytest.raises(UnknownClientError, match="positions 0..1"):
        model.predict(fed[0].X, 5)
    with pytest.raises(NotFittedError, match="not fitted"):
        FedAvgPolynomial().predict(torch.zeros(3, 1), 0)
    with pytest.raises(ValueError, match="noise_variance must be positive"):
        FedAvgPolynomial(noise_variance=0.0)
