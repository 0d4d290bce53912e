"""The real-data benchmark family: owners tuning kernel ridge on their own data (issue 53, item 4(b)).

The black box is checked against scikit-learn's KernelRidge, its split and standardisation against
their definition, its optimum against a finer grid, and the C-MAPSS owners against a small frame
built here (the real engines are exercised by ``benchmarks/federated_bo_tuning.py``)."""

import math

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedgp.bo import BOLoop, RandomSearch
from fedgp.bo.tuning import INFORMATIVE_SENSORS, KernelRidgeTuning, cmapss_tuning_owners
from fedgp.errors import InputError

pytest.importorskip("botorch")


def data(n=60, p=4, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, p)) * np.array([1.0, 10.0, 0.1, 3.0])[:p]
    y = np.sin(X[:, 0]) + 0.1 * X[:, 1] + 0.05 * rng.normal(size=n)
    return X, y


def sklearn_score(task, u):
    """-log(RMSE / sd) of sklearn's KernelRidge at the hyper-parameters ``u`` stands for."""
    from sklearn.kernel_ridge import KernelRidge

    alpha, lengthscale = (float(v) for v in task.hyper_parameters(torch.tensor([u], dtype=torch.float64)))
    centre = float(task.y_train.mean())
    model = KernelRidge(alpha=alpha, kernel="rbf", gamma=1 / (2 * lengthscale**2))
    model.fit(task.X_train.numpy(), task.y_train.numpy() - centre)
    pred = model.predict(task.X_val.numpy()) + centre
    y_val = task.y_val.numpy()
    return -math.log(np.sqrt(np.mean((pred - y_val) ** 2)) / np.std(y_val, ddof=1))


@settings(max_examples=15)
@given(u=st.tuples(st.floats(0, 1), st.floats(0, 1)))
def test_black_box_is_sklearns_kernel_ridge_validation_score(u):
    pytest.importorskip("sklearn")
    task = KernelRidgeTuning.from_arrays(*data())
    value = float(task(torch.tensor([u], dtype=torch.float64)))
    assert value == pytest.approx(sklearn_score(task, u), rel=1e-7, abs=1e-9)


def test_every_third_row_validates_and_inputs_are_standardised_by_the_training_rows():
    X, y = data(30)
    X[:, 2] = 5.0  # a constant sensor: centred, not divided by zero
    task = KernelRidgeTuning.from_arrays(X, y)
    val = np.arange(30) % 3 == 2
    np.testing.assert_allclose(task.y_val.numpy(), y[val])
    np.testing.assert_allclose(task.y_train.numpy(), y[~val])
    np.testing.assert_allclose(task.X_train.mean(0).numpy(), 0, atol=1e-12)
    np.testing.assert_allclose(task.X_train[:, [0, 1, 3]].std(0, unbiased=False).numpy(), 1)
    assert (task.X_val[:, 2] == 0).all()
    with pytest.raises(InputError, match="n >= 6"):
        KernelRidgeTuning.from_arrays(X[:4], y[:4])


def test_hyper_parameters_span_the_log_ranges():
    task = KernelRidgeTuning.from_arrays(*data(), alpha_range=(-2.0, 1.0), lengthscale_range=(0.0, 2.0))
    alpha, ls = task.hyper_parameters(torch.tensor([[0.0, 0.0], [1.0, 0.5]], dtype=torch.float64))
    torch.testing.assert_close(alpha, torch.tensor([1e-2, 10.0], dtype=torch.float64))
    torch.testing.assert_close(ls, torch.tensor([1.0, 10.0], dtype=torch.float64) * 2)  # × √p, p = 4


def test_maximum_is_at_least_a_finer_grid():
    task = KernelRidgeTuning.from_arrays(*data())
    u, best = task.maximum(grid=11)
    assert float(task(u)) == pytest.approx(best)
    g = torch.linspace(0, 1, 41, dtype=torch.float64)
    assert best >= float(task(torch.cartesian_prod(g, g)).max()) - 1e-3


def engines(units=(1, 2, 3), cycles=(40, 55, 31)):
    rng = np.random.default_rng(1)
    parts = []
    for unit, n in zip(units, cycles):
        wear = np.linspace(0, 1, n)
        sensors = {s: wear * (i + 1) + 0.1 * rng.normal(size=n) for i, s in enumerate(INFORMATIVE_SENSORS)}
        parts.append(pd.DataFrame({"unit": unit, "cycle": np.arange(1, n + 1), **sensors}))
    return pd.concat(parts).sample(frac=1.0, random_state=0)  # rows out of order, as they may come


def test_cmapss_owners_tune_their_own_engine():
    frame = engines()
    owners = cmapss_tuning_owners(frame, [3, 1], cap=20.0, grid=5)
    assert [o.id for o in owners] == [3, 1]
    rows = frame[frame["unit"] == 3].sort_values("cycle")
    life = np.minimum(30 - np.arange(31), 20.0)
    np.testing.assert_allclose(owners[0].objective.y_train.numpy(), life[np.arange(31) % 3 != 2])
    task = KernelRidgeTuning.from_arrays(rows[list(INFORMATIVE_SENSORS)].to_numpy(), life)
    u = torch.tensor([[0.3, 0.6]], dtype=torch.float64)
    torch.testing.assert_close(owners[0].objective(u), task(u))
    h = BOLoop(owners, RandomSearch(), 2, initial=2, seed=0).run().history
    assert (h["regret"] >= -1e-9).all() and h["regret"].notna().all()
    assert cmapss_tuning_owners(frame, [2], grid=None)[0].optimum is None


def test_cmapss_owners_name_what_is_missing():
    with pytest.raises(InputError, match="engine 9"):
        cmapss_tuning_owners(engines(), [1, 9], grid=None)
    with pytest.raises(InputError, match="s21"):
        cmapss_tuning_owners(engines().drop(columns=["s21"]), [1], grid=None)
