import numpy as np
import torch

from fedgp.synthetic import gp_federation, mixed_linear_regression, sin_personalisation


def test_gp_draws_have_the_prior_variance():
    theta = {
        "covar_module.outputscale": 2.0,
        "likelihood.noise_covar.noise": 0.5,
        "covar_module.base_kernel.lengthscale": [[0.05]],
    }
    draws = gp_federation(num_clients=200, n=20, d=1, theta=theta, seed=1)
    y = torch.cat([c.y for c in draws.federation])
    # Var y = outputscale + noise = 2.5; 4000 weakly correlated draws
    assert abs(float(y.var()) - 2.5) < 0.25
    assert abs(float(y.mean())) < 0.15
    assert torch.isclose(draws.truth["covar_module.outputscale"], torch.tensor(2.0, dtype=torch.float64))


def test_gp_draws_unbalanced_and_example1_ranges():
    draws = gp_federation(num_clients=3, n=[5, 50, 500], d=4, n_test=7, seed=0)
    assert [c.n for c in draws.federation] == [5, 50, 500]
    assert all(c.X_test.shape == (7, 4) for c in draws.federation)
    t = draws.truth
    assert 0.1 <= float(t["covar_module.outputscale"]) <= 10
    assert 0.01 <= float(t["likelihood.noise_covar.noise"]) <= 1
    ls = t["covar_module.base_kernel.lengthscale"]
    assert ls.shape == (1, 4) and bool(((ls >= 0.01) & (ls <= 1)).all())


def test_sin_personalisation():
    fed = sin_personalisation(n=100)
    assert fed.ids == ["sin", "-sin"]
    assert torch.allclose(fed[0].y, -fed[1].y)
    # the best single global function is 0, with RMSE ~ 0.7 on each client
    assert abs(float(fed[0].y.pow(2).mean().sqrt()) - (0.5 - np.sin(20) / 40) ** 0.5) < 0.01


def test_mixed_regression_clusters_and_shares():
    mr = mixed_linear_regression(
        k=3, d=5, m=10, n=30, noise=0.0, separation=2.0, shares=[0.2, 0.3, 0.5], seed=0
    )
    assert torch.bincount(mr.labels).tolist() == [2, 3, 5]
    assert torch.allclose(mr.thetas.norm(dim=1), torch.full((3,), 2.0, dtype=torch.float64))
    for c, j in zip(mr.federation, mr.labels):
        assert c.metadata["cluster"] == int(j)
        assert torch.allclose(c.X @ mr.thetas[j], c.y)
    coord = mixed_linear_regression(k=2, d=8, separation=0.5, scale="coordinate", seed=0)
    assert set(np.unique(coord.thetas.numpy())) <= {0.0, 0.5}


def test_gp_draws_do_not_depend_on_how_the_covariances_are_batched(monkeypatch):
    """Clients' covariances are factorised in blocks of equal size; each client's data must be
    what a client-by-client draw gives (same X, same y to rounding), whatever the block."""
    from fedgp.synthetic import draws

    sizes = [5, 5, 9, 9, 9, 3, 3, 12]
    blocked = gp_federation(num_clients=8, n=sizes, d=2, n_test=4, seed=7)
    monkeypatch.setattr(draws, "_DRAW_BLOCK", 1)
    one_by_one = gp_federation(num_clients=8, n=sizes, d=2, n_test=4, seed=7)
    for a, b in zip(blocked.federation, one_by_one.federation):
        assert a.n == b.n and torch.equal(a.X, b.X) and torch.equal(a.X_test, b.X_test)
        assert torch.allclose(a.y, b.y, rtol=0, atol=1e-12) and torch.allclose(a.y_test, b.y_test, atol=1e-12)
