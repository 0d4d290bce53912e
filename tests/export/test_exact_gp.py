"""to_gpytorch / to_botorch: a client's model in GPyTorch or BoTorch predicts what fedgp predicts."""

import importlib.util

import gpytorch
import pytest
import torch

import fedgp
from fedgp.data import ClientData

needs_botorch = pytest.mark.skipif(
    importlib.util.find_spec("botorch") is None, reason="BoTorch is an optional extra ('botorch')"
)


@pytest.fixture(scope="module")
def ifca_fit():
    # Clustered, so a client's model depends on which state it picked: the export must pick it too.
    g = torch.Generator().manual_seed(0)
    clients = []
    for i in range(6):
        X = torch.rand(25, 2, generator=g, dtype=torch.float64)
        sign = 1.0 if i % 2 else -1.0
        y = sign * (torch.sin(6 * X[:, 0]) + X[:, 1]) + 0.05 * torch.randn(
            25, generator=g, dtype=torch.float64
        )
        clients.append(ClientData(X, y, id=i))
    spec = fedgp.GPSpec(
        gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel(nu=2.5, ard_num_dims=2)),
        gpytorch.means.LinearMean(2),
    )
    strategy = fedgp.strategies.IFCA(num_clusters=2, local_steps=3, lr=0.05, init="spec", init_scale=0.3)
    fed = fedgp.data.Federation(clients)
    result = fedgp.fit(
        spec, fed, strategy, engine="batched", rounds=4, callbacks=[fedgp.run.Evaluate(every=0)]
    )
    # The default transforms apply: the exports must map to and from the original units.
    assert result.transform.y_offset is not None and result.transform.x_offset is not None
    return fed, result


def _inputs(n=8):
    return torch.rand(n, 2, generator=torch.Generator().manual_seed(9), dtype=torch.float64)


@pytest.mark.parametrize("which", ["position", "id", "new client"])
def test_to_gpytorch_predicts_like_fedgp(ifca_fit, which):
    fed, result = ifca_fit
    client = {"position": 3, "id": 4, "new client": ClientData(fed[1].X[:9], fed[1].y[:9], id="new")}[which]
    model = result.to_gpytorch(client)
    assert isinstance(model, gpytorch.models.ExactGP) and not model.training
    X = _inputs()
    with torch.no_grad():
        latent = model(X)
        noisy = model.likelihood(latent)
    pred = result.posterior(X, client, full_cov=True)
    assert torch.allclose(latent.mean, pred.mean, rtol=0, atol=1e-10)
    assert torch.allclose(latent.covariance_matrix, pred.covariance_f, rtol=0, atol=1e-10)
    assert torch.allclose(noisy.variance, pred.variance_y, rtol=0, atol=1e-10)
    # The two clusters disagree in sign, so taking the other cluster's state would show here.
    weights = result.state["mean_module.weights"]
    assert (weights[0] - weights[1]).abs().max() > 0.05  # far above the 1e-10 the predictions agree to


def test_to_gpytorch_from_a_loaded_result(ifca_fit, tmp_path):
    fed, result = ifca_fit
    loaded = fedgp.load(result.save(tmp_path / "ifca.safetensors"))
    new = ClientData(fed[2].X, fed[2].y, id="again")
    X = _inputs()
    with torch.no_grad():
        back = loaded.to_gpytorch(new)(X)
    assert torch.allclose(back.mean, result.posterior(X, new).mean, rtol=0, atol=1e-10)


@needs_botorch
def test_to_botorch_posterior_matches_fedgp(ifca_fit):
    from botorch.acquisition.logei import qLogExpectedImprovement
    from botorch.models import SingleTaskGP

    fed, result = ifca_fit
    model = result.to_botorch(2)
    assert isinstance(model, SingleTaskGP) and not model.training
    assert not any(p.requires_grad for p in model.parameters())  # the learned prior stays as learned
    X = _inputs()
    pred = result.posterior(X, 2, full_cov=True)
    post = model.posterior(X)
    assert torch.allclose(post.mean.squeeze(-1), pred.mean, rtol=0, atol=1e-8)
    assert torch.allclose(post.variance.squeeze(-1), pred.variance_f, rtol=0, atol=1e-8)
    assert torch.allclose(post.mvn.covariance_matrix, pred.covariance_f, rtol=0, atol=1e-8)
    noisy = model.posterior(X, observation_noise=True)
    assert torch.allclose(noisy.variance.squeeze(-1), pred.variance_y, rtol=0, atol=1e-8)
    assert post.rsample(torch.Size([5])).shape == (5, 8, 1)
    # Acquisition values compute: one per point (q = 1) and one for a q = 3 batch.
    acq = qLogExpectedImprovement(model, best_f=fed[2].y.max())
    values = acq(X.unsqueeze(1))
    assert values.shape == (8,) and torch.isfinite(values).all()
    assert acq(X[:3].unsqueeze(0)).shape == (1,)


def test_exports_with_each_clients_own_standardisation():
    from fedgp.transforms import Standardize

    fed = fedgp.synthetic.gp_federation(num_clients=3, n=15, d=2, seed=4).federation
    shifted = fedgp.data.Federation(
        [ClientData(c.X, 40.0 * c.y + 100.0 * i, id=c.id) for i, c in enumerate(fed)]
    )
    result = fedgp.fit(
        fedgp.GPSpec(),
        shifted,
        rounds=2,
        transforms=fedgp.transforms.Transforms(outcome=Standardize(local=True)),
    )
    assert result.transform.y_local
    X = _inputs(5)
    pred = result.posterior(X, 2, full_cov=True)
    with torch.no_grad():
        latent = result.to_gpytorch(2)(X)
    assert torch.allclose(latent.mean, pred.mean, rtol=0, atol=1e-9)  # client 2's targets sit near 200
    assert torch.allclose(latent.covariance_matrix, pred.covariance_f, rtol=0, atol=1e-9)
    if importlib.util.find_spec("botorch") is None:
        return
    post = result.to_botorch(2).posterior(X)
    assert torch.allclose(post.mean.squeeze(-1), pred.mean, rtol=0, atol=1e-8)
    assert torch.allclose(post.mvn.covariance_matrix, pred.covariance_f, rtol=0, atol=1e-8)


@needs_botorch
def test_to_botorch_trainable_fine_tunes_from_the_federated_prior(ifca_fit):
    """Frozen by default (fit_gpytorch_mll has nothing to fit); trainable=True starts at the
    federated values and fit_gpytorch_mll moves them up this client's own likelihood."""
    from botorch.fit import fit_gpytorch_mll
    from gpytorch.mlls import ExactMarginalLogLikelihood

    fed, result = ifca_fit
    frozen = result.to_botorch(2)
    with pytest.raises(RuntimeError, match="No parameters"):
        fit_gpytorch_mll(ExactMarginalLogLikelihood(frozen.likelihood, frozen))
    model = result.to_botorch(2, trainable=True)
    start = {k: v.clone() for k, v in model.named_parameters()}
    trainable = {k for k, v in model.named_parameters() if v.requires_grad}
    assert trainable and torch.allclose(model.posterior(_inputs()).mean, frozen.posterior(_inputs()).mean)
    mll = ExactMarginalLogLikelihood(model.likelihood, model)
    model.train()
    before = float(mll(model(*model.train_inputs), model.train_targets))
    fit_gpytorch_mll(mll)
    model.train()
    after = float(mll(model(*model.train_inputs), model.train_targets))
    assert after >= before - 1e-9
    assert any(not torch.equal(v, start[k]) for k, v in model.named_parameters() if k in trainable)
