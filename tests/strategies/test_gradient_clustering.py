"""Werner et al.'s strategies as GP strategies: the maths each step should do, and the paper's
claims in small — FC with the true groups is the oracle, FC beats Local and FedAvg on a clustered
GP population, and Myopic-Clustering fails the paper's Fig. 1a where FC succeeds."""

import math

import gpytorch
import pytest
import torch

import fedgp
from fedgp import GPSpec
from fedgp.clustering import FixedRadius, QuantileRadius
from fedgp.data import ClientData, Federation
from fedgp.experiments.werner_fig1 import ETA, fig1a_study, loss
from fedgp.models import GaussianBumpMean, ZeroKernel
from fedgp.models.linear import linear_model
from fedgp.strategies import FederatedClustering, MomentumClustering
from fedgp.strategies import clustered as C
from fedgp.strategies.gradient_clustering import resolve_blocks
from fedgp.synthetic import bump_federation, gaussian_mixed_regression

NOISE = "likelihood.noise_covar.noise"
W = "mean_module.weights"


def linear_spec(d=3, noise=0.25):
    return GPSpec(
        kernel=ZeroKernel(),
        mean=gpytorch.means.LinearMean(d, bias=False),
        initial_values={NOISE: noise, W: torch.zeros(d, 1)},
        fixed=[NOISE],
    )


def mixed(k=2, d=3, clients=8, seed=0):
    return gaussian_mixed_regression(k=k, d=d, sizes=[12] * clients, noise=0.1, labels="balanced", seed=seed)


def fit(spec, data, strategy, rounds, engine="sequential", **kw):
    return fedgp.fit(
        spec,
        data.federation,
        strategy,
        engine=engine,
        rounds=rounds,
        **kw,
        callbacks=[fedgp.run.Evaluate(every=0)],
    )


@pytest.mark.parametrize("engine", ["sequential", "batched"])
def test_fc_with_the_true_clusters_as_groups_is_the_oracle(engine):
    # FC with fixed groups and an infinite radius steps each client with its group's mean gradient
    # at its own state; the oracle (IFCA gradient averaging with the true labels) steps each
    # cluster model with its members' mean gradient: from the same start, the same iterates.
    data, spec, lr = mixed(), linear_spec(), 0.05
    labels = tuple(int(z) for z in data.labels)
    fc = fit(
        spec,
        data,
        FederatedClustering(lr=lr, groups=labels, radius=FixedRadius(math.inf), iterations=1),
        12,
        engine,
    )
    start = spec.initial_state().expand(2).clone()
    oracle = C.ClusteredGP(
        2, C.GivenInit(start), C.FixedAssigner(labels), C.GradientSolver(), C.GradientStep(lr, "cluster")
    )
    ref = fit(spec, data, oracle, 12)
    for i, z in enumerate(labels):
        assert torch.allclose(fc.state[W][i], ref.state[W][z], rtol=1e-10, atol=1e-12)
    assert not torch.allclose(fc.state[W][0], spec.initial_state()[W])  # it did move


def test_singleton_groups_are_local_gradient_descent_with_either_momentum():
    # one client per group: TC returns its own gradient, so x ← x − η buf with buf the momentum of
    # its own gradients, computed here in closed form on the noise-only linear model
    data, spec, lr, beta = mixed(clients=4), linear_spec(), 0.1, 0.7
    model = linear_model(spec)
    for kind in ("ema", "heavy_ball"):
        strategy = FederatedClustering(lr=lr, groups=(0, 1, 2, 3), momentum=beta, momentum_kind=kind)
        got = fit(spec, data, strategy, 5).state[W][..., 0]
        theta, buf = torch.zeros(4, 3, dtype=torch.float64), None
        noise = torch.full((4, 1), 0.25, dtype=torch.float64)
        for _ in range(5):
            g = model.gradient(list(data.federation), theta.unsqueeze(1), noise)[:, 0]
            if buf is None:
                buf = g
            else:
                buf = (1 - beta) * g + beta * buf if kind == "ema" else beta * buf + g
            theta = theta - lr * buf
        assert torch.allclose(got, theta, rtol=1e-10), kind


def bump_spec(data, trained_kernel=False):
    ls, os_ = "covar_module.base_kernel.lengthscale", "covar_module.outputscale"
    return GPSpec(
        kernel=gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()),
        mean=GaussianBumpMean(data.centres, data.width),
        initial_values={ls: 0.5, os_: 0.05, NOISE: 0.01, W: torch.zeros(len(data.centres), 1)},
        fixed=[NOISE] if trained_kernel else [ls, os_, NOISE],
    )


@pytest.mark.slow
def test_fc_beats_local_and_fedavg_on_a_small_clustered_gp_population():
    data = bump_federation(clusters=2, clients_per_cluster=5, n=5, n_test=40, seed=1)
    spec = bump_spec(data)
    kw = dict(lr=0.08)
    methods = {
        "fc": FederatedClustering(radius=QuantileRadius(0.3), **kw),
        "local": FederatedClustering(groups=tuple(range(10)), **kw),
        "fedavg": FederatedClustering(radius=FixedRadius(math.inf), iterations=1, **kw),
    }
    rmse = {k: fit(spec, data, s, 150, "batched").evaluate()["rmse"].mean() for k, s in methods.items()}
    assert rmse["fc"] < 0.8 * rmse["local"] and rmse["fc"] < 0.5 * rmse["fedavg"], rmse


# -- the paper's Fig. 1a as GP clients (fedgp.experiments.werner_fig1) ------------------------------------


def test_myopic_clustering_leaves_client_2_at_the_saddle_where_fc_takes_it_to_its_minimum():
    trace = fig1a_study(rounds=40).set_index(["method", "round", "client"])
    myopic, fc = trace.loc["myopic", 40], trace.loc["fc", 40]
    # round 1 clusters {1,2},{3}; then g = (1/3η, 0, 0) puts 2 with 3, and 2 never leaves x = 1
    assert trace.loc[("myopic", 1, 2), "theta"] == pytest.approx(1.0)
    assert myopic.loc[2, "theta"] == 1.0 and myopic.loc[2, "loss"] == pytest.approx(1.0)
    assert abs(myopic.loc[1, "theta"]) < 1e-3 and myopic.loc[3, "theta"] == pytest.approx(2.0)
    # at client 2's model FC sees g = (1/3η, 0, −1/η): 1 and 2 share the ball, 2 escapes the saddle
    assert fc.loc[2, "loss"] < 1e-3 and abs(fc.loc[1, "theta"]) < 1e-2
    assert fc.loc[3, "theta"] == pytest.approx(2.0)
    assert loss(2, 0.0) == pytest.approx(0.0) and loss(1, 1.5) == pytest.approx(1.5**2 / (6 * ETA))


# -- Momentum-Clustering -----------------------------------------------------------------------------------


def test_momentum_clustering_reaches_each_clusters_optimum_when_momenta_are_iid_within_clusters():
    # The setting of Thm 3.4 (A8: members' momenta i.i.d.): every client of a cluster has the same
    # design, targets differ only by noise. (With a different design per client the momenta of a
    # cluster spread and drift apart, and K independently warm-started TC centres can collapse onto
    # the converged clients and leave a cluster stalled; Algorithm 4 has no guard against it.)
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(12, 2, generator=gen, dtype=torch.float64)
    thetas = torch.tensor([[3.0, -3.0], [-3.0, 3.0]], dtype=torch.float64)
    labels = torch.tensor([0, 1] * 4)
    noise = [0.1 * torch.randn(12, generator=gen, dtype=torch.float64) for _ in labels]
    fed = Federation(
        [ClientData(X, X @ thetas[z] + e, id=i) for i, (z, e) in enumerate(zip(labels.tolist(), noise))]
    )
    strategy = MomentumClustering(lr=0.1, num_clusters=2, alpha=0.5, radius=QuantileRadius(0.4))
    first = []
    result = fedgp.fit(
        linear_spec(d=2),
        fed,
        strategy,
        engine="batched",
        rounds=150,
        callbacks=[
            lambda run: first.append(run.server.assignment[:, 0].clone()) if run.completed == 1 else None
        ],
    )
    assert (
        len(set(first[0][labels == 0].tolist())) == 1 != len(set(first[0].tolist()))
    )  # round 1: the true split
    assert float((result.state[W][..., 0] - thetas[labels]).norm(dim=1).max()) < 0.1


def test_momentum_is_an_ema_of_the_clients_gradients():
    # α = 1/2, one client per cluster (k-means with K = N): each follows its own EMA momentum
    data, spec = mixed(clients=2), linear_spec()
    model = linear_model(spec)
    got = fit(spec, data, MomentumClustering(lr=0.1, num_clusters=2, alpha=0.5, clustering="kmeans"), 4)
    theta, m = torch.zeros(2, 3, dtype=torch.float64), None
    noise = torch.full((2, 1), 0.25, dtype=torch.float64)
    for _ in range(4):
        g = model.gradient(list(data.federation), theta.unsqueeze(1), noise)[:, 0]
        m = g if m is None else 0.5 * g + 0.5 * m
        theta = theta - 0.1 * m
    assert torch.allclose(got.state[W][..., 0], theta, rtol=1e-10)


# -- blocks, prediction, settings --------------------------------------------------------------------------


def test_blocks_put_mean_and_kernel_hyper_parameters_apart():
    data = bump_federation(clusters=1, clients_per_cluster=2, seed=0)
    spec = bump_spec(data, trained_kernel=True)
    blocks = resolve_blocks(spec, "separate")
    assert [len(c) for c in blocks.columns] == [8, 2]  # 8 weights | outputscale, lengthscale
    assert [len(c) for c in resolve_blocks(spec, "joint").columns] == [10]
    with pytest.raises(ValueError, match="blocks='mean' clusters only the mean"):
        resolve_blocks(spec, "mean")
    with pytest.raises(ValueError, match="blocks must be one of"):
        FederatedClustering(blocks="kernel")


def test_each_client_predicts_with_its_own_state_and_a_new_one_picks_the_best_fit():
    data, spec = mixed(clients=4), linear_spec()
    result = fit(spec, data, FederatedClustering(lr=0.1, radius=QuantileRadius(0.5)), 5)
    for i in range(4):
        assert torch.equal(result.client_state(i)[W], result.state[W][i])
    newcomer = data.federation[2]
    stranger = ClientData(newcomer.X, newcomer.y, id="new")
    state = result.client_state(stranger)
    nll = [
        float(linear_model(spec).nll([stranger], result.state[W][i].T.unsqueeze(0), torch.tensor([[0.25]])))
        for i in range(4)
    ]
    assert torch.equal(state[W], result.state[W][min(range(4), key=nll.__getitem__)])


def test_settings_are_checked():
    for bad, match in [
        (lambda: FederatedClustering(lr=0), "lr must be"),
        (lambda: FederatedClustering(momentum=1.0), "momentum must be in"),
        (lambda: FederatedClustering(momentum_kind="nesterov"), "momentum_kind"),
        (lambda: FederatedClustering(iterations=0), "iterations"),
        (lambda: FederatedClustering(group_size=2, groups=(0, 1)), "not both"),
        (lambda: MomentumClustering(alpha=0.0), "alpha"),
        (lambda: MomentumClustering(clustering="dbscan"), "clustering"),
    ]:
        with pytest.raises(ValueError, match=match):
            bad()
    data, spec = mixed(clients=4), linear_spec()
    with pytest.raises(ValueError, match="3 group labels for 4 clients"):
        fit(spec, data, FederatedClustering(groups=(0, 1, 0)), 1)
