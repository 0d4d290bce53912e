"""The compiled minibatch step computes what the tensor path (StationaryGram + GaussianNLL) computes."""

import pytest
import torch

import fedgp
from fedgp import GPSpec
from fedgp.engines import compiled
from fedgp.engines.batched import BatchedEngine
from fedgp.engines.tensor_gp import GaussianNLL, StationaryGram
from fedgp.strategies import FGPR, IFCA
from fedgp.synthetic import gp_federation

pytestmark = pytest.mark.skipif(not compiled.available(), reason="numba is not installed")


def random_case(B, M, d, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    Z = (torch.rand(B, M, d, generator=g, dtype=torch.float64) / 0.4).to(dtype)
    s = (0.5 + torch.rand(B, generator=g, dtype=torch.float64)).to(dtype)
    noise = (0.01 + 0.2 * torch.rand(B, generator=g, dtype=torch.float64)).to(dtype)
    r = torch.randn(B, M, generator=g, dtype=torch.float64).to(dtype)
    n = torch.randint(2, M + 1, (B,), generator=g)
    n[: B // 2] = M
    return [t.requires_grad_() for t in (Z, s, noise, r)], n


def tensor_path(Z, s, noise, r, n, nu):
    mask = torch.arange(Z.shape[1]) < n.unsqueeze(1)
    K = torch.where(
        mask.unsqueeze(-1) & mask.unsqueeze(-2),
        StationaryGram.apply(Z, s, noise, nu),
        torch.eye(Z.shape[1], dtype=Z.dtype),
    )
    r = torch.where(mask, r, torch.zeros((), dtype=r.dtype))
    return GaussianNLL.apply(K, r, n.to(Z.dtype), list(range(len(n))))


@pytest.mark.parametrize("nu", [None, 1.5, 2.5], ids=["rbf", "matern32", "matern52"])
@pytest.mark.parametrize("B,M,d", [(21, 32, 5), (3, 7, 1), (9, 64, 3)])
def test_loss_and_gradients_match_the_tensor_path(nu, B, M, d):
    inputs, n = random_case(B, M, d)
    ours = compiled.stationary_nll(*inputs, n, nu)
    ref = tensor_path(*inputs, n, nu)
    assert torch.allclose(ours, ref, rtol=1e-12, atol=1e-13)
    weights = torch.randn(B, dtype=torch.float64)  # a non-uniform upstream gradient
    for a, b in zip(
        torch.autograd.grad((ours * weights).sum(), inputs),
        torch.autograd.grad((ref * weights).sum(), inputs),
    ):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-12)


def test_gradcheck():
    inputs, n = random_case(4, 6, 2)
    assert torch.autograd.gradcheck(lambda *t: compiled.stationary_nll(*t, n, 1.5), inputs)


def test_float32_stays_close_to_float64():
    inputs, n = random_case(16, 32, 3)
    ours = compiled.stationary_nll(*[t.detach().float() for t in inputs], n, None)
    assert ours.dtype == torch.float32
    ref = compiled.stationary_nll(*[t.detach() for t in inputs], n, None)
    assert torch.allclose(ours.double(), ref, rtol=1e-4)


def test_a_matrix_that_needs_jitter_returns_none():
    inputs, n = random_case(5, 8, 2)
    Z, s, noise, r = (t.detach().clone() for t in inputs)
    Z[3] = 0.0  # all points equal: K = s·11ᵀ + σ²I with σ² ≈ 0 in row 3
    noise[3] = 0.0
    assert compiled.stationary_nll(Z, s, noise, r, n, None) is None


def test_engines_agree_with_and_without_the_compiled_step():
    draws = gp_federation(num_clients=6, n=[40, 25, 60, 33, 48, 70], d=2, n_test=5, seed=4)
    for strategy in (FGPR(local_epochs=1, batch_size=16), IFCA(num_clusters=2, local_steps=3, batch_size=20)):
        runs = [
            fedgp.fit(
                draws.spec,
                draws.federation,
                strategy,
                engine=fedgp.engines.Batched(compiled=c, chunk_size=4),
                rounds=3,
            )
            for c in (False, True)
        ]
        sequential = fedgp.fit(draws.spec, draws.federation, strategy, engine="sequential", rounds=3)
        assert runs[0].state.max_relative_difference(runs[1].state) < 1e-10
        assert sequential.state.max_relative_difference(runs[1].state) < 1e-8


def test_compiled_true_needs_a_stationary_kernel():
    import gpytorch

    draws = gp_federation(num_clients=2, n=10, d=1, seed=0)
    periodic = GPSpec(kernel=gpytorch.kernels.ScaleKernel(gpytorch.kernels.PeriodicKernel()))
    with pytest.raises(ValueError, match="compiled=True needs an RBF or Matérn kernel"):
        BatchedEngine(periodic, draws.federation, 0, compiled=True)
    assert BatchedEngine(draws.spec, draws.federation, 0, compiled=True).gp.compiled
    assert not BatchedEngine(draws.spec, draws.federation, 0, compiled=False).gp.compiled
