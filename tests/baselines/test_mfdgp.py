"""MF-DGP (Cutajar et al. 2019) on GPyTorch's deep GP module: against NARGP on the 1-D nonlinear
example, batched fits equal separate ones, the dense link kernel, bad input."""

import warnings

import gpytorch
import pytest
import torch

from fedgp.baselines import MFDGP
from fedgp.baselines.mfdgp import Stage, _link_kernel, _x_kernel, emukit_stages
from fedgp.models.multifidelity import NARGP, mle_with_restarts, rbf_spec
from fedgp.models.posterior import condition
from fedgp.synthetic.multifidelity import multifidelity_federation

# A few hundred steps: the training starts at NARGP's level fits (MFDGP._exact_start) and refines.
SHORT = (
    Stage(60, 0.01, False, False, False),
    Stage(120, 0.01, True, True, False),
    Stage(120, 0.003, True, True, True),
)


@pytest.fixture(scope="module")
def nonlinear():
    # FGPR §5 Example 2 (after Cutajar et al.): y_l = cos 15x, y_h = x exp(y_l(2x - 0.2)) - 1 on
    # [0, 2]; 100 LF and 20 HF uniform points, 1,000 HF test points, standardised per level.
    return multifidelity_federation("nonlinear", seed=0)


@pytest.fixture(scope="module")
def fitted(nonlinear):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gpytorch.utils.warnings.NumericalWarning)
        return MFDGP(SHORT, seed=0).fit(nonlinear.levels)


def test_mfdgp_and_nargp_both_fit_the_nonlinear_example_and_beat_a_hf_only_gp(nonlinear, fitted):
    p = nonlinear
    mfdgp = fitted.predict(p.X_test)
    nargp = NARGP(restarts=2, samples=100, seed=0).fit(p.levels).predict(p.X_test)
    spec = rbf_spec(1)
    state, _ = mle_with_restarts(spec, [(p.hf.X, p.hf.y)], restarts=4, seed=0)
    hf_only = condition(spec, state, p.hf.X, p.hf.y, p.X_test)
    # Measured (seed 0): MF-DGP 0.15, NARGP 0.16, the HF-only GP 0.87 on the standardised scale:
    # 20 HF points cannot resolve cos(30x), the map from the LF function can.
    bound = 0.25
    assert mfdgp.rmse(p.y_test) < bound
    assert nargp.rmse(p.y_test) < bound
    assert hf_only.rmse(p.y_test) > 3 * bound
    assert mfdgp.rmse(p.y_test) < 0.3 * hf_only.rmse(p.y_test)
    # Its predictive distribution is usable: most test values inside the 95 % band, and a lower
    # NLL than the HF-only GP's.
    assert mfdgp.coverage(p.y_test) > 0.8
    assert mfdgp.nll(p.y_test) < hf_only.nll(p.y_test)


def test_training_raises_the_bound_and_the_low_level_interpolates_its_data(nonlinear, fitted):
    elbo = fitted.elbo_[0]
    assert len(elbo) == 3 and elbo[-1] > elbo[0]
    assert fitted.history_[-1] < fitted.history_[0]
    low = fitted.predict(nonlinear.levels[0][0], level=0)
    assert low.rmse(nonlinear.levels[0][1]) < 0.05  # layer 0 is an exact-GP-like fit of cos 15x
    assert fitted.seconds_ > 0


def test_a_batch_of_problems_is_fitted_as_each_problem_alone():
    problems = [
        multifidelity_federation("nonlinear", {"high": 8, "low": 20}, n_test=50, seed=s) for s in (3, 4)
    ]
    stages = (Stage(10, 0.01, False, False, False), Stage(10, 0.01, True, True, True))
    alone = [
        MFDGP(stages, samples=4, predict_samples=30, start_iterations=40, seed=s).fit(p.levels)
        for s, p in zip((3, 4), problems)
    ]
    together = MFDGP(stages, samples=4, predict_samples=30, start_iterations=40).fit_batch(
        [p.levels for p in problems], seeds=[3, 4]
    )
    batched = together.predict_batch([p.X_test for p in problems])
    for model, pred, p in zip(alone, batched, problems):
        single = model.predict(p.X_test)
        # to about 1e-5, not to rounding: GPyTorch's jitter retries act on the whole batch
        torch.testing.assert_close(pred.mean, single.mean, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(pred.variance_y, single.variance_y, rtol=1e-4, atol=1e-4)
    # different data, different fits
    assert not torch.allclose(batched[0].mean, batched[1].mean)


def test_three_levels_and_the_emukit_schedule():
    p = multifidelity_federation("branin", {"high": 6, "medium": 10, "low": 20}, n_test=30, seed=0)
    model = MFDGP(
        (Stage(5, 0.01, False, False, False), Stage(5, 0.01, True, True, True)),
        samples=3,
        start_iterations=40,
    ).fit(p.levels)
    assert len(model.net_.layers) == 3
    for level in (0, 1, 2):
        pred = model.predict(p.X_test, level=level)
        assert pred.mean.shape == (30,) and bool((pred.variance_y >= pred.variance_f).all())
    stages = emukit_stages()
    assert [s.iterations for s in stages] == [5000, 15000, 15000] and [s.lr for s in stages] == [
        3e-3,
        1e-3,
        1e-3,
    ]
    assert [s.iterations for s in emukit_stages(0.2)] == [1000, 3000, 3000]


def test_the_dense_link_kernel_equals_gpytorchs_own_composition():
    # k_rho * (k_f + linear) + k_delta as gpytorch builds it (MulLinearOperator, low-rank update):
    # same parameter names, so the exact-GP start's parameters load into either, and same entries
    d, batch = 3, torch.Size([2])
    rbf = gpytorch.kernels.RBFKernel(active_dims=(d,), batch_shape=batch)
    linear = gpytorch.kernels.LinearKernel(active_dims=(d,), batch_shape=batch)
    k_f = gpytorch.kernels.ScaleKernel(rbf, batch_shape=batch)
    reference = (_x_kernel(d, batch) * (k_f + linear) + _x_kernel(d, batch)).double()
    dense = _link_kernel(d, batch).double()
    torch.manual_seed(0)
    for param in reference.parameters():
        param.data.normal_()
    dense.load_state_dict(reference.state_dict())
    x, y = torch.rand(5, 2, 12, d + 1, dtype=torch.float64), torch.rand(5, 2, 4, d + 1, dtype=torch.float64)
    with torch.no_grad():
        for a, b in ((x, x), (x, y)):
            torch.testing.assert_close(dense(a, b).to_dense(), reference(a, b).to_dense(), rtol=0, atol=1e-14)
        torch.testing.assert_close(dense(x, diag=True), reference(x, diag=True), rtol=0, atol=1e-14)


def test_the_top_noise_starts_at_its_share_of_the_variance_or_at_the_exact_fit(nonlinear):
    # No training steps: the noise read back is where the training would start.
    held = (Stage(0, 0.01, False, False, False),)
    kw = dict(samples=2, predict_samples=5, start_iterations=40)
    y_high = nonlinear.levels[-1][1]
    emukit = MFDGP(held, **kw).fit(nonlinear.levels).net_.likelihoods[-1].noise.item()
    assert emukit == pytest.approx(0.01 * float(y_high.var()), rel=1e-9)
    exact = MFDGP(held, top_noise=None, **kw).fit(nonlinear.levels)
    # the exact start of the HF level fits [x, mu_low(x)]: its noise is what the layer now holds
    start = exact._exact_start([layer.variational_strategy.inducing_points for layer in exact.net_.layers])
    fitted = float(start[-1][0][1])
    assert exact.net_.likelihoods[-1].noise.item() == pytest.approx(max(fitted, exact.noise_floor), rel=1e-9)
    assert exact.net_.likelihoods[-1].noise.item() < 0.1 * emukit
    with pytest.raises(ValueError, match="top_noise must be > 0 or None"):
        MFDGP(top_noise=0.0)


def test_bad_input_raises_clear_errors(nonlinear):
    with pytest.raises(ValueError, match="at least 2 levels"):
        MFDGP(SHORT).fit(nonlinear.levels[:1])
    with pytest.raises(ValueError, match="same sizes"):
        other = multifidelity_federation("nonlinear", {"high": 10}, seed=1)
        MFDGP(SHORT).fit_batch([nonlinear.levels, other.levels])
    with pytest.raises(ValueError, match="2 problems but 1 seeds"):
        MFDGP(SHORT).fit_batch([nonlinear.levels, nonlinear.levels], seeds=[0])
    with pytest.raises(ValueError, match="samples must be >= 1"):
        MFDGP(samples=0)
    with pytest.raises(ValueError, match="iterations must be an integer"):
        Stage(-1, 0.01, False, False, False)
    with pytest.raises(ValueError, match="lr must be > 0"):
        Stage(10, 0.0, False, False, False)
    with pytest.raises(RuntimeError, match="not fitted"):
        MFDGP(SHORT).predict(nonlinear.X_test)
    with pytest.raises(ValueError, match="shape"):
        MFDGP((Stage(1, 0.01, False, False, False),)).fit(nonlinear.levels).predict(torch.zeros(3, 2))


@pytest.mark.parametrize("function, seed", [("branin", 3), ("branin", 7), ("borehole", 0)])
def test_draws_whose_exact_start_is_degenerate_still_train(function, seed):
    # Table 1's BRANIN (three levels): on draw 7 the middle level's exact fit drops the linear term
    # (variance exactly 0, raw -inf: NaN gradients from the first step); on draw 3 both of its
    # starts fail and NARGP's 4 restarts find one. On Borehole (8-D) the HF level's fit ends in NaN
    # on every draw unless its lengthscales have NARGP's floor. Each once failed its batch of 30.
    p = multifidelity_federation(function, seed=seed)
    one_step = (Stage(2, 0.01, False, False, False),)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gpytorch.utils.warnings.NumericalWarning)
        model = MFDGP(one_step, samples=2, predict_samples=5, low_inducing_stride=2, seed=seed).fit(p.levels)
        pred = model.predict(p.X_test[:50])
    assert all(torch.isfinite(p_).all() for p_ in model.net_.parameters())
    assert torch.isfinite(pred.mean).all() and torch.isfinite(pred.variance_y).all()
