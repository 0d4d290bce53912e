"""``FitResult.plot()``: the history's panels, each line the history's own values, on a figure pyplot
does not manage (no window, nothing left open)."""

from __future__ import annotations

import dataclasses
import io

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

import fedgp  # noqa: E402
from fedgp.errors import InputError  # noqa: E402
from fedgp.plotting import plot_history  # noqa: E402
from fedgp.run import Evaluate, Progress  # noqa: E402

PARAMS = ["likelihood.noise_covar.noise", "covar_module.outputscale", "covar_module.base_kernel.lengthscale"]


def _fit(n_test: int = 0, strategy=None, rounds: int = 4, callbacks=()):
    draws = fedgp.synthetic.gp_federation(num_clients=4, n=20, d=1, n_test=n_test, seed=0)
    return fedgp.fit(
        draws.spec, draws.federation, strategy, rounds=rounds, callbacks=[Progress(False), *callbacks]
    )


def _panels(fig: Figure) -> list[str]:
    return [ax.get_title() for ax in fig.axes]


def _lines(ax) -> dict[str, matplotlib.lines.Line2D]:
    return {line.get_label(): line for line in ax.get_lines()}


@pytest.fixture(scope="module")
def with_test():
    return _fit(n_test=5)


def test_panels_and_lines_are_the_historys_values(with_test):
    result, history = with_test, with_test.history
    before = plt.get_fignums()
    fig = result.plot()
    assert isinstance(fig, Figure) and plt.get_fignums() == before  # not a pyplot figure
    assert _panels(fig) == ["train NLL", "test RMSE", "test NLL", "hyper-parameters"]
    rounds = history["round"].to_numpy()
    train, rmse, nll, params = fig.axes
    (line,) = train.get_lines()
    np.testing.assert_array_equal(line.get_xdata(), rounds)
    np.testing.assert_array_equal(line.get_ydata(), history["train_nll"])
    for ax, column in [(rmse, "test_rmse"), (nll, "test_nll")]:
        (line,) = ax.get_lines()
        np.testing.assert_array_equal(line.get_ydata(), history[f"{column}_mean"])
        (band,) = ax.collections  # mean ± spread over clients
        lower = band.get_paths()[0].vertices[:, 1].min()
        assert lower == pytest.approx((history[f"{column}_mean"] - history[f"{column}_std"]).min())
    lines = _lines(params)
    assert sorted(lines) == sorted(PARAMS)
    for name, line in lines.items():
        np.testing.assert_array_equal(line.get_ydata(), history[name])
    assert params.get_yscale() == "log"  # all positive
    assert fig.axes[-1].get_xlabel() == "communication round"
    png = io.BytesIO()
    fig.savefig(png, format="png")  # renders without a display or pyplot
    assert png.getvalue().startswith(b"\x89PNG")


def test_without_test_data_there_are_no_test_panels():
    result = _fit(n_test=0, rounds=3)
    assert not any(c.startswith("test_") for c in result.history)
    fig = result.plot(figsize=(4, 3))
    assert _panels(fig) == ["train NLL", "hyper-parameters"]
    assert tuple(fig.get_size_inches()) == (4, 3)
    np.testing.assert_array_equal(fig.axes[0].get_lines()[0].get_ydata(), result.history["train_nll"])


def test_rounds_without_an_evaluation_are_skipped():
    result = _fit(n_test=5, rounds=5, callbacks=[Evaluate(every=2)])
    evaluated = result.history["test_rmse_mean"].notna()
    assert 0 < evaluated.sum() < len(result.history)
    (line,) = result.plot().axes[1].get_lines()
    np.testing.assert_array_equal(line.get_xdata(), result.history["round"][evaluated])
    np.testing.assert_array_equal(line.get_ydata(), result.history["test_rmse_mean"][evaluated])


def test_a_clustered_run_plots_each_clusters_hyper_parameters():
    result = _fit(n_test=0, strategy=fedgp.strategies.IFCA(num_clusters=2), rounds=3)
    lines = _lines(result.plot().axes[-1])
    assert sorted(lines) == sorted(f"{j}/{p}" for j in (0, 1) for p in PARAMS)
    for name, line in lines.items():
        np.testing.assert_array_equal(line.get_ydata(), result.history[name])


def test_a_strategy_without_state_columns_has_no_hyper_parameter_panel():
    result = _fit(n_test=0, strategy=fedgp.strategies.FederatedClustering(), rounds=2)
    assert _panels(result.plot()) == ["train NLL"]


def test_a_loaded_result_plots_the_same(with_test, tmp_path):
    loaded = fedgp.load(with_test.save(tmp_path / "model.fedgp"))
    ours, theirs = with_test.plot(), loaded.plot()
    assert _panels(ours) == _panels(theirs)
    for a, b in zip(ours.axes, theirs.axes):
        for x, y in zip(a.get_lines(), b.get_lines()):
            np.testing.assert_allclose(x.get_ydata(), y.get_ydata())


def test_axes_overlay_another_run_and_must_match_the_panels(with_test):
    fig = with_test.plot()
    assert with_test.plot(axes=fig.axes) is fig
    assert len(fig.axes[0].get_lines()) == 2
    _, axes = plt.subplots(2)
    try:
        with pytest.raises(InputError, match=r"draws 4 panels \(train NLL, test RMSE, test NLL"):
            with_test.plot(axes=axes)
    finally:
        plt.close("all")


def test_an_empty_history_is_a_clear_error(with_test):
    empty = dataclasses.replace(with_test, history=with_test.history.iloc[:0])
    with pytest.raises(InputError, match="history is empty: the run completed no rounds"):
        empty.plot()


def test_plot_history_reads_a_history_csv(with_test, tmp_path):
    """``fedgp fit`` writes history.csv; its dotted columns are the hyper-parameters."""
    with_test.history.to_csv(tmp_path / "history.csv", index=False)
    fig = plot_history(pd.read_csv(tmp_path / "history.csv"))
    assert _panels(fig) == _panels(with_test.plot())
    assert sorted(_lines(fig.axes[-1])) == sorted(PARAMS)
    with pytest.raises(InputError, match=r"parameters \['nope'\] are not columns"):
        plot_history(with_test.history, ["nope"])
