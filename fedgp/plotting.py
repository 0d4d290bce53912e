"""Matplotlib helpers for personalised predictions and convergence curves."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from fedgp.errors import InputError

__all__ = ["plot_personalised", "plot_convergence"]


def plot_personalised(
    result, client: Any, ax=None, X: torch.Tensor | None = None, level: float = 0.95, label=None
):
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


def plot_convergence(rounds: np.ndarray, error: np.ndarray, ax=None, label: str = "FGPR"):
    """Squared hyper-parameter error against communication round, log-log."""
    import matplotlib.pyplot as plt

    ax = plt.gca() if ax is None else ax
    ax.loglog(rounds, error, label=label)
    ax.set_xlabel("communication round")
    ax.set_ylabel(r"$\|\bar\theta - \theta^*\|^2$ (outputscale, noise)")
    return ax
