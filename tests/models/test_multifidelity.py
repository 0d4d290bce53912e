"""AR1 and NARGP: closed forms, recovered ρ, and a case where the nonlinear map matters."""

import math

import numpy as np
import pytest
import torch
from linear_operator.utils.errors import NanError

from fedgp.errors import MLEError
from fedgp.models import condition
from fedgp.models.multifidelity import AR1, NARGP, mle_with_restarts, rbf_spec

# GPyTorch rounds tiny negative posterior variances (at training inputs) up to 1e-10 and warns.
pytestmark = pytest.mark.filterwarnings("ignore::gpytorch.utils.warnings.NumericalWarning")


def _rbf(A, B, outputscale, lengthscale):
    d2 = ((A[:, None, :] - B[None, :, :]) / lengthscale) ** 2
    return outputscale * np.exp(-0.5 * d2.sum(-1))


def _gp(Xtr, ytr, Xte, state, prior_mean_tr=0.0, prior_mean_te=0.0, d=None):
    """Textbook GP posterior (Rasmussen & Williams eq. 2.23-2.24) in numpy, from a fedgp state."""
    d = Xtr.shape[1] if d is None else d
    s = float(state["covar_module.outputscale"])
    ls = state["covar_module.base_kernel.lengthscale"].numpy().reshape(-1)
    noise = float(state["likelihood.noise_covar.noise"])
    K = _rbf(Xtr[:, :d], Xtr[:, :d], s, ls) + noise * np.eye(len(Xtr))
    Ks = _rbf(Xte[:, :d], Xtr[:, :d], s, ls)
    mean = prior_mean_te + Ks @ np.linalg.solve(K, ytr - prior_mean_tr)
    var = s - np.einsum("ij,ji->i", Ks, np.linalg.solve(K, Ks.T))
    return mean, var, noise


def _two_level(seed=0, n_low=40, n_high=8, rho=2.0):
    rng = np.random.default_rng(seed)
    xl, xh = rng.uniform(size=(n_low, 1)), rng.uniform(size=(n_high, 1))
    low = lambda x: np.sin(3 * np.pi * x[:, 0])  # noqa: E731  1.5 periods: 8 HF points alone are too few
    high = lambda x: rho * low(x) + (x[:, 0] - 0.5)  # noqa: E731  ρ f_l + a linear discrepancy
    t = torch.from_numpy
    return [(t(xl), t(low(xl))), (t(xh), t(high(xh)))], high


def test_ar1_prediction_matches_the_recursive_closed_form():
    levels, _ = _two_level()
    model = AR1(restarts=0).fit(levels)
    Xte = np.linspace(0, 1, 25)[:, None]
    (XL, yL), (XH, yH) = [(X.numpy(), y.numpy()) for X, y in levels]
    s0, s1 = model.states_
    mu_l_h, _, _ = _gp(XL, yL, XH, s0)
    mu_l_te, var_l_te, _ = _gp(XL, yL, Xte, s0)
    rho, c = float(s1["mean_module.rho"]), float(s1["mean_module.constant"])
    # HF: GP on the residual with prior mean ρ μ_L(x) + c; variance ρ² σ²_L + σ²_δ.
    mean, var_delta, noise = _gp(
        np.c_[XH, mu_l_h], yH, np.c_[Xte, mu_l_te], s1, rho * mu_l_h + c, rho * mu_l_te + c, d=1
    )
    pred = model.predict(torch.from_numpy(Xte))
    np.testing.assert_allclose(pred.mean.numpy(), mean, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(pred.variance_f.numpy(), rho**2 * var_l_te + var_delta, rtol=1e-5, atol=1e-10)
    np.testing.assert_allclose(pred.variance_y.numpy(), rho**2 * var_l_te + var_delta + noise, rtol=1e-5)
    assert model.rho_ == [pytest.approx(rho)]


def test_ar1_recovers_rho_and_beats_a_hf_only_gp():
    levels, high = _two_level(seed=1, rho=2.0)
    model = AR1(restarts=2, seed=0).fit(levels)
    assert model.rho_[0] == pytest.approx(2.0, abs=0.02)
    Xte = np.linspace(0, 1, 200)[:, None]
    truth = high(Xte)
    rmse_ar1 = float(np.sqrt(((model.predict(torch.from_numpy(Xte)).mean.numpy() - truth) ** 2).mean()))
    spec = rbf_spec(1)
    XH, yH = levels[1]
    state, _ = mle_with_restarts(spec, [(XH, yH)], restarts=2)
    alone = condition(spec, state, XH, yH, torch.from_numpy(Xte)).mean.numpy()
    rmse_alone = float(np.sqrt(((alone - truth) ** 2).mean()))
    assert rmse_ar1 < 0.03 * truth.std()
    assert rmse_ar1 < 0.1 * rmse_alone


def test_ar1_three_levels_chains_the_variance():
    rng = np.random.default_rng(2)
    f1 = lambda x: np.sin(6 * x[:, 0])  # noqa: E731
    f2 = lambda x: 1.5 * f1(x) + 0.3 * x[:, 0]  # noqa: E731
    f3 = lambda x: -0.8 * f2(x) + 0.2  # noqa: E731
    levels = []
    for f, n in ((f1, 40), (f2, 15), (f3, 8)):
        x = rng.uniform(size=(n, 1))
        levels.append((torch.from_numpy(x), torch.from_numpy(f(x))))
    model = AR1(restarts=1).fit(levels)
    assert model.rho_[0] == pytest.approx(1.5, abs=0.15) and model.rho_[1] == pytest.approx(-0.8, abs=0.1)
    X = torch.linspace(0, 1, 9, dtype=torch.float64)[:, None]
    p2, p3 = model.predict(X, level=1), model.predict(X, level=-1)
    # var_3 = ρ_3² var_2 + σ²_δ3 >= ρ_3² var_2
    assert bool((p3.variance_f >= model.rho_[1] ** 2 * p2.variance_f - 1e-12).all())
    assert float((p3.mean - torch.from_numpy(f3(X.numpy()))).abs().max()) < 0.1


def _perdikaris(seed=0, n_low=50, n_high=14):
    # Perdikaris et al. (2017) §3.1: f_l = sin(8πx), f_h = (x - √2) f_l²; 50 LF and 14 HF points.
    rng = np.random.default_rng(seed)
    low = lambda x: np.sin(8 * np.pi * x[:, 0])  # noqa: E731
    high = lambda x: (x[:, 0] - math.sqrt(2)) * low(x) ** 2  # noqa: E731
    xl, xh = rng.uniform(size=(n_low, 1)), rng.uniform(size=(n_high, 1))
    t = torch.from_numpy
    return [(t(xl), t(low(xl))), (t(xh), t(high(xh)))], high


def test_nargp_learns_a_nonlinear_map_that_ar1_cannot():
    levels, high = _perdikaris()
    X = np.linspace(0, 1, 300)[:, None]
    truth = high(X)
    nargp = NARGP(restarts=2, samples=50, seed=0).fit(levels).predict(torch.from_numpy(X))
    ar1 = AR1(restarts=2, seed=0).fit(levels).predict(torch.from_numpy(X))
    rmse = lambda p: float(np.sqrt(((p.mean.numpy() - truth) ** 2).mean()))  # noqa: E731
    # f_h is (x - √2) times f_l squared: no constant ρ maps f_l to it; NARGP's k(x, f_l) can.
    assert rmse(nargp) < 0.1 * truth.std()
    assert rmse(nargp) < 0.3 * rmse(ar1)
    # its 95% band covers most of the truth
    lo, hi = nargp.confidence_region(0.95, observation_noise=True)
    assert float(((torch.from_numpy(truth) >= lo) & (torch.from_numpy(truth) <= hi)).double().mean()) > 0.8


def test_nargp_moment_matching_and_determinism():
    levels, _ = _perdikaris(seed=1)
    model = NARGP(restarts=0, samples=30, seed=4).fit(levels)
    X = torch.linspace(0, 1, 11, dtype=torch.float64)[:, None]
    a, b = model.predict(X), model.predict(X)
    assert torch.equal(a.mean, b.mean) and torch.equal(a.variance_f, b.variance_f)
    # with one sample at the LF posterior mean the moments are those of the HF GP at [x, μ_L(x)]
    one = NARGP(restarts=0, samples=1, seed=4)
    one.__dict__.update({k: v for k, v in model.__dict__.items() if k.endswith("_")})
    mu_l = model._level(0, X)
    gen = torch.Generator().manual_seed(one.seed + 7919)
    eps = torch.randn(1, len(X), generator=gen, dtype=X.dtype)
    direct = model._level(
        1, torch.cat([X, (mu_l.mean + mu_l.variance_f.clamp_min(0).sqrt() * eps[0])[:, None]], 1)
    )
    got = one.predict(X)
    torch.testing.assert_close(got.mean, direct.mean)
    torch.testing.assert_close(got.variance_f, direct.variance_f)


def test_mle_with_restarts_skips_failed_starts(monkeypatch):
    X = torch.rand(12, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    y = torch.sin(6 * X[:, 0])
    clean = mle_with_restarts(rbf_spec(1), [(X, y)], restarts=2, seed=0)
    real, calls = torch.optim.LBFGS.step, []

    def flaky(self, closure):
        calls.append(1)
        if len(calls) == 1:  # the first start's L-BFGS wanders into NaN
            raise NanError("cholesky_cpu: NaN")
        return real(self, closure)

    monkeypatch.setattr(torch.optim.LBFGS, "step", flaky)
    state, value = mle_with_restarts(rbf_spec(1), [(X, y)], restarts=2, seed=0)
    assert len(calls) == 3 and np.isfinite(value) and value >= clean[1]
    monkeypatch.setattr(torch.optim.LBFGS, "step", lambda *a: (_ for _ in ()).throw(NanError("always")))
    with pytest.raises(MLEError, match="every MLE attempt failed"):
        mle_with_restarts(rbf_spec(1), [(X, y)], restarts=1)


def test_bad_input_raises_value_errors():
    levels, _ = _two_level()
    with pytest.raises(ValueError, match="levels: a multi-fidelity model needs at least 2"):
        AR1().fit(levels[:1])
    with pytest.raises(ValueError, match=r"levels\[1\]: 2 features"):
        AR1().fit([levels[0], (torch.rand(5, 2, dtype=torch.float64), torch.rand(5, dtype=torch.float64))])
    with pytest.raises(ValueError, match=r"levels\[0\]: X or y contains NaN"):
        AR1().fit([(levels[0][0], levels[0][1] * float("nan")), levels[1]])
    with pytest.raises(ValueError, match="samples"):
        NARGP(samples=0)
    with pytest.raises(ValueError, match="restarts"):
        AR1(restarts=-1)
    with pytest.raises(RuntimeError, match="not fitted"):
        AR1().predict(torch.rand(3, 1))
    model = AR1(restarts=0).fit(levels)
    with pytest.raises(ValueError, match=r"X must have shape \(n, 1\)"):
        model.predict(torch.rand(3, 2))
