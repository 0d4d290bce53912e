"""The clustered federated GP: Lemma 1, assignment rules, closed forms vs the engine, presets."""

import gpytorch
import numpy as np
import pytest
import torch

import fedgp
from fedgp import GPSpec, HyperState
from fedgp.engines.sequential import SequentialEngine
from fedgp.models import ZeroKernel
from fedgp.models.linear import linear_model
from fedgp.strategies import FGPR
from fedgp.strategies import clustered as C
from fedgp.synthetic import gaussian_mixed_regression, gp_federation

NOISE = "likelihood.noise_covar.noise"
W = "mean_module.weights"


def linear_spec(d, noise_var, bias=False):
    return GPSpec(
        kernel=ZeroKernel(),
        mean=gpytorch.means.LinearMean(d, bias=bias),
        initial_values={NOISE: noise_var},
        fixed=[NOISE],
    )


def cluster_states(spec, thetas):
    base = spec.initial_state().expand(len(thetas)).clone()
    return linear_model(spec).with_vector(base, torch.as_tensor(thetas, dtype=torch.float64))


@pytest.fixture(scope="module")
def small():
    mr = gaussian_mixed_regression(k=2, d=6, sizes=[3, 5, 8, 12, 20, 7, 4, 9, 15, 6], noise=0.3, seed=7)
    return mr, linear_spec(6, 0.09)


def lemma1(federation, thetas, eta, s, kind, weighting="global"):
    """Su–Xu–Yang Lemma 1 in numpy: θ_j − (η/N) Σ_{i: z_i=j} X_iᵀ P_i (X_i θ_j − y_i),
    P_i = Σ_{l<s} (I − η X Xᵀ/n_i)^l (FedAvg) or (I + η X Xᵀ/n_i)^{-1} (FedProx); z_i by squared error.
    ``weighting="cluster"``: N_j = Σ_{i: z_i=j} n_i in place of N (within-cluster averaging)."""
    thetas = np.asarray(thetas, dtype=float)
    N = sum(c.n for c in federation)
    labels = [
        int(np.argmin([np.sum((c.y.numpy() - c.X.numpy() @ th) ** 2) for th in thetas])) for c in federation
    ]
    N_j = np.bincount(labels, weights=[c.n for c in federation], minlength=len(thetas))
    new = thetas.copy()
    for c, j in zip(federation, labels):
        X, y = c.X.numpy(), c.y.numpy()
        n = len(y)
        K = eta * X @ X.T / n
        if kind == "fedavg":
            P = sum(np.linalg.matrix_power(np.eye(n) - K, ell) for ell in range(s))
        else:
            P = np.linalg.inv(np.eye(n) + K)
        new[j] -= eta / (N if weighting == "global" else N_j[j]) * X.T @ P @ (X @ thetas[j] - y)
    return new


@pytest.mark.parametrize("engine", ("batched", "sequential"))
@pytest.mark.parametrize(
    "kind,s,closed",
    [("fedavg", 1, "auto"), ("fedavg", 4, "auto"), ("fedavg", 4, "never"), ("fedprox", 1, "auto")],
)
def test_one_round_with_hard_labels_is_lemma_1(small, engine, kind, s, closed):
    mr, spec = small
    thetas = np.random.default_rng(0).normal(size=(2, 6))
    eta = 0.08
    solver = (
        C.GradientDescent(eta, s, "squared_loss")
        if kind == "fedavg"
        else C.ProximalSolve(eta, "squared_loss")
    )
    strategy = C.ClusteredGP(
        2,
        C.GivenInit(cluster_states(spec, thetas)),
        C.HardAssigner(),
        solver,
        C.GlobalWeighted(),
        closed_form=closed,
    )
    result = fedgp.fit(spec, mr.federation, strategy, engine=engine, rounds=1)
    ours = result.state[W][..., 0].numpy()
    assert np.allclose(ours, lemma1(mr.federation, thetas, eta, s, kind), rtol=1e-10, atol=1e-12)
    assert not np.allclose(ours, thetas)  # the round really moved both clusters


def test_marginal_likelihood_assignment_equals_squared_error_assignment():
    """Noise-only GP, one σ² shared by the k components: argmax marginal likelihood = argmin SSE."""
    mr = gaussian_mixed_regression(k=4, d=5, sizes=[2, 3, 5, 8, 13, 21] * 5, noise=0.5, seed=3)
    rng = np.random.default_rng(1)
    for noise_var in (0.01, 0.3, 4.0):
        spec = linear_spec(5, noise_var)
        candidates = cluster_states(spec, rng.normal(size=(4, 5))).expand(1)  # (R=1, k=4)
        model = linear_model(spec)
        engine = SequentialEngine(spec, mr.federation, seed=0)
        for ops in engine.chunks(torch.arange(len(mr.federation)), 0):
            cand = candidates.expand(1)  # (B=1, R=1, k)
            by_gp = C.ClosedForm(model, closed=False)  # GPyTorch marginal likelihood
            nll, _, choice_nll = C.HardAssigner("nll").assign(ops, cand, by_gp)
            _, _, choice_sse = C.HardAssigner("sse").assign(ops, cand, by_gp)
            assert torch.equal(choice_nll, choice_sse)
            closed_nll, _, _ = C.HardAssigner("nll").assign(ops, cand, C.ClosedForm(model, True))
            assert torch.allclose(closed_nll, nll, rtol=1e-10)


def test_with_different_noise_levels_likelihood_and_squared_error_can_disagree():
    """The shared-σ² condition matters: a noisier component can win on likelihood while losing on SSE."""
    mr = gaussian_mixed_regression(k=2, d=3, sizes=[40] * 6, noise=1.0, seed=0)
    spec = GPSpec(kernel=ZeroKernel(), mean=gpytorch.means.LinearMean(3, bias=False))
    states = HyperState(
        {
            NOISE: torch.tensor([[0.01], [1.0]], dtype=torch.float64),
            W: torch.stack([mr.thetas[0] * 0.9, mr.thetas[0] * 0.2]).unsqueeze(-1),
        },
        spec.event_shapes,
    )
    model = linear_model(spec)
    payload = C.ClosedForm(model, closed=False)
    engine = SequentialEngine(spec, mr.federation, seed=0)
    disagree = 0
    for ops in engine.chunks(torch.arange(len(mr.federation)), 0):
        cand = states.expand(1, 1)
        _, _, a = C.HardAssigner("nll").assign(ops, cand, payload)
        _, _, b = C.HardAssigner("sse").assign(ops, cand, payload)
        disagree += int((a != b).sum())
    assert disagree > 0


def _equal_runs(spec, federation, make, rounds=4, seed=2):
    results = {}
    for engine in ("batched", "sequential"):
        for closed in ("auto", "never"):
            result = fedgp.fit(spec, federation, make(closed), engine=engine, rounds=rounds, seed=seed)
            results[(engine, closed)] = result.server_state.states
    ref = results[("sequential", "never")]
    for key, states in results.items():
        assert states.allclose(ref, rtol=1e-9, atol=1e-12), key


def test_closed_forms_equal_the_engine_path(small):
    mr, spec = small
    bias_spec = linear_spec(6, 0.09, bias=True)
    random = C.RandomInit(scale=0.5, center="zero")
    _equal_runs(
        bias_spec,
        mr.federation,
        lambda closed: C.ifca(2, lr=0.3, local_steps=3, initializer=random, restarts=2, closed_form=closed),
    )
    _equal_runs(
        spec,
        mr.federation,
        lambda closed: C.ClusteredGP(
            2,
            random,
            C.HardAssigner(),
            C.GradientSolver(),
            C.GradientStep(0.02, "cluster"),
            closed_form=closed,
        ),
    )
    _equal_runs(
        spec,
        mr.federation,
        lambda closed: C.ClusteredGP(
            2, random, C.SoftAssigner(0.5), C.GradientDescent(0.01, 2), C.ClusterAverage(), closed_form=closed
        ),
    )


def test_soft_assignment_with_one_step_is_gradient_descent_on_the_weighted_loss(small):
    mr, spec = small
    thetas = np.random.default_rng(5).normal(size=(2, 6))
    lr, temperature = 0.004, 3.0
    strategy = C.ClusteredGP(
        2,
        C.GivenInit(cluster_states(spec, thetas)),
        C.SoftAssigner(temperature),
        C.GradientDescent(lr, 1),
        C.GlobalWeighted(),
    )
    result = fedgp.fit(spec, mr.federation, strategy, rounds=1)
    sigma2, N = 0.09, sum(c.n for c in mr.federation)
    grad = np.zeros_like(thetas)
    for c in mr.federation:
        X, y = c.X.numpy(), c.y.numpy()
        n = len(y)
        nll = np.array([np.sum((y - X @ th) ** 2) / (2 * sigma2 * n) for th in thetas])
        lam = np.exp(-n * (nll - nll.min()) / temperature)
        lam /= lam.sum()
        for j in range(2):
            grad[j] += (n / N) * lam[j] * X.T @ (X @ thetas[j] - y) / (sigma2 * n)
    assert np.allclose(result.state[W][..., 0].numpy(), thetas - lr * grad, rtol=1e-10)


@pytest.mark.parametrize("aggregator", [C.ClusterAverage(), C.GlobalWeighted()], ids=["cluster", "global"])
def test_one_cluster_is_fgpr(aggregator):
    draws = gp_federation(num_clients=5, n=[30, 40, 50, 45, 35], d=1, seed=2)
    fgpr = FGPR.authors(local_steps=3, batch_size=16, lr=0.05)  # no server optimiser, as the cluster model
    strategy = C.ClusteredGP(1, C.SpecInit(), C.HardAssigner(), C.LocalTrainingSolver(fgpr.local), aggregator)
    a = fedgp.fit(draws.spec, draws.federation, fgpr, rounds=5, seed=4)
    b = fedgp.fit(draws.spec, draws.federation, strategy, rounds=5, seed=4)
    assert b.state.index(0).allclose(a.state, rtol=1e-10)
    assert np.allclose(b.history["train_nll"], a.history["train_nll"], rtol=1e-10)


def test_one_shot_clusters_once_and_keeps_its_labels():
    mr = gaussian_mixed_regression(k=3, d=4, sizes=[30] * 24, noise=0.1, labels="balanced", seed=2)
    spec = linear_spec(4, 0.01)
    result = fedgp.fit(spec, mr.federation, C.one_shot(3, lr=0.2), rounds=1 + 3)
    labels = result.server_state.labels
    # k-means on local least squares recovers the partition (up to relabelling)
    assert len({(int(a), int(b)) for a, b in zip(labels, mr.labels)}) == 3
    assert torch.equal(result.server_state.assignment[0], labels)  # fixed: every round used them
    assert result.history["phase"].tolist() == ["init", "train", "train", "train"]
    personal = [result.client_state(i)[W][:, 0] for i in range(3)]
    for i in range(3):
        assert torch.equal(personal[i], result.state[W][labels[i], :, 0])


def test_bad_configurations_raise_clear_errors(small):
    mr, spec = small
    with pytest.raises(ValueError, match="GradientSolver needs a GradientStep"):
        C.ClusteredGP(2, solver=C.GradientSolver(), aggregator=C.ClusterAverage())
    rbf = gp_federation(num_clients=3, n=20, d=1, seed=0)
    with pytest.raises(ValueError, match="noise-only linear model"):
        fedgp.fit(rbf.spec, rbf.federation, C.ClusteredGP(2, closed_form="always"), rounds=1)
    with pytest.raises(ValueError, match="FixedAssigner needs labels"):
        strategy = C.ClusteredGP(
            2, C.RandomInit(), C.FixedAssigner(), C.GradientDescent(), C.GlobalWeighted()
        )
        fedgp.fit(spec, mr.federation, strategy, rounds=1)
    with pytest.raises(ValueError, match="expected"):
        bad = C.GivenInit(cluster_states(spec, np.zeros((3, 6))))
        fedgp.fit(spec, mr.federation, C.ifca(2, initializer=bad), rounds=1)
    with pytest.raises(ValueError, match="units"):
        C.GradientDescent(0.1, 1, units="mse")
    with pytest.raises(ValueError, match="not linear in its parameters|has no parameters"):
        fedgp.fit(rbf.spec, rbf.federation, C.one_shot(2), rounds=2)


def test_empty_cluster_keeps_its_state(small):
    mr, spec = small
    far = np.vstack([np.zeros(6), np.full(6, 1e3)])  # nobody chooses the second cluster
    strategy = C.ifca(2, initializer=C.GivenInit(cluster_states(spec, far)), aggregator=C.ClusterAverage())
    result = fedgp.fit(spec, mr.federation, strategy, rounds=2)
    assert torch.equal(result.state[W][1, :, 0], torch.full((6,), 1e3, dtype=torch.float64))
    assert result.history["size/1"].tolist() == [0, 0]


def test_restarts_pick_the_lowest_objective():
    mr = gaussian_mixed_regression(k=2, d=3, sizes=[20] * 10, noise=0.1, seed=1)
    spec = linear_spec(3, 0.01)
    good, bad = mr.thetas, torch.zeros(2, 3, dtype=torch.float64)
    init = HyperState.stack([cluster_states(spec, bad), cluster_states(spec, good)])  # (R=2, k=2)
    # lr must be > 0; 1e-300 is a step too small to move a float64 of order 1: no learning.
    strategy = C.ifca(2, lr=1e-300, initializer=C.GivenInit(init), restarts=2)
    result = fedgp.fit(spec, mr.federation, strategy, rounds=1)
    assert result.server_state.best == 1
    assert torch.allclose(result.state[W][..., 0], good, rtol=1e-12)


def test_checkpoint_resume_through_phase_1_is_bit_identical(small, tmp_path):
    mr, spec = small
    strategy = C.two_phase(
        2, lr=0.1, phase1=fedgp.strategies.MomentDescentInit(num_anchors=3, iterations=2, anchor_pool="all")
    )
    full = fedgp.fit(spec, mr.federation, strategy, rounds=strategy.init_rounds + 3, seed=1)
    path = tmp_path / "c.ckpt"
    fedgp.fit(
        spec, mr.federation, strategy, rounds=3, seed=1, callbacks=[fedgp.run.Checkpointing(path, every=1)]
    )
    resumed = fedgp.fit(
        spec,
        mr.federation,
        strategy,
        rounds=strategy.init_rounds + 3,
        seed=1,
        callbacks=[fedgp.run.Checkpointing(path, every=None, resume=True)],
    )
    assert full.state.allclose(resumed.state, rtol=0.0)
    assert full.history.equals(resumed.history)


@pytest.mark.parametrize("weighting", ["global", "cluster"])
def test_one_round_of_each_phase2_weighting_is_its_lemma_1(small, weighting):
    mr, spec = small
    thetas = np.random.default_rng(3).normal(size=(2, 6))
    strategy = C.oracle(cluster_states(spec, thetas), lr=0.08, local_steps=3, weighting=weighting)
    result = fedgp.fit(spec, mr.federation, strategy, rounds=1)
    ours = result.state[W][..., 0].numpy()
    other = "cluster" if weighting == "global" else "global"
    assert np.allclose(
        ours, lemma1(mr.federation, thetas, 0.08, 3, "fedavg", weighting), rtol=1e-10, atol=1e-12
    )
    assert not np.allclose(ours, lemma1(mr.federation, thetas, 0.08, 3, "fedavg", other), rtol=1e-3)


def test_cluster_weighting_reaches_the_same_fixed_point_and_the_small_cluster_sooner():
    # one cluster holds 10 % of the data: under the paper's n_i/N weighting it moves by a tenth of
    # its members' change per round; weighted within the cluster it moves by all of it
    mr = gaussian_mixed_regression(
        k=2, d=4, sizes=[12] * 40, shares=(0.1, 0.9), noise=0.1, labels="data_shares", seed=5
    )
    spec = linear_spec(4, 0.01)
    sizes = np.array([c.n for c in mr.federation])
    assert sizes[mr.labels.numpy() == 0].sum() / sizes.sum() == pytest.approx(0.1, abs=0.02)
    start = cluster_states(spec, np.zeros((2, 4)) + mr.thetas.numpy() + 0.5)

    def run(weighting, rounds):
        strategy = C.oracle(start, lr=0.2, local_steps=2, weighting=weighting)
        return fedgp.fit(spec, mr.federation, strategy, rounds=rounds).state[W][..., 0].numpy()

    fixed = run("cluster", 150)  # converged to 1e-12 by round 100 (measured)
    assert np.allclose(run("global", 800), fixed, rtol=0, atol=1e-7)  # the same estimates in the end
    small = lambda est: float(np.linalg.norm(est[0] - fixed[0]))  # noqa: E731
    slow, fast = small(run("global", 30)), small(run("cluster", 30))
    # 30 rounds: with its own weighting the small cluster has nearly arrived; with n_i/N it has not
    assert fast < 0.05 * slow and slow > 0.1


def test_weighting_option_builds_its_aggregator_and_refuses_conflicts():
    assert isinstance(C.two_phase(3, weighting="cluster").aggregator, C.ClusterAverage)
    assert isinstance(C.two_phase(3).aggregator, C.GlobalWeighted)
    assert C.two_phase(3, weighting="cluster").aggregator.weighted
    with pytest.raises(ValueError, match="weighting must be one of"):
        C.ifca(2, weighting="per-client")
    with pytest.raises(ValueError, match="not both"):
        C.two_phase(2, weighting="cluster", aggregator=C.GlobalWeighted())
