"""The posterior of a large client in one n×n matrix: GPyTorch's exact posterior, to round-off."""

import gpytorch
import pytest
import torch

import fedgp
from fedgp.data import ClientData, Federation
from fedgp.errors import FactorizationError, InputError
from fedgp.models import large
from fedgp.models.posterior import condition


@pytest.fixture
def small_threshold(monkeypatch):
    """Clients above 300 rows take the large path, evaluated in blocks of 128 (so blocks and their
    remainders are exercised on small data)."""
    monkeypatch.setattr(large, "LARGE_CLIENT_ROWS", 300)
    monkeypatch.setattr(large, "BLOCK", 128)


def spec_of(kernel: str, likelihood=None):
    base = {"rbf": gpytorch.kernels.RBFKernel(ard_num_dims=3), "matern": gpytorch.kernels.MaternKernel(1.5)}[
        kernel
    ]
    return fedgp.GPSpec(
        kernel=gpytorch.kernels.ScaleKernel(base), mean=gpytorch.means.ConstantMean(), likelihood=likelihood
    )


def data(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, 3, generator=g, dtype=torch.float64)
    y = torch.sin(4 * X).sum(1) + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)
    return X, y, torch.rand(150, 3, generator=g, dtype=torch.float64)


def both_paths(monkeypatch, spec, state, X, y, Xs, noise=None):
    got = condition(spec, state, X, y, Xs, "big", full_cov=True, noise=noise)
    monkeypatch.setattr(large, "LARGE_CLIENT_ROWS", 10**9)  # GPyTorch's own exact prediction
    want = condition(spec, state, X, y, Xs, "big", full_cov=True, noise=noise)
    return got, want


@pytest.mark.parametrize("kernel", ["rbf", "matern"])
def test_the_large_path_is_gpytorchs_exact_posterior(small_threshold, monkeypatch, kernel):
    spec = spec_of(kernel)
    state = spec.state({"likelihood.noise_covar.noise": 0.02, "mean_module.raw_constant": 0.4})
    got, want = both_paths(monkeypatch, spec, state, *data(700))
    for field in ("mean", "variance_f", "variance_y", "covariance_f"):
        torch.testing.assert_close(getattr(got, field), getattr(want, field), rtol=1e-9, atol=1e-11)


def test_known_noise_per_point_is_used(small_threshold, monkeypatch):
    spec = spec_of("rbf", gpytorch.likelihoods.FixedNoiseGaussianLikelihood(noise=torch.ones(1) * 0.1))
    X, y, Xs = data(450, seed=1)
    noise = 0.01 + 0.2 * torch.rand(450, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    got, want = both_paths(monkeypatch, spec, spec.initial_state(), X, y, Xs, noise)
    torch.testing.assert_close(got.mean, want.mean, rtol=1e-9, atol=1e-11)
    torch.testing.assert_close(got.variance_f, want.variance_f, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("engine", ["sequential", "batched"])
def test_a_large_client_in_a_federation_predicts_as_gpytorch_does(small_threshold, monkeypatch, engine):
    """One client of 800 rows among three of 40, on both engines: its posterior through the large
    path, the small ones' as before."""
    X, y, Xs = data(800, seed=2)
    clients = [ClientData(X, y, id="big")] + [
        ClientData(*data(40, seed=s)[:2], id=f"s{s}") for s in (4, 5, 6)
    ]
    result = fedgp.fit(
        spec_of("rbf"), Federation(clients), fedgp.strategies.FGPR(), rounds=3, seed=0, engine=engine
    )
    got = [result.posterior(Xs, c) for c in ("big", "s4")]
    monkeypatch.setattr(large, "LARGE_CLIENT_ROWS", 10**9)
    want = [result.posterior(Xs, c) for c in ("big", "s4")]
    for a, b in zip(got, want):
        torch.testing.assert_close(a.mean, b.mean, rtol=1e-9, atol=1e-10)
        torch.testing.assert_close(a.variance_y, b.variance_y, rtol=1e-9, atol=1e-11)


def test_repeated_inputs_with_almost_no_noise_are_factorised(small_threshold):
    spec = spec_of("rbf")
    state = spec.state({"likelihood.noise_covar.noise": 1e-4})
    X, y, Xs = data(200)
    X, y = torch.cat([X, X]), torch.cat([y, y])
    model = spec.build()
    spec.load(model, state)
    pred = large.large_posterior(model, X, y, Xs)
    assert all(bool(torch.isfinite(t).all()) for t in pred[:3])


@pytest.mark.parametrize("n", [1, 127, 128, 129, 300, 517])
def test_the_blocked_factor_in_place_is_the_cholesky_factor(monkeypatch, n):
    monkeypatch.setattr(large, "BLOCK", 128)
    g = torch.Generator().manual_seed(n)
    B = torch.randn(n, n + 3, generator=g, dtype=torch.float64)
    A = B @ B.T + 0.1 * torch.eye(n, dtype=torch.float64)
    want = torch.linalg.cholesky(A)
    buffer = A.clone()
    assert large._cholesky_in_place(buffer) == 0
    torch.testing.assert_close(buffer.tril(), want, rtol=1e-10, atol=1e-10)


def test_a_matrix_that_is_not_positive_definite_is_reported_at_its_block(monkeypatch):
    monkeypatch.setattr(large, "BLOCK", 128)
    A = torch.eye(300, dtype=torch.float64)
    A[200, 200] = -1.0
    assert 129 <= large._cholesky_in_place(A) <= 256


def test_a_matrix_the_machine_cannot_hold_is_refused_naming_the_client_and_the_memory(monkeypatch):
    """Called directly, the one-matrix path refuses; fedgp's prediction goes iterative instead
    (tests/models/test_iterative.py)."""
    monkeypatch.setattr(large, "_available_bytes", lambda: 10**6)
    spec = spec_of("rbf")
    model = spec.build()
    with pytest.raises(InputError, match=r"client 'big'.* 400×400 matrix, 0.0 GiB.*0.0 GiB free.*iterative"):
        large.large_posterior(model, *data(400), "big")


def test_a_covariance_that_stays_singular_names_the_client(small_threshold, monkeypatch):
    """A factor failing every time: the jitter retries run out, and the client is named."""
    tries = []

    def failing(A):
        tries.append(1)
        return 7

    monkeypatch.setattr(large, "_cholesky_in_place", failing)
    spec = spec_of("rbf")
    with pytest.raises(FactorizationError, match="client 'big'.*pivot 7"):
        condition(spec, spec.initial_state(), *data(400), "big")
    assert len(tries) == 1 + fedgp.models.objective.CHOLESKY_MAX_TRIES


def test_the_batched_engine_gives_a_large_clients_factor_its_threads(small_threshold, monkeypatch):
    """The batched engine keeps torch on one thread during a task (the compiled tiles take the
    threads); a large client's factor is one BLAS-bound computation and gets them back."""
    from fedgp.engines import cpus

    seen, factor = [], large._cholesky_in_place

    def recording(A):
        seen.append(torch.get_num_threads())
        return factor(A)

    monkeypatch.setattr(large, "_cholesky_in_place", recording)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        X, y, Xs = data(400)
        clients = [ClientData(X, y, id="big"), ClientData(*data(30, seed=9)[:2], id="small")]
        result = fedgp.fit(
            spec_of("rbf"), Federation(clients), fedgp.strategies.FGPR(), rounds=1, engine="batched"
        )
        result.posterior(Xs, "big")
    finally:
        torch.set_num_threads(before)
    assert seen == [min(2, cpus.usable_cpus())]
