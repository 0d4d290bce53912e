"""Cold start: a client with 0 points predicts from the prior, with 1 point from the posterior
given that point; clustered strategies send a client without data to a documented default."""

import gpytorch
import numpy as np
import pytest
import torch

import fedgp
from fedgp.data import ClientData, Federation
from fedgp.strategies import FGPR, IFCA, ClusteredGP, FederatedClustering
from fedgp.strategies.clustered import FixedAssigner

D = 2
RAW = {"transforms": None}


@pytest.fixture(scope="module")
def fitted():
    """FGPR with a constant mean (so the prior mean is not zero) and an ARD RBF kernel."""
    draws = fedgp.synthetic.gp_federation(num_clients=4, n=30, d=D, seed=0)
    spec = fedgp.GPSpec(
        kernel=gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=D)),
        mean=gpytorch.means.ConstantMean(),
        initial_values={"mean_module.raw_constant": 0.7},
    )
    # transforms off: the closed forms below are in the model's units, which are then the data's
    return fedgp.fit(spec, draws.federation, FGPR(local_steps=2), rounds=3, **RAW)


def _kernel(state, A, B):
    """s · exp(-|a/ℓ - b/ℓ|² / 2), by hand."""
    ell = state["covar_module.base_kernel.lengthscale"].reshape(-1)
    return state["covar_module.outputscale"] * torch.exp(-0.5 * torch.cdist(A / ell, B / ell) ** 2)


def test_no_points_gives_the_prior_predictive(fitted):
    X = torch.rand(6, D, dtype=torch.float64)
    new = ClientData(np.zeros((0, D)), np.zeros(0), id="empty")
    pred = fitted.posterior(X, client=new)
    state = fitted.state
    c, s, noise = (
        state["mean_module.raw_constant"],
        state["covar_module.outputscale"],
        state["likelihood.noise_covar.noise"],
    )
    assert abs(float(c) - 0.0) > 1e-3  # a real mean function, not zero by accident
    torch.testing.assert_close(
        pred.mean, torch.full((6,), float(c), dtype=torch.float64), rtol=1e-12, atol=1e-12
    )
    torch.testing.assert_close(
        pred.variance_f, torch.full((6,), float(s), dtype=torch.float64), rtol=1e-10, atol=0
    )
    torch.testing.assert_close(pred.variance_y, pred.variance_f + float(noise), rtol=1e-10, atol=0)


def test_prior_predictive_comes_back_in_the_data_units_with_default_transforms():
    """Default transforms standardise y federatedly: the prior maps back to ȳ + sd·c, sd²·s."""
    rng = np.random.default_rng(3)
    clients = [ClientData(rng.uniform(size=(20, D)), 150 + 70 * rng.normal(size=20), id=i) for i in range(3)]
    spec = fedgp.GPSpec(mean=gpytorch.means.ConstantMean())
    result = fedgp.fit(spec, Federation(clients), FGPR(local_steps=2), rounds=2)
    offset, scale = float(result.transform.y_offset), float(result.transform.y_scale)
    assert abs(offset - float(torch.cat([c.y for c in clients]).mean())) < 1e-9  # it is on
    pred = result.posterior(torch.rand(4, D, dtype=torch.float64), ClientData(np.zeros((0, D)), [], id="new"))
    state = result.state
    mean = offset + scale * float(state["mean_module.raw_constant"])
    torch.testing.assert_close(pred.mean, torch.full((4,), mean, dtype=torch.float64), rtol=1e-12, atol=0)
    var_f = scale**2 * float(state["covar_module.outputscale"])
    torch.testing.assert_close(
        pred.variance_f, torch.full((4,), var_f, dtype=torch.float64), rtol=1e-10, atol=0
    )


def test_one_point_conditions_on_it(fitted):
    X = torch.rand(6, D, dtype=torch.float64)
    x1, y1 = torch.tensor([[0.3, 0.6]], dtype=torch.float64), torch.tensor([2.5], dtype=torch.float64)
    pred = fitted.posterior(X, client=ClientData(x1, y1, id="one"))
    state = fitted.state
    c, noise = float(state["mean_module.raw_constant"]), float(state["likelihood.noise_covar.noise"])
    k_x1 = _kernel(state, X, x1)[:, 0]
    k_11 = float(_kernel(state, x1, x1))
    mean = c + k_x1 / (k_11 + noise) * (y1 - c)
    var = _kernel(state, X, X).diagonal() - k_x1**2 / (k_11 + noise)
    torch.testing.assert_close(pred.mean, mean, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(pred.variance_f, var, rtol=1e-10, atol=1e-12)
    # and GPyTorch's own exact posterior, with the learned hyper-parameters loaded
    model = fitted.spec.build()
    fitted.spec.load(model, state)
    model.set_train_data(x1, y1, strict=False)
    model.eval()
    with torch.no_grad():
        latent = model(X)
    torch.testing.assert_close(pred.mean, latent.mean, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(pred.variance_f, latent.variance, rtol=1e-10, atol=1e-12)


def _mixture(sizes, seed=0):
    """Clients with y = ±(x1 + x2) + noise: two clusters by sign."""
    rng = np.random.default_rng(seed)
    clients = []
    for i, (n, sign) in enumerate(sizes):
        X = rng.uniform(size=(n, D))
        clients.append(ClientData(X, sign * X.sum(1) + 0.05 * rng.normal(size=n), id=i))
    return Federation(clients)


def test_clustered_cold_start_takes_the_cluster_with_most_training_points():
    # cluster 0 has two clients but 20 points; cluster 1 one client with 30: by points, cluster 1.
    fed = _mixture([(10, 1.0), (10, 1.0), (30, -1.0)])
    strategy = ClusteredGP(num_clusters=2, assigner=FixedAssigner(labels=(0, 0, 1)), restarts=1)
    result = fedgp.fit(fedgp.GPSpec(), fed, strategy, rounds=2, **RAW)
    empty = ClientData(np.zeros((0, D)), np.zeros(0), id="new")
    assert int(result.ask("personal", empty)["cluster"]) == 1
    torch.testing.assert_close(result.client_state(empty).to_dict(), result.state.index(1).to_dict())
    X = torch.rand(4, D, dtype=torch.float64)
    prior = result.posterior(X, client=empty)
    torch.testing.assert_close(prior.variance_f, result.state.index(1)["covar_module.outputscale"].expand(4))


def test_ifca_cold_start_follows_the_best_restarts_assignment():
    fed = _mixture([(10, 1.0), (10, 1.0), (12, -1.0), (40, -1.0)])
    result = fedgp.fit(fedgp.GPSpec(), fed, IFCA(num_clusters=2, local_steps=2), rounds=3, **RAW)
    server = result.server_state
    labels = server.assignment[server.best]
    points = torch.zeros(2, dtype=torch.float64).index_add_(0, labels, fed.sizes.to(torch.float64))
    empty = ClientData(np.zeros((0, D)), np.zeros(0), id="new")
    assert int(result.ask("personal", empty)["cluster"]) == int(points.argmax())
    # one point: its cluster is chosen by its own likelihood, and the posterior conditions on it
    one = ClientData([[0.5, 0.5]], [-1.0], id="one")
    state = result.client_state(one)
    X = torch.rand(3, D, dtype=torch.float64)
    expected = fedgp.models.posterior.condition(result.spec, state, one.X, one.y, X)
    torch.testing.assert_close(result.posterior(X, client=one).mean, expected.mean)


def test_personal_strategies_cold_start_takes_the_largest_clients_state():
    fed = _mixture([(10, 1.0), (30, 1.0), (12, -1.0)])
    result = fedgp.fit(fedgp.GPSpec(), fed, FederatedClustering(iterations=2), rounds=2, **RAW)
    empty = ClientData(np.zeros((0, D)), np.zeros(0), id="new")
    assert int(result.ask("personal", empty)["cluster"]) == 1
    torch.testing.assert_close(result.client_state(empty).to_dict(), result.state.index(1).to_dict())


def test_fit_refuses_small_clients_naming_them():
    good = ClientData(np.random.default_rng(0).uniform(size=(5, D)), np.arange(5.0), id="ok")
    with pytest.raises(ValueError, match="client 'tiny': 1 training point"):
        fedgp.fit(fedgp.GPSpec(), Federation([good, ClientData([[0.1, 0.2]], [1.0], id="tiny")]), rounds=1)


def test_fit_checks_the_sizes_clients_register_with():
    """An engine hosting its own clients (as a Flower deployment does) is checked at registration."""
    from fedgp.engines.sequential import SequentialEngine

    rng = np.random.default_rng(0)
    good = ClientData(rng.uniform(size=(5, D)), np.arange(5.0), id="ok")
    tiny = ClientData(np.zeros((0, D)), np.zeros(0), id="tiny")
    engine = SequentialEngine(fedgp.GPSpec(), [good, tiny])  # not a Federation: nothing checked yet
    with pytest.raises(ValueError, match="client 'tiny': 0 training point"):
        fedgp.fit(fedgp.GPSpec(), Federation([good]), engine=engine, rounds=1)
