"""LocalGP and CentralGP: per-client ML and the pooled ceiling, against direct computations."""

import numpy as np
import pytest
import torch
from linear_operator.utils.errors import NanError

from fedgp.baselines import CentralGP, LocalGP
from fedgp.data import ClientData, Federation
from fedgp.errors import NotFittedError, UnknownClientError
from fedgp.models import condition, fit_mle, maximize_likelihood, total_nll
from fedgp.models.mle import adam
from fedgp.synthetic import gp_spec


def draws(n_clients=3, n=40, seed=0, scales=None):
    rng = np.random.default_rng(seed)
    clients = []
    for k in range(n_clients):
        X = rng.uniform(0, 5, size=(n, 1))
        raw = np.sin(X[:, 0]) + 0.1 * rng.normal(size=n)
        Xt = rng.uniform(0, 5, size=(10, 1))
        raw_t = np.sin(Xt[:, 0]) + 0.1 * rng.normal(size=10)
        m, s = (0.0, 1.0) if scales is None else scales[k]
        clients.append(
            ClientData(
                X, (raw - m) / s, id=k, X_test=Xt, y_test=(raw_t - m) / s, metadata={"y_mean": m, "y_std": s}
            )
        )
    return Federation(clients)


def test_local_gp_is_maximum_likelihood_on_each_client_alone():
    fed = draws()
    spec = gp_spec(1, "rbf", ard=False)
    local = LocalGP(spec, max_iter=100).fit(fed)
    for c, state in zip(fed, local.states_):
        direct, _ = fit_mle(spec, [(c.X, c.y)], max_iter=100)
        assert all(torch.allclose(state[k], direct[k]) for k in spec.names)
    table = local.evaluate(fed)
    direct = condition(spec, local.states_[1], fed[1].X, fed[1].y, fed[1].X_test)
    assert table.loc[1, "rmse"] == pytest.approx(direct.rmse(fed[1].y_test))
    new = ClientData(fed[0].X, fed[0].y)  # a client outside the federation is fitted on the fly
    assert torch.allclose(local.predict(fed[0].X_test, new).mean, local.predict(fed[0].X_test, 0).mean)
    # a client by position, by id and as its ClientData is the same client
    by_position = local.predict(fed[1].X_test, 1)
    for name in (fed[1].id, fed[1]):
        same = local.predict(fed[1].X_test, name)
        assert torch.equal(same.mean, by_position.mean) and torch.equal(
            same.variance_y, by_position.variance_y
        )
    assert torch.allclose(by_position.mean, direct.mean)


def test_local_gp_names_unknown_clients_and_needs_fit_for_known_ones():
    fed = draws(n_clients=2)
    spec = gp_spec(1, "rbf", ard=False)
    with pytest.raises(NotFittedError, match="LocalGP is not fitted"):
        LocalGP(spec).predict(fed[0].X_test, 0)
    assert LocalGP(spec).predict(fed[0].X_test, fed[0]).mean.shape == (10,)  # a new client needs no fit
    local = LocalGP(spec, max_iter=5).fit(fed)
    with pytest.raises(UnknownClientError, match="positions 0..1"):
        local.predict(fed[0].X_test, 2)
    with pytest.raises(UnknownClientError, match="'nobody'"):
        local.predict(fed[0].X_test, "nobody")


def test_central_gp_pools_raw_targets_and_scores_on_each_clients_scale():
    fed = draws(scales=[(0.0, 1.0), (5.0, 2.0), (-1.0, 0.5)])
    spec = gp_spec(1, "rbf", ard=False)
    central = CentralGP(spec, hyper_subset=None).fit(fed)
    X = torch.cat([c.X for c in fed])
    raw = torch.cat([c.y * c.metadata["y_std"] + c.metadata["y_mean"] for c in fed])
    mean, std = raw.mean(), raw.std(unbiased=False)
    state, _ = fit_mle(spec, [(X, (raw - mean) / std)], max_iter=100)
    assert all(torch.allclose(central.state_[k], state[k]) for k in spec.names)
    table = central.evaluate(fed)
    for k, c in enumerate(fed):
        pooled = condition(spec, state, X, (raw - mean) / std, c.X_test)
        m, s = c.metadata["y_mean"], c.metadata["y_std"]
        expected = ((pooled.mean * std + mean - m) / s - c.y_test).pow(2).mean().sqrt()
        assert table.loc[k, "rmse"] == pytest.approx(float(expected))
        assert torch.allclose(central.predict(c.X_test, c).variance_y, pooled.variance_y * (std / s) ** 2)
        assert torch.equal(central.predict(c.X_test, k).mean, central.predict(c.X_test, c.id).mean)
    with pytest.raises(NotFittedError, match="CentralGP is not fitted"):
        CentralGP(spec).predict(fed[0].X_test, fed[0])


def test_central_gp_on_one_client_is_that_clients_local_gp():
    fed = draws(n_clients=1)
    spec = gp_spec(1, "matern32", ard=False)
    central = CentralGP(spec, hyper_subset=None).evaluate(fed)
    local = LocalGP(spec).evaluate(fed)
    # the single client's y is already standardised-ish; pooling only re-standardises it
    assert central.loc[0, "rmse"] == pytest.approx(local.loc[0, "rmse"], rel=1e-3)


def test_central_gp_fits_hyperparameters_on_a_seeded_subset():
    fed = draws(n_clients=4)
    spec = gp_spec(1, "rbf", ard=False)
    a = CentralGP(spec, hyper_subset=30, seed=1).fit(fed).state_
    b = CentralGP(spec, hyper_subset=30, seed=1).fit(fed).state_
    c = CentralGP(spec, hyper_subset=30, seed=2).fit(fed).state_
    assert all(torch.equal(a[k], b[k]) for k in spec.names)
    assert not all(torch.equal(a[k], c[k]) for k in spec.names)


def test_a_failed_lbfgs_fit_falls_back_to_adam(monkeypatch):
    fed = draws(n_clients=2)
    spec = gp_spec(1, "rbf", ard=False)
    data = [(fed[0].X, fed[0].y)]
    adam_alone = maximize_likelihood(spec, data, [(spec.to_raw(spec.initial_state()), adam)]).state
    real, calls = torch.optim.LBFGS.step, []

    def broken_once(self, closure):
        calls.append(1)
        if len(calls) == 1:  # client 0's L-BFGS line search steps into NaN
            raise NanError("cholesky_cpu: NaN")
        return real(self, closure)

    monkeypatch.setattr(torch.optim.LBFGS, "step", broken_once)
    local = LocalGP(spec).fit(fed)
    assert local.fallbacks_ == 1 and len(calls) == 2
    assert all(torch.equal(local.states_[0][k], adam_alone[k]) for k in spec.names)
    assert total_nll(spec, local.states_[0], data) < total_nll(spec, spec.initial_state(), data) - 0.1
