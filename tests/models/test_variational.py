"""The sparse variational GP (VariationalGPSpec): each client's q(u) against the closed forms
(Titsias's optimal q and bound, the exact GP when Z = X), the non-Gaussian predictives against
their closed forms, GPyTorch's own SVGP, and federated fits that recover what the data hold."""

import gpytorch
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fedgp
from fedgp.data import ClientData, Federation
from fedgp.errors import InputError, InputTypeError
from fedgp.models.posterior import condition
from fedgp.synthetic import gp_federation
from fedgp.transforms import Standardize, Transforms

DT = torch.float64


def _values(noise=0.05, lengthscale=0.3, outputscale=1.3):
    return {
        "likelihood.noise_covar.noise": noise,
        "covar_module.base_kernel.lengthscale": lengthscale,
        "covar_module.outputscale": outputscale,
    }


def titsias(spec, model, X, y, Xs):
    """Titsias (2009) by hand: the collapsed bound per point and the SGPR predictive at ``Xs``."""
    k, s2 = model.covar_module, float(model.likelihood.noise.detach())
    Z = model.variational_strategy.inducing_points.detach()
    n, M = len(y), len(Z)
    with torch.no_grad():
        Kuu = k(Z).to_dense() + 1e-6 * torch.eye(M, dtype=DT)  # GPyTorch's variational jitter
        L = torch.linalg.cholesky(Kuu)
        A = torch.linalg.solve_triangular(L, k(Z, X).to_dense(), upper=False)  # whitened, (M, n)
        As = torch.linalg.solve_triangular(L, k(Z, Xs).to_dense(), upper=False)
        Qff = A.T @ A
        cov = Qff + s2 * torch.eye(n, dtype=DT)
        fit = torch.distributions.MultivariateNormal(torch.zeros(n, dtype=DT), cov).log_prob(y)
        # GPyTorch adds the same jitter to q(f)'s variances: the trace term sees it too.
        trace = (k(X, diag=True) + 1e-6 - Qff.diagonal()).sum() / (2 * s2)
        # The optimal whitened q(v) = N(m, S): S = (I + A Aᵀ / s2)⁻¹, m = S A y / s2.
        S = torch.cholesky_inverse(torch.linalg.cholesky(torch.eye(M, dtype=DT) + A @ A.T / s2))
        mean = As.T @ (S @ A @ y) / s2
        var = k(Xs, diag=True) - (As * As).sum(0) + (As * (S @ As)).sum(0)
    return float((fit - trace) / n), mean, var


@settings(max_examples=8, deadline=None)
@given(
    n=st.integers(5, 60),
    M=st.integers(1, 12),
    d=st.integers(1, 3),
    noise=st.floats(0.01, 1.0),
    lengthscale=st.floats(0.1, 2.0),
    seed=st.integers(0, 2**16),
)
def test_a_gaussian_clients_q_is_titsiass_optimum(n, M, d, noise, lengthscale, seed):
    """One natural-gradient step of size 1 gives the optimal q(u): the bound is Titsias's collapsed
    bound and the predictive is SGPR's, for any data, θ and inducing points."""
    g = torch.Generator().manual_seed(seed)
    X, Z, Xs = (torch.rand(m, d, generator=g, dtype=DT) for m in (n, M, 7))
    y = torch.sin(5 * X.sum(-1)) + 0.3 * torch.randn(n, generator=g, dtype=DT)
    spec = fedgp.VariationalGPSpec(Z, initial_values=_values(noise, lengthscale))
    model = spec.build()
    bound = spec.fit_personal(model, X, y)
    expected, mean, var = titsias(spec, model, X, y, Xs)
    assert bound == pytest.approx(expected, rel=1e-8, abs=1e-8)
    p = spec.predictive(model, Xs)
    assert torch.allclose(p.mean, mean, rtol=1e-6, atol=1e-8)
    assert torch.allclose(p.variance_f, var + 1e-6, rtol=1e-6, atol=1e-8)
    assert torch.allclose(p.variance_y, p.variance_f + noise, rtol=1e-12)


def test_inducing_points_at_the_data_give_the_exact_posterior():
    """With Z = X (M = n) the SVGP's personal posterior is the exact GP's, up to GPyTorch's 1e-6
    variational jitter."""
    g = torch.Generator().manual_seed(0)
    X = torch.rand(40, 2, generator=g, dtype=DT)
    y = torch.cos(4 * X[:, 0]) + 0.2 * torch.randn(40, generator=g, dtype=DT)
    Xs = torch.rand(9, 2, generator=g, dtype=DT)
    svgp = fedgp.VariationalGPSpec(X, initial_values=_values(0.04), learn_inducing_locations=False)
    model = svgp.build()
    svgp.fit_personal(model, X, y)
    approx = svgp.predictive(model, Xs, full_cov=True)
    exact_spec = fedgp.GPSpec(initial_values=_values(0.04))
    exact = condition(exact_spec, exact_spec.initial_state(), X, y, Xs, full_cov=True)
    assert torch.allclose(approx.mean, exact.mean, atol=1e-4)
    assert torch.allclose(approx.variance_f, exact.variance_f, atol=1e-4)
    assert torch.allclose(approx.covariance_f, exact.covariance_f, atol=1e-4)
    assert "variational_strategy.inducing_points" not in svgp.trainable_names


def _gpytorch_svgp_bound(spec, model, X, y, steps=1500):
    """GPyTorch's own SVGP (Cholesky-parametrised q, whitened), θ and Z copied, q fitted by Adam."""

    class SVGP(gpytorch.models.ApproximateGP):
        def __init__(self):
            Z = model.variational_strategy.inducing_points.detach().clone()
            q = gpytorch.variational.CholeskyVariationalDistribution(len(Z))
            vs = gpytorch.variational.VariationalStrategy(self, Z, q, learn_inducing_locations=False)
            super().__init__(vs)
            self.mean_module = gpytorch.means.ZeroMean()
            self.covar_module = model.covar_module

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))

    other = SVGP().to(DT)
    elbo = gpytorch.mlls.VariationalELBO(model.likelihood, other, num_data=len(y))
    optimizer = torch.optim.Adam(other.variational_parameters(), lr=0.05)
    other.train()
    for _ in range(steps):
        optimizer.zero_grad()
        loss = -elbo(other(X), y)
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        return float(elbo(other(X), y))


@pytest.mark.parametrize(
    "likelihood,draw",
    [
        (
            gpytorch.likelihoods.BernoulliLikelihood(),
            lambda f, g: (torch.rand(len(f), generator=g, dtype=DT) < torch.sigmoid(3 * f)).to(DT),
        ),  # fmt: skip
        (gpytorch.likelihoods.PoissonLikelihood(), lambda f, g: torch.poisson(torch.exp(f), generator=g)),
        (
            gpytorch.likelihoods.StudentTLikelihood(),
            lambda f, g: f + 0.1 * torch.distributions.StudentT(2.5).sample((len(f),)).to(DT),
        ),
    ],
    ids=["bernoulli", "poisson", "student_t"],
)
def test_a_non_gaussian_clients_q_maximises_the_bound(likelihood, draw):
    """The damped natural-gradient steps reach the bound that GPyTorch's own SVGP reaches with Adam on
    a Cholesky-parametrised q (an independent implementation of the bound, too)."""
    torch.manual_seed(3)
    g = torch.Generator().manual_seed(1)
    X = torch.rand(80, 1, generator=g, dtype=DT)
    y = draw(torch.sin(6 * X[:, 0]), g)
    Z = torch.linspace(0, 1, 8, dtype=DT).unsqueeze(-1)
    spec = fedgp.VariationalGPSpec(
        Z, likelihood=likelihood, initial_values={"covar_module.base_kernel.lengthscale": 0.3}
    )
    model = spec.build()
    ours = spec.fit_personal(model, X, y)
    theirs = _gpytorch_svgp_bound(spec, model, X, y)
    assert ours >= theirs - 1e-5
    assert ours == pytest.approx(theirs, abs=1e-3)


def test_non_gaussian_predictives_match_their_closed_forms():
    """Bernoulli (probit): P(y = 1) = Φ(μ / √(1 + σ²)) exactly; Poisson (GPyTorch's softplus link,
    λ = log(1 + e^f)): E[y] = E[λ], Var[y] = E[λ] + Var[λ], the 20-node quadrature against a dense
    trapezoid rule over ±12 σ."""
    from fedgp.models.variational import _moments

    mu = torch.tensor([-1.5, 0.0, 0.7, 2.0], dtype=DT)
    var = torch.tensor([0.1, 0.5, 1.0, 0.05], dtype=DT)
    p, v = _moments(gpytorch.likelihoods.BernoulliLikelihood(), mu, var)
    expected = torch.distributions.Normal(0.0, 1.0).cdf(mu / (1 + var).sqrt())
    assert torch.allclose(p, expected, atol=1e-12)
    assert torch.allclose(v, expected * (1 - expected), atol=1e-12)
    m, v = _moments(gpytorch.likelihoods.PoissonLikelihood().to(DT), mu, var)  # as a spec holds it
    z = torch.linspace(-12, 12, 200_001, dtype=DT).unsqueeze(-1)
    f = mu + var.sqrt() * z
    weight = torch.exp(-0.5 * z**2) / (2 * torch.pi) ** 0.5
    rate = torch.nn.functional.softplus(f)
    first = torch.trapezoid(weight * rate, z, dim=0)
    second = torch.trapezoid(weight * rate**2, z, dim=0)
    assert torch.allclose(m, first, rtol=1e-5)
    assert torch.allclose(v, first + second - first**2, rtol=1e-4)


def test_federated_svgp_recovers_the_exact_fgprs_fit():
    """FGPR with an SVGP of 24 inducing points on GP draws: θ and test RMSE close to exact FGPR's."""
    data = gp_federation(num_clients=4, n=120, d=1, n_test=20, seed=2)
    strategy = fedgp.strategies.FGPR()
    exact = fedgp.fit(data.spec, data.federation, strategy, rounds=60, engine="sequential", seed=0)
    spec = fedgp.VariationalGPSpec(24, data.spec.kernel, input_dim=1)
    svgp = fedgp.fit(spec, data.federation, strategy, rounds=60, engine="sequential", seed=0)
    for name in ("likelihood.noise_covar.noise", "covar_module.base_kernel.lengthscale"):
        assert float(svgp.state[name]) == pytest.approx(float(exact.state[name]), rel=0.35), name
    rmse_exact, rmse_svgp = exact.evaluate()["rmse"].mean(), svgp.evaluate()["rmse"].mean()
    assert rmse_svgp < 1.1 * rmse_exact


def _labelled(num_clients=4, n=150, seed=0):
    g = torch.Generator().manual_seed(seed)
    clients = []
    for k in range(num_clients):
        X = torch.rand(n + 60, 2, generator=g, dtype=DT)
        f = torch.sin(6 * X[:, 0]) + torch.cos(5 * X[:, 1])
        y = (torch.rand(n + 60, generator=g, dtype=DT) < torch.sigmoid(4 * f)).to(DT)
        clients.append(ClientData(X[:n], y[:n], id=f"owner{k}", X_test=X[n:], y_test=y[n:]))
    return Federation(clients)


def test_federated_classification_reports_its_own_metrics():
    """Bernoulli labels: the outcome is left as it is, evaluate reports accuracy, Brier score and
    log-loss, and the classifier beats the majority class clearly."""
    fed = _labelled()
    spec = fedgp.VariationalGPSpec(16, likelihood=gpytorch.likelihoods.BernoulliLikelihood(), input_dim=2)
    result = fedgp.fit(spec, fed, fedgp.strategies.FGPR(), rounds=25, engine="sequential", seed=0)
    scores = result.evaluate()
    assert list(scores.columns) == ["client", "n_test", "rmse", "nll", "accuracy", "brier", "cluster"]
    majority = max(float(c.y_test.mean()) for c in fed)
    assert scores["accuracy"].mean() > max(0.8, majority + 0.1)
    assert torch.allclose(torch.tensor(scores["rmse"].values) ** 2, torch.tensor(scores["brier"].values))
    probability, variance = result.predict(fed[0].X_test, client=0, observation_noise=True)
    assert bool(((probability > 0) & (probability < 1)).all())
    assert torch.allclose(variance, probability * (1 - probability))
    posterior = result.posterior(fed[0].X_test, client=0)
    expected = torch.distributions.Normal(0.0, 1.0).cdf(
        posterior.latent_mean / (1 + posterior.variance_f).sqrt()
    )
    assert torch.allclose(posterior.mean, expected, atol=1e-12)  # the probit predictive of the latent f
    assert result.transform.y_scale is None or float(result.transform.y_scale) == 1.0


def test_what_a_variational_spec_refuses():
    fed = _labelled(num_clients=2, n=30)
    bernoulli = gpytorch.likelihoods.BernoulliLikelihood()
    with pytest.raises(InputError, match="input_dim"):
        fedgp.VariationalGPSpec(8)
    with pytest.raises(InputError, match="finite"):
        fedgp.VariationalGPSpec(torch.tensor([[float("nan")]]))
    with pytest.raises(InputTypeError, match="FixedNoise"):
        fedgp.VariationalGPSpec(
            4, likelihood=gpytorch.likelihoods.FixedNoiseGaussianLikelihood(torch.ones(3)), input_dim=1
        )
    with pytest.raises(InputTypeError, match="VariationalGPSpec"):
        fedgp.GPSpec(likelihood=bernoulli)
    spec = fedgp.VariationalGPSpec(4, likelihood=bernoulli, input_dim=3)
    # The default kernel is built for Z's 3 columns: the width check names the client and both widths.
    with pytest.raises(InputError, match="ard_num_dims=3 but client 'owner0' has 2 input features"):
        fedgp.fit(spec, fed, rounds=1, engine="sequential")
    spec = fedgp.VariationalGPSpec(4, likelihood=bernoulli, input_dim=2)
    with pytest.raises(InputError, match="Standardize"):
        fedgp.fit(spec, fed, rounds=1, engine="sequential", transforms=Transforms(outcome=Standardize()))
    result = fedgp.fit(spec, fed, rounds=1, engine="sequential")
    with pytest.raises(InputError, match="Gaussian"):
        result.predict(fed[0].X_test, combine="rbcm")
    with pytest.raises(InputTypeError, match="cannot save"):
        result.save("unused")
    with pytest.raises(InputTypeError, match="VariationalGPSpec"):
        result.to_gpytorch(0)


@pytest.mark.filterwarnings("ignore:the batched engine evaluates this spec client by client")
def test_the_batched_engine_runs_it_client_by_client_with_the_same_numbers():
    data = gp_federation(num_clients=5, n=[30, 12, 25, 18, 40], d=2, n_test=5, seed=1)
    spec = fedgp.VariationalGPSpec(6, data.spec.kernel, input_dim=2)
    runs = [
        fedgp.fit(spec, data.federation, rounds=3, engine=engine, seed=4)
        for engine in ("sequential", fedgp.engines.Batched(chunk_size=2))
    ]
    for name in spec.names:
        assert torch.allclose(runs[0].state[name], runs[1].state[name], rtol=1e-10, atol=1e-12), name
    assert runs[0].evaluate().equals(runs[1].evaluate())


def test_state_names_and_round_trip():
    spec = fedgp.VariationalGPSpec(5, input_dim=3)
    assert spec.names[0] == "variational_strategy.inducing_points"
    assert spec.event_shapes["variational_strategy.inducing_points"] == torch.Size([5, 3])
    assert not any("_variational_distribution" in n for n in spec.names)
    state = spec.state({"likelihood.noise_covar.noise": 0.2})
    model = spec.build()
    spec.load(model, state)
    assert spec.read(model).allclose(state)
