"""The posterior of a client too large for one n×n matrix, by preconditioned CG: the exact posterior
to the solver's tolerance, whichever way the kernel is evaluated."""

import gpytorch
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import fedgp
from fedgp.data import ClientData, Federation
from fedgp.errors import ConvergenceError
from fedgp.models import iterative, large
from fedgp.models.posterior import condition

from .test_large import data, spec_of


@pytest.fixture
def iterative_above_300(monkeypatch):
    """Clients above 300 rows are solved iteratively, in tiles of 128 and test blocks of 64 (so
    tiles, blocks and their remainders are exercised on small data)."""
    monkeypatch.setattr(large, "LARGE_CLIENT_ROWS", 300)
    monkeypatch.setattr(iterative, "ITERATIVE_CLIENT_ROWS", 300)
    monkeypatch.setattr(iterative, "TILE", 128)
    monkeypatch.setattr(iterative, "TEST_BLOCK", 64)


def gpytorch_exact(monkeypatch, *args, **kwargs):
    monkeypatch.setattr(large, "LARGE_CLIENT_ROWS", 10**9)  # GPyTorch's own exact prediction
    return condition(*args, **kwargs)


KERNELS = {
    "rbf-ard": lambda: gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=3)),
    "rbf": lambda: gpytorch.kernels.RBFKernel(),
    "matern12": lambda: gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel(0.5, ard_num_dims=3)),
    "matern32": lambda: gpytorch.kernels.MaternKernel(1.5),
    "matern52": lambda: gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel(2.5, ard_num_dims=3)),
    "periodic (called as a module)": lambda: gpytorch.kernels.ScaleKernel(gpytorch.kernels.PeriodicKernel()),
}


@given(
    name=st.sampled_from(sorted(KERNELS)),
    lengthscale=st.lists(st.floats(0.05, 5.0), min_size=3, max_size=3),
    outputscale=st.floats(0.01, 20.0),
    shift=st.floats(-50.0, 50.0),
)
def test_the_kernel_tiles_are_gpytorchs_kernel(name, lengthscale, outputscale, shift):
    """Every tile equals the module's own evaluation, for any hyper-parameters and inputs far from
    the origin (where the squared-norm expansion would lose digits without the centring)."""
    kernel = KERNELS[name]().double()
    base = kernel.base_kernel if isinstance(kernel, gpytorch.kernels.ScaleKernel) else kernel
    base.lengthscale = torch.tensor(lengthscale, dtype=torch.float64)[: base.lengthscale.shape[-1]]
    if base is not kernel:
        kernel.outputscale = outputscale
    g = torch.Generator().manual_seed(0)
    A = shift + torch.rand(40, 3, generator=g, dtype=torch.float64)
    B = torch.cat([A[:5], shift + torch.rand(25, 3, generator=g, dtype=torch.float64)])  # some equal rows
    with torch.no_grad():
        tiles = iterative.kernel_tiles(kernel, A.mean(0, keepdim=True))
        torch.testing.assert_close(tiles(A, B), kernel(A, B).to_dense(), rtol=1e-11, atol=1e-12)


def test_the_preconditioner_is_the_inverse_of_the_nystrom_matrix(monkeypatch):
    """P⁻¹R against a dense solve with P = K_nm K_mm⁻¹ K_mn + D built from the same landmarks."""
    monkeypatch.setattr(iterative, "PRECONDITIONER_RANK", 40)
    monkeypatch.setattr(iterative, "TILE", 64)
    X, _, _ = data(300)
    kernel = KERNELS["rbf-ard"]().double()
    noise = 0.01 + torch.rand(300, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    with torch.no_grad():
        tiles = iterative.kernel_tiles(kernel, X.mean(0, keepdim=True))
        apply = iterative._nystrom_preconditioner(tiles, X, noise)
        landmarks = X[torch.randperm(300, generator=torch.Generator().manual_seed(0))[:40]]
        Knm = kernel(X, landmarks).to_dense()
        P = Knm @ torch.linalg.solve(kernel(landmarks).to_dense(), Knm.T) + torch.diag(noise)
    R = torch.randn(300, 3, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    torch.testing.assert_close(apply(R), torch.linalg.solve(P, R), rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("kernel", ["rbf", "matern"])
def test_the_iterative_path_is_gpytorchs_exact_posterior(iterative_above_300, monkeypatch, kernel):
    """Mean, both variances and the joint covariance over 150 test points (three blocks)."""
    spec = spec_of(kernel)
    state = spec.state({"likelihood.noise_covar.noise": 0.02, "mean_module.raw_constant": 0.4})
    X, y, Xs = data(700)
    got = condition(spec, state, X, y, Xs, "big", full_cov=True)
    want = gpytorch_exact(monkeypatch, spec, state, X, y, Xs, "big", full_cov=True)
    for field in ("mean", "variance_f", "variance_y", "covariance_f"):
        torch.testing.assert_close(getattr(got, field), getattr(want, field), rtol=1e-7, atol=1e-9)


def test_known_noise_per_point_is_used(iterative_above_300, monkeypatch):
    spec = spec_of("rbf", gpytorch.likelihoods.FixedNoiseGaussianLikelihood(noise=torch.ones(1) * 0.1))
    X, y, Xs = data(450, seed=1)
    noise = 0.01 + 0.2 * torch.rand(450, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    got = condition(spec, spec.initial_state(), X, y, Xs, "big", noise=noise)
    want = gpytorch_exact(monkeypatch, spec, spec.initial_state(), X, y, Xs, "big", noise=noise)
    torch.testing.assert_close(got.mean, want.mean, rtol=1e-7, atol=1e-9)
    torch.testing.assert_close(got.variance_y, want.variance_y, rtol=1e-7, atol=1e-9)


def test_the_path_is_chosen_by_size_and_by_free_memory(monkeypatch):
    """Above LARGE_CLIENT_ROWS the one-matrix path, above ITERATIVE_CLIENT_ROWS (or where the matrix
    does not fit in free memory) conjugate gradients."""
    monkeypatch.setattr(large, "LARGE_CLIENT_ROWS", 300)
    monkeypatch.setattr(iterative, "ITERATIVE_CLIENT_ROWS", 500)
    taken = []
    for name, module, function in (
        ("one matrix", large, "large_posterior"),
        ("iterative", iterative, "iterative_posterior"),
    ):
        solver = getattr(module, function)

        def recording(*args, _solver=solver, _name=name, **kwargs):
            taken.append(_name)
            return _solver(*args, **kwargs)

        monkeypatch.setattr(module, function, recording)
    spec = spec_of("rbf")
    for n in (400, 600):
        condition(spec, spec.initial_state(), *data(n), "big")
    monkeypatch.setattr(large, "_available_bytes", lambda: 10**6)
    condition(spec, spec.initial_state(), *data(400), "big")
    assert taken == ["one matrix", "iterative", "iterative"]


def test_a_solve_that_does_not_converge_names_the_client_and_the_residual(iterative_above_300, monkeypatch):
    monkeypatch.setattr(iterative, "CG_MAX_ITERATIONS", 1)
    monkeypatch.setattr(iterative, "PRECONDITIONER_RANK", 1)
    spec = spec_of("rbf")
    state = spec.state({"likelihood.noise_covar.noise": 1e-3})
    with pytest.raises(ConvergenceError, match=r"client 'big'.*residual of .* not 1e-10, in 1 iterations"):
        condition(spec, state, *data(400), "big")


@pytest.mark.parametrize("engine", ["sequential", "batched"])
def test_a_large_client_in_a_federation_predicts_as_gpytorch_does(iterative_above_300, monkeypatch, engine):
    X, y, Xs = data(800, seed=2)
    clients = [ClientData(X, y, id="big")] + [ClientData(*data(40, seed=s)[:2], id=f"s{s}") for s in (4, 5)]
    result = fedgp.fit(
        spec_of("rbf"), Federation(clients), fedgp.strategies.FGPR(), rounds=2, seed=0, engine=engine
    )
    got = result.posterior(Xs, "big")
    monkeypatch.setattr(large, "LARGE_CLIENT_ROWS", 10**9)
    want = result.posterior(Xs, "big")
    torch.testing.assert_close(got.mean, want.mean, rtol=1e-7, atol=1e-9)
    torch.testing.assert_close(got.variance_y, want.variance_y, rtol=1e-7, atol=1e-9)
