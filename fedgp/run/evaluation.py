"""Per-client test metrics: each client scores its own test split, only the numbers travel."""

from __future__ import annotations

from typing import Any

import pandas as pd
import torch

from fedgp.run.exchange import ask
from fedgp.run.streaming import with_grown

__all__ = ["evaluate_clients", "mean_metrics", "METRIC_COLUMNS"]

#: The columns of :func:`evaluate_clients` for a Gaussian likelihood (a
#: :class:`~fedgp.models.variational.VariationalGPSpec` of another has its own ``metric_names``).
METRIC_COLUMNS = ["client", "n_test", "rmse", "nll", "coverage95", "cluster"]


def evaluate_clients(session: Any) -> pd.DataFrame:
    """Per-client test metrics in the original units, computed by each client on its own test split
    (columns :data:`METRIC_COLUMNS`, or the spec's ``metric_names``; ``attrs["failures"]`` names the
    clients that could not answer). ``session``: a :class:`~fedgp.run.Run` or
    :class:`~fedgp.run.FitResult` (:func:`fedgp.run.exchange.ask`)."""
    roster = session.roster
    columns = ["client", "n_test", *session.context.spec.metric_names, "cluster"]
    positions = torch.nonzero(roster.n_test > 0).flatten()
    if not len(positions):
        return pd.DataFrame(columns=columns)
    replies = ask(session, "evaluate", positions)
    answers = with_grown(session, "evaluate", replies)  # owners that added rows after fit: their own
    frame = pd.DataFrame({name: answers[name].tolist() for name in columns[1:]})
    frame.insert(0, "client", [roster.ids[p] for p in replies.clients.tolist()])
    frame.attrs["failures"] = {roster.ids[p]: r for p, r in replies.failures.items()}
    return frame


def mean_metrics(per_client: pd.DataFrame) -> dict[str, float]:
    """The history's test columns: mean and spread over clients of RMSE and NLL."""
    return {
        "test_rmse_mean": float(per_client["rmse"].mean()),
        "test_rmse_std": float(per_client["rmse"].std(ddof=0)),
        "test_nll_mean": float(per_client["nll"].mean()),
        "test_nll_std": float(per_client["nll"].std(ddof=0)),
    }
