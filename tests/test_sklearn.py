"""``fedgp.sklearn.FederatedGPRegressor``: scikit-learn's estimator checks, agreement with fedgp.fit,
groups at fit and predict, and scikit-learn's tools (clone, pipelines, grid search, routing)."""

import warnings

import gpytorch
import numpy as np
import pandas as pd
import pytest
import sklearn
from sklearn.base import clone
from sklearn.metrics import r2_score
from sklearn.model_selection import GridSearchCV, GroupKFold, cross_validate
from sklearn.pipeline import make_pipeline
from sklearn.utils.estimator_checks import parametrize_with_checks

import fedgp
import fedgp.sklearn
from fedgp.data import ClientData, Federation
from fedgp.presets import make_spec
from fedgp.sklearn import FederatedGPRegressor
from fedgp.strategies import FGPR, IFCA


def expected_failed_checks(estimator) -> dict[str, str]:
    """Checks of scikit-learn's suite that this estimator is known to fail, with the reason.

    None: every check that applies passes (with 3 rounds, so the suite stays short). scikit-learn
    itself skips ``check_array_api_input`` (SCIPY_ARRAY_API unset; fedgp computes in torch and
    takes numpy/pandas in) and runs no sample-weight checks (``fit`` takes no ``sample_weight``:
    FGPR weighs owners by their row counts and has no per-row weights)."""
    return {}


@parametrize_with_checks([FederatedGPRegressor(rounds=3)], expected_failed_checks=expected_failed_checks)
def test_scikit_learn_estimator_checks(estimator, check):
    check(estimator)


def owners(n=(15, 20, 12), seed=0):
    rng = np.random.default_rng(seed)
    X, y, groups = [], [], []
    for label, (size, shift) in zip(["a", "b", "c"], zip(n, (0.0, 2.0, -2.0))):
        x = rng.uniform(0, 5, (size, 2))
        X.append(x)
        y.append(10 + np.sin(2 * x[:, 0]) + 0.3 * x[:, 1] + shift + rng.normal(0, 0.1, size))
        groups += [label] * size
    return np.vstack(X), np.concatenate(y), np.array(groups)


@pytest.mark.parametrize("strategy", ["fgpr", "ifca"])
def test_it_is_fedgp_fit_on_the_owners(strategy):
    X, y, groups = owners()
    est = FederatedGPRegressor(kernel="matern32", strategy=strategy, rounds=6, seed=3).fit(
        X, y, groups=groups
    )
    fed = Federation.from_partition(X, y, [np.flatnonzero(groups == g) for g in "abc"], ids=list("abc"))
    made = FGPR() if strategy == "fgpr" else IFCA()
    result = fedgp.fit(make_spec("matern32", d=2), fed, made, rounds=6, seed=3)
    X_new = np.random.default_rng(1).uniform(0, 5, (7, 2))
    new_groups = np.array(list("abcabca"))
    mean, std = est.predict(X_new, groups=new_groups, return_std=True)
    for g in "abc":
        rows = new_groups == g
        m, v = result.predict(X_new[rows], client=g, observation_noise=True)
        np.testing.assert_allclose(mean[rows], m.numpy(), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(std[rows], v.sqrt().numpy(), rtol=1e-10, atol=1e-12)
    assert est.groups_.tolist() == ["a", "b", "c"] and est.n_features_in_ == 2
    assert len(est.history_) == 6


def test_groups_at_predict_select_each_rows_owner():
    X, y, groups = owners()
    est = FederatedGPRegressor(rounds=10).fit(X, y, groups=groups)
    x = np.array([[2.5, 2.5]])
    per_owner = [float(est.predict(x, groups=[g])[0]) for g in "abc"]
    assert per_owner[1] > per_owner[0] + 1 > per_owner[2] + 2  # the owners' shifts of +2 and -2
    score = est.score(X, y, groups=groups)
    assert score == r2_score(y, est.predict(X, groups=groups))
    assert score > est.score(X, y, groups=["a"] * len(y)) + 0.1  # the right owners predict better
    with pytest.raises(ValueError, match="fitted on 3 owners, so predict needs each row's owner"):
        est.predict(x)


def test_an_unknown_owner_gets_the_prior_with_a_warning_quietly_when_chosen_or_an_error():
    """On 0656142 an owner label fit never saw (``"A"`` where it saw ``"a"``) got the shared prior
    without a word; the default now says so, naming it and what to do."""
    X, y, groups = owners()
    est = FederatedGPRegressor(rounds=5).fit(X, y, groups=groups)
    x = np.array([[1.0, 1.0], [4.0, 0.5], [2.0, 2.0]])
    with pytest.warns(
        fedgp.FallbackWarning, match=r"owner 'A' \(2 rows\) not seen in fit \(owners: 'a', 'b', 'c'\)"
    ):
        mean, std = est.predict(x, groups=["A", "A", "b"], return_std=True)
    cold = est.result_.posterior(x[:2], ClientData(np.empty((0, 2)), np.empty(0), id="A"))
    np.testing.assert_allclose(mean[:2], cold.mean.numpy(), rtol=1e-12)
    np.testing.assert_allclose(std[:2], cold.variance_y.sqrt().numpy(), rtol=1e-12)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # chosen explicitly: the same prediction, no warning
        chosen = est.set_params(unknown_groups="prior").predict(x, groups=["A", "A", "b"])
    np.testing.assert_array_equal(chosen, mean)
    with pytest.raises(
        ValueError,
        match=r"groups: owner 'newcomer' \(1 row\) not seen in fit \(owners: 'a', 'b', 'c'\)\. Check",
    ):
        est.set_params(unknown_groups="error").predict(x[:2], groups=["a", "newcomer"])


def test_an_unknown_owner_can_get_every_owners_posterior_combined():
    X, y, groups = owners()
    est = FederatedGPRegressor(rounds=5, unknown_groups="rbcm").fit(X, y, groups=groups)
    x = np.array([[1.0, 1.0], [4.0, 0.5], [2.0, 2.0]])
    mean, std = est.predict(x, groups=["a", "newcomer", "newcomer"], return_std=True)
    combined = est.result_.posterior(x[1:], combine="rbcm")
    np.testing.assert_allclose(mean[1:], combined.mean.numpy(), rtol=1e-12)
    np.testing.assert_allclose(std[1:], combined.variance_y.sqrt().numpy(), rtol=1e-12)
    np.testing.assert_allclose(mean[0], est.result_.posterior(x[:1], 0).mean.numpy(), rtol=1e-12)
    with pytest.raises(ValueError, match="unknown_groups must be 'warn', 'prior', 'error' or a combine rule"):
        est.set_params(unknown_groups="nearest").predict(x, groups=["a", "a", "a"])


def test_without_groups_all_rows_are_one_owner():
    X, y, _ = owners()
    est = FederatedGPRegressor(rounds=4).fit(X, y)
    fed = Federation([ClientData(X, y, id=0)])
    result = fedgp.fit(make_spec(d=2), fed, FGPR(), rounds=4)
    np.testing.assert_allclose(est.predict(X[:5]), result.predict(X[:5], client=0)[0].numpy(), rtol=1e-10)


@pytest.mark.parametrize(
    "groups, message",
    [
        (["a"] * 46 + ["z"], r"groups: owner 'z' has 1 row \(row 46\); training needs at least 2"),
        (["a"] * 46 + [None], r"groups: row 46 has no owner label"),
        (["a"] * 10, r"inconsistent numbers of samples"),
    ],
)
def test_bad_groups_are_named(groups, message):
    X, y, _ = owners()
    with pytest.raises(ValueError, match=message):
        FederatedGPRegressor(rounds=2).fit(X, y, groups=groups)


def test_pandas_in_feature_names_and_a_gpytorch_kernel_left_unchanged():
    X, y, groups = owners()
    frame = pd.DataFrame(X, columns=["speed", "load"])
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=2))
    before = {k: v.clone() for k, v in kernel.state_dict().items()}
    est = FederatedGPRegressor(kernel=kernel, rounds=3).fit(frame, pd.Series(y), groups=pd.Series(groups))
    assert est.feature_names_in_.tolist() == ["speed", "load"]
    assert all((kernel.state_dict()[k] == v).all() for k, v in before.items())
    with pytest.warns(UserWarning, match="X does not have valid feature names"):
        from_array = est.predict(X[:3], groups=groups[:3])
    np.testing.assert_array_equal(est.predict(frame.iloc[:3], groups=groups[:3]), from_array)
    with pytest.raises(ValueError, match="missing 'load'; not features of the model 'weight'"):
        est.predict(frame.iloc[:3].rename(columns={"load": "weight"}), groups=groups[:3])


def test_clone_grid_search_and_routed_groups():
    X, y, groups = owners()
    est = FederatedGPRegressor(rounds=3)
    copy = clone(est.set_params(kernel="matern52"))
    assert copy.get_params()["kernel"] == "matern52" and not hasattr(copy, "result_")
    with sklearn.config_context(enable_metadata_routing=True):
        routed = FederatedGPRegressor(rounds=3).set_fit_request(groups=True).set_score_request(groups=True)
        pipe = make_pipeline(routed)
        scores = cross_validate(pipe, X, y, cv=GroupKFold(3), params={"groups": groups})
        assert len(scores["test_score"]) == 3  # each fold's owners are unseen: prior predictions
        search = GridSearchCV(routed, {"kernel": ["rbf", "matern12"]}, cv=GroupKFold(3)).fit(
            X, y, groups=groups
        )
        assert search.best_params_["kernel"] in ("rbf", "matern12")


def test_transforms_faults_and_callbacks_reach_fedgp_fit():
    """The run's option objects pass through unchanged: the estimator is ``fedgp.fit`` with them."""
    X, y, groups = owners()
    seen = []
    faults = fedgp.run.Faults(simulate=0.3)
    est = FederatedGPRegressor(
        rounds=5, seed=2, transforms=None, faults=faults, callbacks=[lambda run: seen.append(run.completed)]
    ).fit(X, y, groups=groups)
    fed = Federation.from_partition(X, y, [np.flatnonzero(groups == g) for g in "abc"], ids=list("abc"))
    spec = make_spec(d=2)
    result = fedgp.fit(spec, fed, FGPR(), rounds=5, seed=2, transforms=None, faults=faults)
    assert seen == [1, 2, 3, 4, 5]  # the callback ran after every round
    assert est.result_.transforms == result.transforms == {"outcome": "none", "inputs": "none"}
    failed = est.history_["failed"].tolist()
    assert failed == result.history["failed"].tolist() and sum(failed) > 0  # the same simulated failures
    x = np.random.default_rng(4).uniform(0, 5, (4, 2))
    m, _ = result.predict(x, client="b", observation_noise=True)
    np.testing.assert_allclose(est.predict(x, groups=["b"] * 4), m.numpy(), rtol=1e-10, atol=1e-12)


def test_a_private_strategy_is_fedgp_fit_with_it():
    """``strategy=ClientDP(FGPR(), ...)``: client-level DP through the estimator, as through fit."""
    pytest.importorskip("dp_accounting")
    X, y, groups = owners()
    private = fedgp.run.ClientDP(FGPR(), noise=1.0, delta=1e-3, reproducible=True)
    est = FederatedGPRegressor(strategy=private, rounds=3, seed=2, stop=None).fit(X, y, groups=groups)
    fed = Federation.from_partition(X, y, [np.flatnonzero(groups == g) for g in "abc"], ids=list("abc"))
    result = fedgp.fit(make_spec(d=2), fed, private, rounds=3, seed=2, stop=None)
    assert type(est.result_.strategy).__name__ == "DPFGPR" and est.history_["epsilon"].is_monotonic_increasing
    assert est.result_.state.allclose(result.state, rtol=1e-12)
    assert clone(est).get_params()["strategy"] == private


def test_routing_groups_needs_only_set_config_and_a_forgotten_route_warns():
    """The estimator asks for ``groups`` at fit, predict and score by default: with routing on,
    cross-validation gets finite scores without any set_*_request; without it, ``groups`` reach
    only the splitter and fit warns that it trains one centralised GP, saying how to route."""
    X, y, groups = owners()
    with sklearn.config_context(enable_metadata_routing=True):
        scores = cross_validate(
            FederatedGPRegressor(rounds=3), X, y, cv=GroupKFold(3), params={"groups": groups}
        )
        assert np.isfinite(scores["test_score"]).all()
    # Routing off (explicitly: another test or a docs page may have left it on globally).
    with sklearn.config_context(enable_metadata_routing=False):
        with pytest.warns(fedgp.errors.FedGPWarning, match="enable_metadata_routing=True"):
            cross_validate(FederatedGPRegressor(rounds=3), X, y, cv=GroupKFold(3), groups=groups)
