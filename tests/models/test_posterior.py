import gpytorch
import pytest
import torch

from fedgp import GPSpec
from fedgp.data import ClientData
from fedgp.data.synthetic import gp_spec
from fedgp.engines.sequential import SequentialOps
from fedgp.models import FactorizationError, condition


def test_posterior_matches_equation_1():
    g = torch.Generator().manual_seed(3)
    X, Xs = (
        torch.rand(12, 1, generator=g, dtype=torch.float64),
        torch.rand(5, 1, generator=g, dtype=torch.float64),
    )
    y = torch.sin(6 * X[:, 0])
    spec = gp_spec(1)
    state = spec.state(
        {
            "covar_module.outputscale": 1.3,
            "covar_module.base_kernel.lengthscale": [[0.2]],
            "likelihood.noise_covar.noise": 0.01,
        }
    )
    pred = condition(spec, state, X, y, Xs)

    def k(a, b):
        return 1.3 * torch.exp(-0.5 * (a - b.T) ** 2 / 0.04)

    K = k(X, X) + 0.01 * torch.eye(12, dtype=torch.float64)
    mean = k(Xs, X) @ torch.linalg.solve(K, y)
    var = 1.3 - (k(Xs, X) @ torch.linalg.solve(K, k(X, Xs))).diagonal()
    assert torch.allclose(pred.mean, mean, rtol=1e-9)
    assert torch.allclose(pred.variance_f, var, rtol=1e-7)
    assert torch.allclose(pred.variance_y, var + 0.01, rtol=1e-7)
    lo, hi = pred.confidence_region(0.95)
    assert torch.allclose(hi - pred.mean, 1.959963984540054 * var.sqrt(), rtol=1e-9)


def test_factorisation_failure_names_the_client():
    X = torch.zeros(30, 1, dtype=torch.float64)  # every input identical
    y = torch.linspace(0, 1, 30, dtype=torch.float64)
    spec = GPSpec(
        likelihood=gpytorch.likelihoods.GaussianLikelihood(
            noise_constraint=gpytorch.constraints.GreaterThan(1e-12)
        )
    )
    state = spec.state({"covar_module.outputscale": 1e14, "likelihood.noise_covar.noise": 1e-12})
    ops = SequentialOps(spec, spec.build(), ClientData(X, y, id="engine-17"), 0, 0, 0)
    with pytest.raises(
        FactorizationError,
        match=r"client 'engine-17': local NLL: covariance matrix not positive definite",
    ):
        ops.nll(state.expand(1))
    with pytest.raises(FactorizationError, match="client 'engine-17': posterior"):
        condition(spec, state, X, y, X[:2], client="engine-17")
