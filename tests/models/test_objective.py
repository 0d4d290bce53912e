"""The local objective and its gradient against the closed forms of FGPR §2.1."""

import math

import pytest
import torch

from fedgp.data import ClientData
from fedgp.engines.sequential import SequentialOps
from fedgp.models import minibatch_nll
from fedgp.synthetic.draws import gp_spec


def rbf_case(seed=0, M=17, d=2):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(M, d, generator=g, dtype=torch.float64)
    y = torch.randn(M, generator=g, dtype=torch.float64)
    spec = gp_spec(d)
    state = spec.state(
        {
            "covar_module.outputscale": 1.7,
            "covar_module.base_kernel.lengthscale": [[0.3, 0.8]],
            "likelihood.noise_covar.noise": 0.05,
        }
    )
    return spec, state, X, y


def closed_form(state, X, y):
    """NLL/M and ½Tr[K⁻¹(I − yyᵀK⁻¹)∂K/∂θ]/M for θ = (outputscale, ℓ1, ℓ2, noise)."""
    s = state["covar_module.outputscale"]
    ls = state["covar_module.base_kernel.lengthscale"].reshape(-1)
    noise = state["likelihood.noise_covar.noise"].reshape(())
    M = len(y)
    D = (X[:, None, :] - X[None, :, :]) ** 2  # (M, M, d)
    R = torch.exp(-0.5 * (D / ls**2).sum(-1))
    K = s * R + noise * torch.eye(M, dtype=X.dtype)
    Kinv = torch.linalg.inv(K)
    nll = 0.5 * (y @ Kinv @ y + torch.logdet(K) + M * math.log(2 * math.pi)) / M
    A = Kinv - (Kinv @ y)[:, None] * (Kinv @ y)[None, :]  # K⁻¹(I − yyᵀK⁻¹)
    dK = {"outputscale": R, "noise": torch.eye(M, dtype=X.dtype)}
    for j in range(len(ls)):
        dK[f"ls{j}"] = s * R * D[..., j] / ls[j] ** 3
    grads = {k: 0.5 * torch.trace(A @ v) / M for k, v in dK.items()}
    return nll, grads


def test_minibatch_nll_matches_closed_form():
    spec, state, X, y = rbf_case()
    model = spec.build()
    spec.load(model, state)
    ours = minibatch_nll(model, X, y)
    expected, _ = closed_form(state, X, y)
    assert float(ours) == pytest.approx(float(expected), rel=1e-10)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_autograd_gradient_matches_trace_formula(seed):
    spec, state, X, y = rbf_case(seed)
    ops = SequentialOps(spec, spec.build(), ClientData(X, y, id="c"), 0, 0, 0)
    loss, raw_grad = ops.gradient(state.expand(1))
    expected_loss, expected = closed_form(state, X, y)
    assert float(loss) == pytest.approx(float(expected_loss), rel=1e-10)
    raw = spec.to_raw(state)
    # chain rule: dL/draw = dL/dθ · softplus'(raw) = dL/dθ · sigmoid(raw)
    chain = {name: torch.sigmoid(raw[name]) for name in raw}
    got_os = raw_grad["covar_module.outputscale"][0] / chain["covar_module.outputscale"]
    got_noise = raw_grad["likelihood.noise_covar.noise"][0] / chain["likelihood.noise_covar.noise"]
    got_ls = (
        raw_grad["covar_module.base_kernel.lengthscale"][0] / chain["covar_module.base_kernel.lengthscale"]
    ).reshape(-1)
    assert float(got_os) == pytest.approx(float(expected["outputscale"]), rel=1e-8)
    assert float(got_noise) == pytest.approx(float(expected["noise"]), rel=1e-8)
    for j in range(2):
        assert float(got_ls[j]) == pytest.approx(float(expected[f"ls{j}"]), rel=1e-8)
