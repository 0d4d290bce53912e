"""FedAvg MLP and Ditto: each checked against plain torch training written independently."""

import math

import numpy as np
import pytest
import torch

from fedgp.baselines import Ditto, FedAvgMLP
from fedgp.baselines.neural import fit_ditto, init_mlp
from fedgp.data import ClientData, Federation
from fedgp.errors import NotFittedError, UnknownClientError


def small_federation(sizes=(12, 20, 7), d=3, seed=0):
    rng = np.random.default_rng(seed)
    clients = []
    for k, n in enumerate(sizes):
        X = rng.normal(size=(n, d))
        clients.append(ClientData(X, np.sin(X.sum(1)) + (-1) ** k * 0.5 + 0.1 * rng.normal(size=n), id=k))
    return Federation(clients)


def torch_mlp(hidden, d, seed, activation):
    """An nn.Sequential holding exactly fedgp's initial weights."""
    params = init_mlp([d, *hidden, 1], seed)
    layers = []
    for i in range(len(params) // 2):
        W, b = params[2 * i], params[2 * i + 1]
        lin = torch.nn.Linear(W.shape[0], W.shape[1]).double()
        with torch.no_grad():
            lin.weight.copy_(W.T)
            lin.bias.copy_(b)
        layers += [lin, torch.nn.Tanh() if activation == "tanh" else torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


def test_fedavg_with_one_sgd_step_per_round_is_gradient_descent_on_the_pooled_objective():
    fed = small_federation()
    R, lr = 25, 0.05
    model = FedAvgMLP(
        hidden=(8, 8),
        activation="tanh",
        rounds=R,
        local_steps=1,
        batch_size=None,
        lr=lr,
        optimizer="sgd",
        seed=3,
    ).fit(fed)
    net = torch_mlp((8, 8), 3, 3, "tanh")
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    p = fed.weights
    for _ in range(R):
        opt.zero_grad()
        loss = sum(p[k] * ((net(c.X).squeeze(-1) - c.y) ** 2).mean() for k, c in enumerate(fed))
        loss.backward()
        opt.step()
    X = torch.randn(9, 3, dtype=torch.float64)
    assert torch.allclose(model.network(X), net(X).squeeze(-1).detach(), atol=1e-10)


def test_every_client_is_an_independent_adam_run_within_a_round():
    """One round, so the server average is of K independent local Adam trainings."""
    fed = small_federation(sizes=(10, 15))
    steps, lr = 6, 0.01
    model = FedAvgMLP(hidden=(5,), rounds=1, local_steps=steps, batch_size=None, lr=lr, seed=1).fit(fed)
    averaged = None
    for k, c in enumerate(fed):
        net = torch_mlp((5,), 3, 1, "relu")
        opt = torch.optim.Adam(net.parameters(), lr=lr)
        for _ in range(steps):
            opt.zero_grad()
            ((net(c.X).squeeze(-1) - c.y) ** 2).mean().backward()
            opt.step()
        flat = torch.cat([t.detach().reshape(-1) for t in net.parameters()]) * fed.weights[k]
        averaged = flat if averaged is None else averaged + flat
    ours = torch.cat(
        [model.params_[0].T.reshape(-1), model.params_[1], model.params_[2].T.reshape(-1), model.params_[3]]
    )
    assert torch.allclose(ours, averaged, rtol=0, atol=1e-12)


def test_ditto_lambda_zero_is_local_training_and_infinity_is_the_global_model():
    fed = small_federation()
    R, s, lr = 4, 5, 0.05
    common = dict(
        hidden=(6,),
        rounds=R,
        local_steps=3,
        personal_steps=s,
        batch_size=None,
        personal_lr=lr,
        validation_fraction=0.0,
        seed=7,
    )
    local = Ditto(lam=0.0, **common).fit(fed)
    X = torch.randn(5, 3, dtype=torch.float64)
    for k, c in enumerate(fed):
        net = torch_mlp((6,), 3, 7, "relu")
        opt = torch.optim.SGD(net.parameters(), lr=lr)
        for _ in range(R * s):
            opt.zero_grad()
            ((net(c.X).squeeze(-1) - c.y) ** 2).mean().backward()
            opt.step()
        assert torch.allclose(local.predict(X, k).mean, net(X).squeeze(-1).detach(), atol=1e-10)
    inf = Ditto(lam=math.inf, **common).fit(fed)
    huge = Ditto(lam=1e12, **common).fit(fed)
    for k in range(len(fed)):
        assert torch.equal(inf.predict(X, k).mean, inf.predict_global(X).mean)
        assert torch.allclose(huge.predict(X, k).mean, huge.predict_global(X).mean, atol=1e-9)
    # the global model never depends on λ
    assert torch.equal(local.predict_global(X).mean, inf.predict_global(X).mean)


def test_ditto_global_model_is_the_fedavg_mlp():
    fed = small_federation()
    kw = dict(hidden=(8, 8), rounds=6, local_steps=3, batch_size=4, lr=0.01, seed=5)
    fedavg = FedAvgMLP(**kw).fit(fed)
    ditto = Ditto(lam=0.3, validation_fraction=0.0, **kw).fit(fed)
    X = torch.randn(4, 3, dtype=torch.float64)
    assert torch.equal(fedavg.network(X), ditto.predict_global(X).mean)
    # with no validation rows both fall back to the federated training MSE of the global model
    assert torch.allclose(fedavg.predict(X, 0).variance_y, ditto.predict_global(X).variance_y, rtol=1e-12)


def test_ditto_picks_a_small_lambda_when_clients_disagree():
    """sin vs −sin (FGPR Fig. 1): the global model is ~0, so only weakly tied personal models fit."""
    x = np.linspace(0, 6, 60)[:, None]
    fed = Federation([ClientData(x, np.sin(x[:, 0]), id="sin"), ClientData(x, -np.sin(x[:, 0]), id="-sin")])
    ditto = Ditto(
        lam=(0.01, 100.0),
        hidden=(16, 16),
        activation="tanh",
        rounds=150,
        local_steps=5,
        personal_steps=5,
        batch_size=None,
        lr=0.01,
        personal_lr=0.1,
        seed=0,
    ).fit(fed)
    assert ditto.lam_ == 0.01
    table = ditto.validation_.set_index("lam")["val_rmse_mean"]
    assert table[0.01] < 0.5 * table[100.0]
    personal = np.mean([ditto.predict(c.X, k).rmse(c.y) for k, c in enumerate(fed)])
    shared = np.mean([ditto.predict_global(c.X).rmse(c.y) for c in fed])
    # a client by position, by id and as its ClientData is the same client
    assert torch.equal(ditto.predict(x, "-sin").mean, ditto.predict(x, fed[1]).mean)
    assert torch.equal(ditto.predict(x, 1).variance_y, ditto.predict(x, fed[1]).variance_y)
    assert personal < 0.5 * shared and ditto.noise_variance_.shape == (2,)


def test_input_errors():
    fed = small_federation()
    with pytest.raises(ValueError, match="needs validation_fraction > 0"):
        Ditto(lam=(0.1, 1.0), validation_fraction=0.0, rounds=1).fit(fed)
    with pytest.raises(ValueError, match="activation"):
        FedAvgMLP(activation="gelu", rounds=1).fit(fed)
    with pytest.raises(ValueError, match="optimizer"):
        FedAvgMLP(optimizer="lbfgs", rounds=1).fit(fed)
    model = FedAvgMLP(rounds=1).fit(fed)
    with pytest.raises(ValueError, match=r"shape \(n, 3\)"):
        model.predict(torch.zeros(2, 4), 0)
    with pytest.raises(NotFittedError, match="FedAvgMLP is not fitted"):
        FedAvgMLP().predict(torch.zeros(2, 3), 0)
    with pytest.raises(NotFittedError, match="Ditto is not fitted"):
        Ditto().predict_global(torch.zeros(2, 3))
    with pytest.raises(NotFittedError, match="Ditto is not fitted"):
        Ditto().predict(torch.zeros(2, 3), 0)
    ditto = Ditto(lam=1.0, rounds=1, validation_fraction=0.0).fit(fed)
    with pytest.raises(UnknownClientError, match="positions 0..2"):
        ditto.predict(torch.zeros(2, 3), 3)
    with pytest.raises(UnknownClientError, match="no personal model"):
        ditto.predict(torch.zeros(2, 3), ClientData(np.zeros((2, 3)), np.arange(2.0), id="new"))


def test_fitting_several_ditto_models_together_equals_fitting_each_alone():
    feds = [small_federation(seed=1), small_federation(sizes=(9, 14, 11), seed=2)]
    kw = dict(
        lam=(0.01, 1.0),
        hidden=(6,),
        rounds=5,
        local_steps=2,
        personal_steps=2,
        batch_size=5,
        validation_fraction=0.3,
    )
    together = fit_ditto([Ditto(seed=3, **kw), Ditto(seed=4, **kw)], feds)
    alone = [Ditto(seed=3, **kw).fit(feds[0]), Ditto(seed=4, **kw).fit(feds[1])]
    X = torch.randn(4, 3, dtype=torch.float64)
    for a, b in zip(together, alone):
        assert a.lam_ == b.lam_
        # bitwise: batching groups together changes nothing
        assert np.array_equal(a.validation_["val_rmse_mean"], b.validation_["val_rmse_mean"])
        assert torch.equal(a.predict_global(X).mean, b.predict_global(X).mean)
        assert all(torch.equal(a.predict(X, k).mean, b.predict(X, k).mean) for k in range(3))
        assert np.array_equal(a.noise_variance_, b.noise_variance_)
    with pytest.raises(ValueError, match="differ only in their seed"):
        fit_ditto([Ditto(seed=3, **kw), Ditto(seed=4, **{**kw, "rounds": 6})], feds)
