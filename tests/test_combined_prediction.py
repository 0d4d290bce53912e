"""``FitResult.posterior(X, combine=...)``: one prediction from every client's own posterior."""

import gpytorch
import pytest
import torch

import fedgp
from fedgp.data import ClientData, Federation
from fedgp.errors import InputError
from fedgp.models.experts import RULES, combine_experts
from fedgp.run.combined import shared_prior
from fedgp.transforms import Standardize, Transforms


def truth(X):
    return torch.sin(6 * X[:, 0]) + torch.cos(4 * X[:, 1])


def quadrant_owners(n=50, seed=1):
    """Four owners, each holding one quadrant of the unit square: no owner sees the whole."""
    g = torch.Generator().manual_seed(seed)
    clients = []
    for k, corner in enumerate([(0.0, 0.0), (0.5, 0.0), (0.0, 0.5), (0.5, 0.5)]):
        X = torch.rand(n, 2, generator=g, dtype=torch.float64) * 0.5 + torch.tensor(
            corner, dtype=torch.float64
        )
        clients.append(
            ClientData(
                X, 3.0 + truth(X) + 0.1 * torch.randn(n, generator=g, dtype=torch.float64), id=f"owner{k}"
            )
        )
    return Federation(clients)


def constant_mean_spec():
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=2))
    return fedgp.GPSpec(kernel=kernel, mean=gpytorch.means.ConstantMean())


@pytest.fixture(scope="module", params=["sequential", "batched"])
def fitted(request):
    """A constant mean, so the BCM and rBCM means carry the prior mean's term."""
    fed = quadrant_owners()
    return fedgp.fit(
        constant_mean_spec(), fed, fedgp.strategies.FGPR(), rounds=15, seed=0, engine=request.param
    )


@pytest.fixture(scope="module")
def points():
    return torch.rand(120, 2, generator=torch.Generator().manual_seed(7), dtype=torch.float64)


@pytest.mark.parametrize("rule", RULES)
def test_the_combination_is_the_rule_applied_to_each_clients_own_posterior(fitted, points, rule):
    each = [fitted.posterior(points, k) for k in range(4)]
    prior_mean, prior_var = shared_prior(fitted, points)
    mean, var = combine_experts(
        torch.stack([p.mean for p in each]),
        torch.stack([p.variance_f for p in each]),
        rule,
        prior_mean,
        prior_var,
    )
    got = fitted.posterior(points, combine=rule)
    torch.testing.assert_close(got.mean, mean, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(got.variance_f, var, rtol=1e-10, atol=0)
    torch.testing.assert_close(got.variance_y - got.variance_f, each[0].variance_y - each[0].variance_f)
    assert fitted.predict(points, combine=rule)[0].equal(got.mean)


def test_the_prior_is_the_learned_kernel_in_the_datas_units(fitted, points):
    """RBF in a ScaleKernel: prior variance outputscale · sd², prior mean offset + sd · constant."""
    state, transform = fitted.state, fitted.transform
    offset, scale = float(transform.y_offset), float(transform.y_scale)
    mean, var = shared_prior(fitted, points)
    torch.testing.assert_close(var, torch.full_like(var, float(state["covar_module.outputscale"]) * scale**2))
    torch.testing.assert_close(
        mean, torch.full_like(mean, offset + scale * float(state["mean_module.raw_constant"]))
    )


def test_committees_approach_the_centralised_gp_where_single_owners_and_the_prior_cannot(fitted, points):
    """The centralised exact GP under the learned hyper-parameters is the shared prior conditioned on
    the pooled data (a new client holding every row). BCM and rBCM come close to it over the whole
    square; each owner alone knows a quadrant and the prior knows none."""
    fed = fitted.federation
    pooled = ClientData(torch.cat([c.X for c in fed]), torch.cat([c.y for c in fed]), id="pooled")
    central = fitted.posterior(points, pooled)
    y = 3.0 + truth(points)
    best_owner = min(fitted.posterior(points, k).rmse(y) for k in range(4))
    prior_rmse = float((shared_prior(fitted, points)[0] - y).pow(2).mean().sqrt())
    for rule in ("bcm", "rbcm"):
        combined = fitted.posterior(points, combine=rule)
        assert combined.rmse(y) < 2 * central.rmse(y) + 0.02, rule
        assert combined.rmse(y) < best_owner / 3 and combined.rmse(y) < prior_rmse / 5, rule
        assert float((combined.mean - central.mean).abs().max()) < 0.25, rule
    # PoE counts the prior four times: narrower than BCM everywhere
    assert bool(
        (
            fitted.posterior(points, combine="poe").variance_f
            <= fitted.posterior(points, combine="bcm").variance_f + 1e-12
        ).all()
    )


def test_asking_wrongly_is_a_clear_error(fitted, points, tmp_path):
    with pytest.raises(InputError, match="not neither"):
        fitted.posterior(points)
    with pytest.raises(InputError, match="not both"):
        fitted.posterior(points, 0, combine="rbcm")
    with pytest.raises(InputError, match="marginal variances only"):
        fitted.posterior(points, full_cov=True, combine="bcm")
    with pytest.raises(InputError, match="combine='best'"):
        fitted.posterior(points, combine="best")
    with pytest.raises(InputError, match=r"shape \(n, 2\) for the model"):
        fitted.posterior(points[:, :1], combine="gpoe")
    loaded = fedgp.load(fitted.save(tmp_path / "m.fedgp"))
    with pytest.raises(InputError, match="no client data, so no client can act as an expert"):
        loaded.posterior(points, combine="gpoe")


def test_committees_that_divide_out_the_prior_refuse_experts_with_different_priors(points):
    fed = quadrant_owners(n=20)
    spec = fedgp.synthetic.gp_spec(2, "rbf")
    clustered = fedgp.fit(spec, fed, fedgp.strategies.IFCA(num_clusters=2), rounds=2, seed=0)
    with pytest.raises(InputError, match="one per cluster"):
        clustered.posterior(points, combine="rbcm")
    assert clustered.posterior(points, combine="gpoe").mean.shape == (120,)
    local = fedgp.fit(
        spec,
        fed,
        fedgp.strategies.FGPR(),
        rounds=2,
        seed=0,
        transforms=Transforms(outcome=Standardize(local=True)),
    )
    with pytest.raises(InputError, match="Standardize\\(local=True\\)"):
        local.posterior(points, combine="bcm")
    torch.testing.assert_close(
        local.posterior(points, combine="poe").mean,
        combine_experts(
            torch.stack([local.posterior(points, k).mean for k in range(4)]),
            torch.stack([local.posterior(points, k).variance_f for k in range(4)]),
            "poe",
        )[0],
    )
