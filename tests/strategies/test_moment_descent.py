"""Phase 1 of Su, Xu & Yang (federated moment descent): statistics, subspace, sign fix, merging."""

import warnings

import gpytorch
import numpy as np
import pytest
import torch

import fedgp
from fedgp import GPSpec
from fedgp.errors import RoundFailedError
from fedgp.experiments.metrics import max_matched_error
from fedgp.models import ZeroKernel
from fedgp.models.linear import linear_model
from fedgp.strategies import MomentDescentInit
from fedgp.strategies import clustered as C
from fedgp.strategies.clustered.moment_descent import merge_anchors
from fedgp.synthetic import gaussian_mixed_regression, su_xu_yang_setting

NOISE = "likelihood.noise_covar.noise"
W = "mean_module.weights"
ENGINE = "batched"


def linear_spec(d, noise_var):
    return GPSpec(
        kernel=ZeroKernel(),
        mean=gpytorch.means.LinearMean(d, bias=False),
        initial_values={NOISE: noise_var},
        fixed=[NOISE],
    )


def separation(thetas):
    D = torch.cdist(thetas, thetas)
    return float(D[D > 0].min())


def phase1_centres(spec, federation, phase1, k, seed):
    """Run Phase 1 only; return the k centres it hands to Phase 2 (and the server's Phase-1 log)."""
    strategy = C.two_phase(k, phase1=phase1)
    out = {}

    def grab(run):
        server = run.server
        if not server.initialising and server.phase_round == 0:
            out["centres"] = server.states[W][0, :, :, 0].clone()
            out["log"] = server.init_log

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        fedgp.fit(
            spec,
            federation,
            strategy,
            engine=ENGINE,
            rounds=strategy.init_rounds,
            seed=seed,
            callbacks=[fedgp.run.Evaluate(every=0), grab],
        )
    return out["centres"], out["log"]


def test_moment_statistics_have_the_clusters_in_their_top_k_subspace():
    d, k = 12, 3
    mr = gaussian_mixed_regression(k=k, d=d, sizes=[6] * 1500, noise=0.2, seed=0)
    model = linear_model(linear_spec(d, 0.04))
    theta = torch.zeros(d, dtype=torch.float64) + 0.1
    sizes = torch.tensor([c.n for c in mr.federation], dtype=torch.float64)
    Y = sum(w * model.second_moment(c, theta) for w, c in zip(sizes / sizes.sum(), mr.federation))
    U = torch.linalg.svd(Y)[0][:, :k]
    for j in range(k):
        v = mr.thetas[j] - theta
        assert float((v - U @ (U.T @ v)).norm() / v.norm()) < 0.15
    # Y_c Q without forming Y_c
    Q = torch.linalg.qr(torch.randn(d, k, dtype=torch.float64))[0]
    c = mr.federation[3]
    assert torch.allclose(
        model.second_moment_times(c, theta, Q), model.second_moment(c, theta) @ Q, atol=1e-12
    )
    # the one-pair statistic is the U-statistic on the first two points
    two = fedgp.data.ClientData(c.X[:2], c.y[:2])
    assert torch.allclose(model.second_moment(c, theta, "first_pair"), model.second_moment(two, theta))


@pytest.mark.slow
def test_phase_1_on_c1_gets_below_half_delta_and_needs_the_sign_fix():
    """Acceptance: within 5 iterations the merged Phase-1 estimate is within 0.5 Δ of θ* in ≥ 8 of
    10 seeds; with the sign fix off it is not (the fix is load-bearing)."""
    ratios = {"first_moment": [], "none": []}

    def ratio(seed, fix):
        mr = su_xu_yang_setting("C1", seed)
        delta = separation(mr.thetas)
        phase1 = MomentDescentInit(iterations=5, delta=delta, theta0_scale=0.2, sign_fix=fix, refill=False)
        centres, _ = phase1_centres(linear_spec(100, 0.04), mr.federation, phase1, 3, seed)
        return max_matched_error(centres, mr.thetas) / delta

    # stop as soon as the count is decided: 8 successes with the fix, 3 failures without it
    for seed in range(10):
        ratios["first_moment"].append(ratio(seed, "first_moment"))
        if sum(r < 0.5 for r in ratios["first_moment"]) >= 8:
            break
    for seed in range(10):
        ratios["none"].append(ratio(seed, "none"))
        if sum(r >= 0.5 for r in ratios["none"]) >= 3:
            break
    assert sum(r < 0.5 for r in ratios["first_moment"]) >= 8, ratios
    assert sum(r < 0.5 for r in ratios["none"]) < 8, ratios


def test_orthogonal_iteration_and_power_iteration_match_direct_svd():
    mr = gaussian_mixed_regression(k=2, d=8, sizes=[20] * 60, noise=0.1, seed=4)
    spec = linear_spec(8, 0.01)
    common = dict(num_anchors=4, iterations=3, theta0_scale=0.3, anchor_pool="all")
    svd, log = phase1_centres(spec, mr.federation, MomentDescentInit(**common), 2, seed=0)
    orth, _ = phase1_centres(
        spec, mr.federation, MomentDescentInit(subspace="orth_iter", orth_iters=30, **common), 2, 0
    )
    power, _ = phase1_centres(spec, mr.federation, MomentDescentInit(power_iters=60, **common), 2, 0)
    assert max_matched_error(orth, svd) < 1e-4
    assert max_matched_error(power, svd) < 1e-6
    assert max_matched_error(svd, mr.thetas) < 0.3 * separation(mr.thetas)
    assert len(log.trace) == 4 and log.anchors.shape == (4,)


class ExpMean(gpytorch.means.Mean):
    """m(x) = exp(xᵀw): not linear in w."""

    def __init__(self, d):
        super().__init__()
        self.register_parameter("w", torch.nn.Parameter(torch.zeros(d, 1)))

    def forward(self, x):
        return torch.exp(x @ self.w).squeeze(-1)


def test_means_not_linear_in_their_parameters_are_refused():
    mr = gaussian_mixed_regression(k=2, d=3, sizes=[10] * 12, noise=0.1, seed=0)
    spec = GPSpec(kernel=ZeroKernel(), mean=ExpMean(3))
    strategy = C.two_phase(2, phase1=MomentDescentInit(num_anchors=2))
    # found on the clients' own inputs: every client fails the round, and the error names them
    with pytest.raises(RoundFailedError, match="ExpMean is not linear in its parameters on client 0"):
        fedgp.fit(spec, mr.federation, strategy, rounds=2)
    with pytest.raises(ValueError, match="ZeroMean has no parameters"):
        fedgp.fit(GPSpec(), mr.federation, strategy, rounds=2)
    # a mean linear in its parameters that fedgp does not know by type is accepted (checked numerically)

    class Quadratic(gpytorch.means.Mean):
        def __init__(self):
            super().__init__()
            self.register_parameter("a", torch.nn.Parameter(torch.zeros(3)))

        def forward(self, x):
            return (x**2) @ self.a

    quad = linear_model(GPSpec(kernel=ZeroKernel(), mean=Quadratic()))
    X = torch.randn(5, 3, dtype=torch.float64)
    assert torch.allclose(quad.features(X), X**2)


def test_anchor_pool_must_hold_enough_clients():
    mr = gaussian_mixed_regression(k=3, d=3, sizes=[5] * 20 + [30] * 2, noise=0.1, seed=0)
    strategy = C.two_phase(3, phase1=MomentDescentInit(num_anchors=4, anchor_pool=30))
    with pytest.raises(ValueError, match="holds 2 clients, fewer than the 4 anchors"):
        fedgp.fit(linear_spec(3, 0.01), mr.federation, strategy, rounds=1)
    with pytest.raises(ValueError, match="threshold"):
        MomentDescentInit(merge="threshold")


def test_anchors_come_from_the_data_rich_clients_by_default():
    mr = su_xu_yang_setting("C2", 0)
    strategy = C.two_phase(3, phase1=MomentDescentInit(iterations=1))
    server = strategy.initialize(
        fedgp.messages.ServerContext(
            linear_spec(100, 0.04), mr.federation.sizes, mr.federation.weights, [], 0
        ),
        np.random.default_rng(0),
    )
    anchors = server.init.anchors
    assert len(anchors) == 10 and bool((mr.federation.sizes[anchors] == 50).all())


def test_merging_by_threshold_and_agglomeration():
    theta = torch.tensor([[0.0, 0], [0.1, 0], [5, 5], [5.1, 5], [5, 5.2], [-9, 0]], dtype=torch.float64)
    centres, groups = merge_anchors(theta, 2, delta=2.0, method="threshold")
    assert groups.tolist() == [1, 1, 0, 0, 0, -1]  # largest component first; the singleton dropped
    assert torch.allclose(centres[0], theta[2:5].mean(0))
    centres, groups = merge_anchors(theta, 3, delta=None)
    assert len(centres) == 3 and len(set(groups.tolist())) == 3
    centres, _ = merge_anchors(theta[:2], 2, delta=2.0, method="threshold")
    assert len(centres) == 1  # fewer than k: the caller refills


def test_a_cluster_without_anchors_is_refilled_from_the_worst_fitting_rich_client():
    d, k = 6, 3
    # 3 data-rich clients per cluster; only 2 anchors, so at least one cluster has none
    mr = gaussian_mixed_regression(k=k, d=d, sizes=[8] * 60 + [60] * 9, noise=0.05, labels="balanced", seed=5)
    spec = linear_spec(d, 0.0025)
    delta = separation(mr.thetas)
    phase1 = MomentDescentInit(num_anchors=2, iterations=4, delta=delta, theta0_scale=0.5, refill_ridge=0.01)
    strategy = C.two_phase(k, lr=0.3, phase1=phase1)
    with pytest.warns(RuntimeWarning, match="seeded"):
        result = fedgp.fit(
            spec, mr.federation, strategy, engine=ENGINE, rounds=strategy.init_rounds + 40, seed=0
        )
    assert "refill" in result.history["stage"].tolist()
    assert max_matched_error(result.state[W][..., 0], mr.thetas) < 0.1 * delta


@pytest.mark.parametrize(
    "option",
    [
        {"pairing": "first_pair"},
        {"anchor_pairing": "disjoint"},
        {"sigma_hat": "sv"},
        {"sign_fix": "loss_check"},
        {"merge": "agglomerative", "delta": None},
    ],
    ids=lambda o: next(iter(o)),
)
def test_phase_1_variants_also_find_the_clusters(option):
    mr = gaussian_mixed_regression(k=2, d=8, sizes=[20] * 60, noise=0.1, seed=4)
    delta = separation(mr.thetas)
    settings = dict(num_anchors=4, iterations=4, theta0_scale=0.3, anchor_pool="all", delta=delta) | option
    centres, _ = phase1_centres(linear_spec(8, 0.01), mr.federation, MomentDescentInit(**settings), 2, seed=0)
    assert max_matched_error(centres, mr.thetas) < 0.5 * delta
