"""The batched engine computes what the sequential engine computes (float64, 1e-8)."""

import gpytorch
import pandas as pd
import pytest
import torch

import fedgp
from fedgp import GPSpec
from fedgp.data import ClientData, Federation
from fedgp.engines.batched import BatchedEngine, BatchedOps
from fedgp.engines.tensor_gp import GaussianNLL, StationaryGram
from fedgp.errors import FactorizationError
from fedgp.messages import Task
from fedgp.models import ZeroKernel
from fedgp.strategies import FGPR, IFCA
from fedgp.synthetic import gp_federation, mixed_linear_regression

RTOL = 1e-8


def both(spec, fed, strategy, rounds=4, seed=3, **batched_options):
    seq = fedgp.fit(spec, fed, strategy, engine="sequential", rounds=rounds, seed=seed)
    bat = fedgp.fit(
        spec, fed, strategy, engine=fedgp.engines.Batched(**batched_options), rounds=rounds, seed=seed
    )
    return seq, bat


def assert_same(seq, bat, rtol=RTOL):
    assert seq.state.max_relative_difference(bat.state) < rtol
    a, b = seq.history.select_dtypes("number"), bat.history.select_dtypes("number")
    pd.testing.assert_frame_equal(a, b, check_exact=False, rtol=rtol, atol=1e-12)


@pytest.fixture(scope="module")
def equal():
    return gp_federation(num_clients=8, n=60, d=2, n_test=10, seed=0)


@pytest.fixture(scope="module")
def unequal():
    return gp_federation(num_clients=7, n=[12, 30, 45, 70, 18, 90, 25], d=3, n_test=8, seed=1)


@pytest.mark.parametrize(
    "strategy",
    [
        FGPR(local_steps=5, batch_size=32),
        FGPR(local_steps=3, batch_size=16, optimizer="sgd", lr=0.5, average_space="raw"),
        IFCA(num_clusters=2, aggregation="model", local_steps=3, batch_size=16, restarts=2),
        IFCA(num_clusters=3, aggregation="gradient", lr=0.05, restarts=2),
        IFCA(num_clusters=2, aggregation="gradient", lr=0.05, gradient_batch_size=20),
    ],
    ids=["fgpr-adam", "fgpr-sgd-raw", "ifca-model", "ifca-gradient", "ifca-gradient-minibatch"],
)
def test_engines_agree_on_equal_clients(equal, strategy):
    seq, bat = both(equal.spec, equal.federation, strategy)
    assert_same(seq, bat)


@pytest.mark.parametrize(
    "strategy",
    [
        FGPR(local_epochs=1, batch_size=16),  # unequal step counts: masking
        FGPR(local_steps=4, batch_size=32, clients_per_round=5, sampling="weighted"),  # duplicates
        FGPR(local_steps=3, batch_size=16, clients_per_round=3, sampling="uniform", prox_mu=0.1),
        FGPR(local_epochs=2, batch_size=20, minibatch="nearest"),
        IFCA(num_clusters=2, aggregation="model", local_epochs=1, batch_size=16, restarts=2),
    ],
    ids=["epochs", "partial-weighted", "partial-uniform-prox", "nearest", "ifca-epochs"],
)
def test_engines_agree_on_unequal_clients(unequal, strategy):
    seq, bat = both(unequal.spec, unequal.federation, strategy, chunk_size=3)
    assert_same(seq, bat)


def test_chunk_size_does_not_change_the_result(unequal):
    strategy = FGPR(local_epochs=1, batch_size=16)
    runs = [
        fedgp.fit(
            unequal.spec,
            unequal.federation,
            strategy,
            engine=fedgp.engines.Batched(chunk_size=c, memory_mb=m),
            rounds=3,
        )
        for c, m in ((1, 256.0), (4, 0.01), (1000, 256.0))
    ]
    for other in runs[1:]:
        assert runs[0].state.max_relative_difference(other.state) < 1e-12


def test_batched_personalised_prediction_matches_per_client(unequal):
    result = fedgp.fit(
        unequal.spec,
        unequal.federation,
        FGPR(local_steps=3),
        engine="sequential",
        rounds=3,
        transforms=None,  # the engine below holds the raw data
    )
    engine = BatchedEngine(unequal.spec, unequal.federation, 0, chunk_size=4, memory_mb=0.05)
    X = torch.rand(9, 3, dtype=torch.float64)
    everyone = torch.arange(len(unequal.federation))
    shared, _ = result.strategy.configure_personal(result.server_state, result.context, everyone)
    for ops in engine.chunks(everyone, 0):
        states, _ = result.strategy.personal_state(ops, Task("evaluate", 0, shared))
        at_test, at_x = ops.predict(states), ops.predict(states, X)
        for j, i in enumerate(ops.indices.tolist()):
            ref = result.posterior(unequal.federation[i].X_test, i)
            ref_x = result.posterior(X, i)
            for ours, theirs in ((at_test[j], ref), (at_x[j], ref_x)):
                assert torch.allclose(ours.mean, theirs.mean, rtol=1e-8, atol=1e-10)
                assert torch.allclose(ours.variance_f, theirs.variance_f, rtol=1e-6, atol=1e-10)
                assert torch.allclose(ours.variance_y, theirs.variance_y, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize(
    "kernel",
    [
        gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()),
        gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=3)),
        gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel(nu=1.5, ard_num_dims=3)),
        gpytorch.kernels.MaternKernel(nu=2.5),
    ],
    ids=["rbf", "rbf-ard", "matern32-ard", "matern52-unscaled"],
)
def test_fused_stationary_gram_matches_gpytorch(kernel):
    spec = GPSpec(kernel=kernel)
    engine = BatchedEngine(spec, gp_federation(num_clients=2, n=5, d=3, seed=0).federation, 0)
    assert engine.gp.fast is not None
    g = torch.Generator().manual_seed(1)
    X = torch.rand(4, 9, 3, generator=g, dtype=torch.float64)
    raw = spec.to_raw(spec.initial_state()).map(
        lambda v, e: (v + 0.3 * torch.randn(4, *v.shape, generator=g, dtype=v.dtype)).requires_grad_()
    )
    ours = engine.gp.train_covariance(dict(raw), X, None)
    noise = engine.gp.noise_variance(dict(raw)).reshape(-1, 1, 1)
    generic = engine.gp.kernel(dict(raw), X, X) + noise * torch.eye(9, dtype=torch.float64)
    assert torch.allclose(ours, generic, rtol=1e-10, atol=1e-12)
    weights = torch.randn(4, 9, 9, generator=g, dtype=torch.float64)
    names = spec.names
    g_ours = torch.autograd.grad((ours * weights).sum(), [raw[k] for k in names])
    g_ref = torch.autograd.grad((generic * weights).sum(), [raw[k] for k in names])
    for a, b in zip(g_ours, g_ref):
        assert torch.allclose(a, b, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("nu", [None, 1.5, 2.5])
def test_custom_backwards_pass_gradcheck(nu):
    g = torch.Generator().manual_seed(2)
    Z = torch.rand(3, 5, 2, generator=g, dtype=torch.float64, requires_grad=True)
    s = (torch.rand(3, generator=g, dtype=torch.float64) + 0.5).requires_grad_()
    noise = (torch.rand(3, generator=g, dtype=torch.float64) + 0.1).requires_grad_()
    assert torch.autograd.gradcheck(lambda Z, s, noise: StationaryGram.apply(Z, s, noise, nu), (Z, s, noise))
    # K enters symmetrically (the backward returns the symmetric gradient), so check through A -> AAᵀ + I
    A = torch.randn(3, 5, 5, generator=g, dtype=torch.float64, requires_grad=True)
    r = torch.randn(3, 5, generator=g, dtype=torch.float64, requires_grad=True)
    n = torch.full((3,), 5.0, dtype=torch.float64)
    eye = torch.eye(5, dtype=torch.float64)
    assert torch.autograd.gradcheck(
        lambda A, r: GaussianNLL.apply(A @ A.transpose(-1, -2) + eye, r, n, [0, 1, 2]), (A, r)
    )


def test_generic_path_linear_mean_and_other_kernels_agree():
    mr = mixed_linear_regression(k=2, d=4, m=6, n=[10, 20, 15, 30, 12, 25], noise=0.1, seed=0)
    spec = GPSpec(
        kernel=ZeroKernel(),
        mean=gpytorch.means.LinearMean(4, bias=True),
        initial_values={"likelihood.noise_covar.noise": 0.01},
        fixed=["likelihood.noise_covar.noise"],
    )
    seq, bat = both(
        spec,
        mr.federation,
        IFCA(num_clusters=2, aggregation="gradient", lr=0.02, restarts=2, init="bernoulli"),
        rounds=5,
    )
    assert_same(seq, bat)
    periodic = GPSpec(
        kernel=gpytorch.kernels.ScaleKernel(gpytorch.kernels.PeriodicKernel())
        + gpytorch.kernels.ScaleKernel(gpytorch.kernels.LinearKernel()),
        mean=gpytorch.means.ConstantMean(),
    )
    draws = gp_federation(num_clients=4, n=[20, 30, 25, 40], d=1, seed=2)
    seq, bat = both(periodic, draws.federation, FGPR(local_epochs=1, batch_size=10, lr=0.02), rounds=3)
    assert_same(seq, bat, rtol=1e-7)


def test_specs_the_tensor_path_cannot_evaluate_fall_back_to_gpytorch_per_client():
    draws = gp_federation(num_clients=3, n=[10, 14, 12], d=1, seed=0)
    hetero = GPSpec(
        likelihood=gpytorch.likelihoods.GaussianLikelihood(
            noise_constraint=gpytorch.constraints.Interval(1e-4, 1.0)
        )
    )
    assert BatchedEngine(hetero, draws.federation, 0).gp is not None  # a different constraint is fine
    other = GPSpec(likelihood=gpytorch.likelihoods.GaussianLikelihoodWithMissingObs())
    with pytest.warns(UserWarning, match="client by client with GPyTorch"):
        assert BatchedEngine(other, draws.federation, 0).gp is None
    with pytest.raises(ValueError, match="compiled=True"):
        BatchedEngine(other, draws.federation, 0, compiled=True)
    seq, bat = both(other, draws.federation, FGPR(local_steps=3, batch_size=8), rounds=2)
    assert_same(seq, bat, rtol=1e-12)


def test_factorisation_failure_names_the_client():
    clients = [
        ClientData(torch.linspace(0, 1, 6, dtype=torch.float64)[:, None], torch.arange(6.0), id="ok"),
        ClientData(
            torch.zeros(6, 1, dtype=torch.float64),
            torch.linspace(0, 1, 6, dtype=torch.float64),
            id="engine-9",
        ),
    ]
    spec = GPSpec(
        likelihood=gpytorch.likelihoods.GaussianLikelihood(
            noise_constraint=gpytorch.constraints.GreaterThan(1e-12)
        )
    )
    engine = BatchedEngine(spec, Federation(clients), 0)
    ops = BatchedOps(engine, torch.arange(2), 0)
    state = spec.state({"covar_module.outputscale": 1e14, "likelihood.noise_covar.noise": 1e-12})
    # the message names the failing client(s); "ok" may fail too at this outputscale
    with pytest.raises(FactorizationError, match=r"client .*'engine-9'.*not positive definite"):
        ops.nll(state.expand(2))


def test_float32_minibatches_stay_close_to_float64(equal):
    strategy = FGPR(local_steps=5, batch_size=32)
    seq, bat = both(equal.spec, equal.federation, strategy, rounds=5, minibatch_dtype=torch.float32)
    assert bat.state["covar_module.outputscale"].dtype == torch.float64
    assert seq.state.max_relative_difference(bat.state) < 1e-3
    with pytest.raises(ValueError, match="minibatch_dtype"):
        BatchedEngine(equal.spec, equal.federation, 0, minibatch_dtype=torch.float16)
