"""The clustered strategies with a multi-output spec: a mean of the input features must not read the
output column, in the model (GPyTorch's path) or in the closed forms and Phase 1 (which evaluate the
mean themselves through :class:`~fedgp.models.linear.LinearMeanModel`)."""

import gpytorch
import pytest
import torch

import fedgp
from fedgp.data.client import ClientData, Federation
from fedgp.models import MultiOutputSpec, ZeroKernel
from fedgp.models.linear import linear_model
from fedgp.strategies import clustered as C

NOISE = "likelihood.noise_covar.noise"
W = "mean_module.weights"
THETAS = torch.tensor([[2.0, -1.0], [-1.5, 2.5]], dtype=torch.float64)


def _owners(n_owners: int = 8, n: int = 30, seed: int = 0) -> Federation:
    """Owners of two clusters of linear regression, each holding 2 outputs of one θ: rows (x, t, y)
    with y = xᵀθ_c + noise for either output t (the output column is no feature of the mean)."""
    clients = []
    for k in range(n_owners):
        g = torch.Generator().manual_seed(1000 * seed + k)
        X = torch.randn(n, 2, generator=g, dtype=torch.float64)
        t = torch.randint(0, 2, (n, 1), generator=g).to(torch.float64)
        y = X @ THETAS[k % 2] + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)
        clients.append(ClientData(torch.cat([X, t], 1), y, id=k))
    return Federation(clients)


def _spec() -> MultiOutputSpec:
    """Noise-only linear regression on the two features (the task covariance multiplies a zero
    kernel; fixed with the noise, so only the mean trains): the closed forms apply."""
    mean = gpytorch.means.LinearMean(2, bias=False)
    fixed = [NOISE, "task_covar_module.covar_factor", "task_covar_module.var"]
    return MultiOutputSpec(ZeroKernel(), mean, outputs=2, initial_values={NOISE: 0.01}, fixed=fixed)


def test_a_mean_of_the_features_reads_them_without_the_output_column():
    fed, spec = _owners(), _spec()
    assert linear_model(spec).noise_only  # so "auto" below takes the closed forms
    phi = linear_model(spec).features(fed[0].X, fed[0])
    assert torch.equal(phi, fed[0].X[:, :-1])  # on the old code: X itself, output column included


@pytest.mark.parametrize(
    "make",
    [
        lambda closed: C.ifca(
            2, lr=0.3, local_steps=3, initializer=C.RandomInit(scale=0.5), closed_form=closed
        ),
        lambda closed: C.one_shot(2, lr=0.3, local_steps=3, closed_form=closed),
    ],
    ids=["ifca", "one_shot"],
)
def test_closed_forms_equal_gpytorchs_path_for_a_multi_output_spec(make):
    """The noise-only closed forms (``closed_form="auto"``) give GPyTorch's path's states (``"never"``)
    to 1e-9, and both find the two clusters' θ. On the old code the closed forms took the output
    column for a feature: every client failed the round (3 features for 2 weights)."""
    fed, spec = _owners(), _spec()
    states = {
        closed: fedgp.fit(spec, fed, make(closed), engine="sequential", rounds=25, seed=2).server_state.states
        for closed in ("auto", "never")
    }
    assert states["auto"].allclose(states["never"], rtol=1e-9, atol=1e-12)
    found = states["auto"][W].reshape(-1, 2, 2)[0]
    for theta in THETAS:  # each true θ is one cluster's state, within the noise
        assert float((found - theta).norm(dim=-1).min()) < 0.1


def test_two_phase_moment_descent_finds_the_clusters_of_a_multi_output_spec():
    """Phase 1 (federated moment descent) reads the features through the same map: on the old code
    each client's moments were of X with its output column and the round failed on their shapes."""
    fed, spec = _owners(n_owners=12, n=40), _spec()
    result = fedgp.fit(
        spec, fed, C.two_phase(2, lr=0.3, local_steps=3), engine="sequential", rounds=12, seed=0
    )
    found = result.server_state.states[W].reshape(-1, 2, 2)[0]
    for theta in THETAS:
        assert float((found - theta).norm(dim=-1).min()) < 0.1
