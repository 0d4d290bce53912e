"""Matplotlib helpers for personalised predictions, convergence curves and a run's history."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch

from fedgp.errors import InputError

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["plot_personalised", "plot_convergence", "plot_history"]


def plot_personalised(
    result, client: Any, ax=None, X: torch.Tensor | None = None, level: float = 0.95, label=None
) -> Axes:
    """Plot a 1-D client's personalised predictive mean and ``level`` band, with its data."""
    import matplotlib.pyplot as plt

    ax = plt.gca() if ax is None else ax
    data = result.federation[client] if not hasattr(client, "X") else client
    if data.n_features != 1:
        raise InputError(f"plot_personalised needs 1-D inputs, client {data.id!r} has {data.n_features}")
    if X is None:
        lo, hi = float(data.X.min()), float(data.X.max())
        X = torch.linspace(lo, hi, 300, dtype=torch.float64)[:, None]
    pred = result.posterior(X, client)
    lower, upper = pred.confidence_region(level)
    x = X[:, 0].numpy()
    (line,) = ax.plot(x, pred.mean.numpy(), lw=1.5, label=label or f"client {data.id}")
    ax.fill_between(x, lower.numpy(), upper.numpy(), color=line.get_color(), alpha=0.2, lw=0)
    ax.plot(data.X[:, 0].numpy(), data.y.numpy(), ".", ms=3, color=line.get_color(), alpha=0.6)
    if data.has_test:
        ax.plot(data.X_test[:, 0].numpy(), data.y_test.numpy(), "x", ms=4, color="k", alpha=0.5)
    return ax


def plot_convergence(rounds: np.ndarray, error: np.ndarray, ax=None, label: str = "FGPR") -> Axes:
    """Squared hyper-parameter error against communication round, log-log."""
    import matplotlib.pyplot as plt

    ax = plt.gca() if ax is None else ax
    ax.loglog(rounds, error, label=label)
    ax.set_xlabel("communication round")
    ax.set_ylabel(r"$\|\bar\theta - \theta^*\|^2$ (outputscale, noise)")
    return ax


#: The history's per-round test columns (:class:`fedgp.run.Evaluate`): panel title -> (mean, spread).
_TEST_PANELS = {
    "test RMSE": ("test_rmse_mean", "test_rmse_std"),
    "test NLL": ("test_nll_mean", "test_nll_std"),
}


def plot_history(
    history: pd.DataFrame,
    parameters: Sequence[str] | None = None,
    axes: Sequence[Axes] | None = None,
    figsize: tuple[float, float] | None = None,
) -> Figure:
    """A run's history against its rounds, one panel each: the train NLL; the clients' mean test RMSE
    and test NLL (± their spread over clients) where the history has them; the hyper-parameters.

    ``history`` is :attr:`fedgp.run.FitResult.history` or the ``history.csv`` that ``fedgp fit``
    writes. ``parameters`` are its hyper-parameter columns (default: the columns with a GPyTorch
    dotted name, such as ``covar_module.outputscale`` or a cluster's ``0/likelihood.noise_covar.noise``);
    log scale when all are positive. Rounds without an evaluation (``Evaluate(every=k)``) are gaps
    that the test lines step over. ``axes``: draw into these, one per panel, for instance a figure's
    ``fig.axes`` to overlay another run; else a new figure of ``figsize``.

    Without ``axes`` the figure is a bare :class:`matplotlib.figure.Figure`, not one of pyplot's: it
    opens no window, needs no display and no pyplot state (a script, a server or a thread can call it
    with any backend), is not kept alive by pyplot after you drop it, and a notebook shows the returned
    figure once. Save it with ``fig.savefig(...)``; to show it in a pyplot session, pass ``axes`` from
    ``plt.subplots``.
    """
    if not isinstance(history, pd.DataFrame):
        raise InputError(f"plot_history needs the history DataFrame, got {type(history).__name__}")
    if history.empty:
        raise InputError(
            "the history is empty: the run completed no rounds, so there is nothing to plot "
            "(fit with rounds >= 1, or check why it stopped before its first round)"
        )
    if parameters is None:
        parameters = [c for c in history.columns if "." in str(c)]
    parameters = list(parameters)
    missing = [c for c in parameters if c not in history.columns]
    if missing:
        raise InputError(f"plot_history: parameters {missing} are not columns of the history")
    panels = [title for title, column in [("train NLL", "train_nll")] if column in history]
    panels += [title for title, (mean, _) in _TEST_PANELS.items() if _numeric(history, mean).notna().any()]
    panels += ["hyper-parameters"] if parameters else []
    if not panels:
        raise InputError(
            "the history has no train_nll, test or hyper-parameter columns to plot; "
            f"its columns are {list(history.columns)}"
        )
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    if axes is None:
        fig = Figure(figsize=figsize or (6.4, 2.2 * len(panels) + 0.6), layout="constrained")
        axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    else:
        axes = list(np.ravel(axes))
        if len(axes) != len(panels):
            raise InputError(
                f"plot_history draws {len(panels)} panels ({', '.join(panels)}), got {len(axes)} axes"
            )
        fig = axes[0].figure
    rounds = history["round"].to_numpy() if "round" in history else np.arange(1, len(history) + 1)
    for ax, title in zip(axes, panels):
        _draw_panel(ax, title, history, rounds, parameters)
    axes[-1].set_xlabel("communication round")
    axes[-1].xaxis.set_major_locator(MaxNLocator(integer=True))
    return fig


def _draw_panel(
    ax: Axes, title: str, history: pd.DataFrame, rounds: np.ndarray, parameters: list[str]
) -> None:
    """One panel of :func:`plot_history`."""
    if title == "train NLL":
        ax.plot(rounds, _numeric(history, "train_nll").to_numpy(), label="train NLL")
        ax.set_ylabel("NLL per point")
    elif title in _TEST_PANELS:
        mean, spread = _TEST_PANELS[title]
        y = _numeric(history, mean).to_numpy()
        seen = ~np.isnan(y)
        x, y = rounds[seen], y[seen]
        marker = "." if seen.sum() < 30 else None
        (line,) = ax.plot(x, y, marker=marker, label=f"{title}, mean ± sd over clients")
        if spread in history:
            s = _numeric(history, spread).to_numpy()[seen]
            ax.fill_between(x, y - s, y + s, color=line.get_color(), alpha=0.2, lw=0)
        ax.set_ylabel(title.split()[1])
    else:
        values = history[parameters].apply(pd.to_numeric, errors="coerce")
        for column in parameters:
            ax.plot(rounds, values[column].to_numpy(), label=column)
        if (values > 0).all().all():
            ax.set_yscale("log")
        ax.set_ylabel("value")
    ax.set_title(title, fontsize="medium")
    ax.legend(fontsize="small")


def _numeric(history: pd.DataFrame, column: str) -> pd.Series:
    """``history[column]`` as floats (NaN where absent or not a number)."""
    if column not in history:
        return pd.Series(np.nan, index=history.index)
    return pd.to_numeric(history[column], errors="coerce").astype(float)
