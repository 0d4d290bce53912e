import gpytorch
import pytest
import torch

from fedgp import GPSpec
from fedgp.data import ClientData
from fedgp.engines.sequential import SequentialOps
from fedgp.errors import FactorizationError
from fedgp.models import condition
from fedgp.synthetic.draws import gp_spec


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


@pytest.fixture(scope="module")
def small_fit():
    import fedgp

    draws = fedgp.synthetic.gp_federation(num_clients=4, n=30, d=2, seed=1)
    strategy = fedgp.strategies.FGPR(local_steps=2, batch_size=10, lr=0.05)
    # Untransformed data, so the learned state is GPyTorch's to compare with as it stands.
    result = fedgp.fit(draws.spec, draws.federation, strategy, engine="sequential", rounds=3, transforms=None)
    return draws, result


def _gpytorch_posterior(spec, state, client, X):
    model = spec.build()
    spec.load(model, state)
    model.set_train_data(client.X, client.y, strict=False)
    model.eval()
    with torch.no_grad(), gpytorch.settings.fast_computations(False, False, False):
        return model(X)


@pytest.mark.parametrize("engine", ["sequential", "batched"])
def test_full_covariance_matches_gpytorch(small_fit, engine):
    import fedgp

    draws, result = small_fit
    if engine == "batched":
        strategy = result.strategy
        result = fedgp.fit(
            draws.spec, draws.federation, strategy, engine="batched", rounds=3, transforms=None
        )
    X = torch.rand(7, 2, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    client = draws.federation[2]
    pred = result.posterior(X, 2, full_cov=True)
    ref = _gpytorch_posterior(result.spec, result.state, client, X)
    assert torch.allclose(pred.covariance_f, ref.covariance_matrix, rtol=0, atol=1e-10)
    assert torch.allclose(pred.mean, ref.mean, rtol=0, atol=1e-10)
    assert torch.allclose(pred.covariance_f.diagonal(), pred.variance_f, rtol=0, atol=1e-10)
    noise = result.state["likelihood.noise_covar.noise"]
    assert torch.allclose(
        pred.covariance(observation_noise=True), ref.covariance_matrix + noise * torch.eye(7)
    )
    # Without the request, only marginals travel and the covariance is refused by name.
    plain = result.posterior(X, 2)
    assert plain.covariance_f is None
    with pytest.raises(ValueError, match="full_cov=True"):
        plain.covariance()


def test_to_distribution_and_sample(small_fit):
    _, result = small_fit
    X = torch.linspace(0, 1, 6, dtype=torch.float64).unsqueeze(-1).expand(6, 2).contiguous()
    pred = result.posterior(X, 1, full_cov=True)
    dist = pred.to_distribution()
    assert isinstance(dist, gpytorch.distributions.MultivariateNormal)
    assert torch.allclose(dist.covariance_matrix, pred.covariance_f)
    diag = result.posterior(X, 1).to_distribution(observation_noise=True)
    assert torch.allclose(diag.covariance_matrix, torch.diag(pred.variance_y))
    # Joint draws: reproducible from a generator, with the right mean and covariance.
    draws = pred.sample(20000, generator=torch.Generator().manual_seed(0))
    again = pred.sample(20000, generator=torch.Generator().manual_seed(0))
    assert draws.shape == (20000, 6) and torch.equal(draws, again)
    scale = pred.covariance_f.diagonal().sqrt().max()
    assert (draws.mean(0) - pred.mean).abs().max() < 5 * scale / 20000**0.5
    assert (torch.cov(draws.T) - pred.covariance_f).abs().max() < 0.05 * scale**2
    # Neighbouring inputs are strongly correlated: independent draws would not show it.
    corr = torch.corrcoef(draws.T)[0, 1]
    expected = pred.covariance_f[0, 1] / (pred.covariance_f[0, 0] * pred.covariance_f[1, 1]).sqrt()
    assert abs(float(corr - expected)) < 0.03
    independent = result.posterior(X, 1).sample(20000, generator=torch.Generator().manual_seed(0))
    assert abs(float(torch.corrcoef(independent.T)[0, 1])) < 0.03
    with pytest.raises(ValueError, match="n must be a positive int"):
        pred.sample(0)


def test_full_covariance_travels_through_bytes(small_fit):
    import fedgp

    draws, result = small_fit
    wire = fedgp.fit(
        result.spec,
        draws.federation,
        result.strategy,
        engine=fedgp.engines.Sequential(loopback=True),
        rounds=3,
        transforms=None,
    )
    X = torch.rand(4, 2, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    pred, ref = wire.posterior(X, 0, full_cov=True), result.posterior(X, 0, full_cov=True)
    assert torch.equal(pred.covariance_f, ref.covariance_f) and pred.covariance_f.shape == (4, 4)


def test_metrics_of_many_predictions_are_each_predictions_own():
    """Scored together (stacked by length), every prediction's RMSE, NLL and coverage are the
    formulas' values for it alone, bit for bit."""
    import math

    from fedgp.models.posterior import Prediction, prediction_metrics

    g = torch.Generator().manual_seed(0)
    predictions, targets = [], []
    for n in (3, 5, 3, 1, 5, 8):
        mean = torch.randn(n, generator=g, dtype=torch.float64)
        var_f = torch.rand(n, generator=g, dtype=torch.float64) + 0.01
        predictions.append(Prediction(mean, var_f, var_f + 0.1))
        targets.append(mean + 2 * torch.randn(n, generator=g, dtype=torch.float64))
    scored = prediction_metrics(predictions, targets)
    z = math.sqrt(2.0) * torch.special.erfinv(torch.tensor(0.95, dtype=torch.float64))
    for i, (p, y) in enumerate(zip(predictions, targets)):
        var = p.variance_y
        assert float(scored["rmse"][i]) == float(((p.mean - y) ** 2).mean().sqrt()) == p.rmse(y)
        nll = float((0.5 * (math.log(2 * math.pi) + var.log() + (y - p.mean) ** 2 / var)).mean())
        assert float(scored["nll"][i]) == nll == p.nll(y)
        inside = (y >= p.mean - z * var.sqrt()) & (y <= p.mean + z * var.sqrt())
        assert float(scored["coverage95"][i]) == float(inside.double().mean()) == p.coverage(y)
