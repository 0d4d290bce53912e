"""What the federated baselines share: their protocol, clients named as ``fit`` results name them,
clients stacked into padded tensors, Gaussian predictions around a point predictor."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from fedgp.data.client import ClientData, Federation
from fedgp.errors import InputError, InputTypeError, NotFittedError, UnknownClientError
from fedgp.models.posterior import Prediction

__all__ = [
    "FederatedBaseline",
    "Stacked",
    "stack",
    "point_prediction",
    "check_federation",
    "client_position",
    "shared_prediction",
]


class FederatedBaseline(Protocol):
    """The shape of every federated baseline (:class:`~fedgp.baselines.LocalGP`,
    :class:`~fedgp.baselines.CentralGP`, :class:`~fedgp.baselines.FedAvgPolynomial`,
    :class:`~fedgp.baselines.FedAvgMLP`, :class:`~fedgp.baselines.Ditto`): trained on a federation,
    asked for one client's predictive distribution, as a :class:`fedgp.FitResult` is
    (:meth:`~fedgp.FitResult.posterior`).

    ``client`` is a position in the fitted federation, a client id, or a ``ClientData`` (one of the
    federation's, or a new client where the baseline can serve one). A call before ``fit`` raises
    :class:`fedgp.errors.NotFittedError`. The multi-fidelity :class:`~fedgp.baselines.MFDGP` is not
    federated and keeps ``fit(levels)`` / ``predict(X, level)``.
    """

    def fit(self, federation: Federation) -> FederatedBaseline:
        """Train on ``federation``; returns the baseline itself."""
        ...

    def predict(self, X: Any, client: Any) -> Prediction:
        """``client``'s predictive distribution at ``X`` (original units)."""
        ...


@dataclass(frozen=True)
class Stacked:
    """Clients' rows padded to a common length: X ``(K, n_max, d)``, y ``(K, n_max)``, mask, sizes,
    and the FedAvg weights ``p_k = N_k / N``. Padded rows are zero and masked out."""

    X: torch.Tensor
    y: torch.Tensor
    mask: torch.Tensor
    sizes: torch.Tensor
    weights: torch.Tensor


def stack(clients: list[ClientData] | Federation, which: str = "train") -> Stacked:
    pairs = [(c.X, c.y) if which == "train" else (c.X_test, c.y_test) for c in clients]
    if which != "train" and any(X is None for X, _ in pairs):
        raise InputError("every client needs a test split here")
    sizes = torch.tensor([len(y) for _, y in pairs], dtype=torch.long)
    n_max, d = int(sizes.max()), pairs[0][0].shape[1]
    X = torch.zeros(len(pairs), n_max, d, dtype=torch.float64)
    y = torch.zeros(len(pairs), n_max, dtype=torch.float64)
    mask = torch.zeros(len(pairs), n_max, dtype=torch.bool)
    for k, (Xk, yk) in enumerate(pairs):
        X[k, : len(yk)], y[k, : len(yk)], mask[k, : len(yk)] = Xk, yk, True
    weights = sizes.to(torch.float64) / sizes.sum()
    return Stacked(X, y, mask, sizes, weights)


def check_federation(federation: Federation, name: str) -> None:
    if not isinstance(federation, Federation):
        raise InputTypeError(f"{name}.fit needs a fedgp.data.Federation, got {type(federation).__name__}")


def point_prediction(mean: torch.Tensor, noise_variance: float) -> Prediction:
    """A point predictor turned into a Gaussian predictive ``N(mean, noise_variance)``.

    The baselines predict a mean only; to put NLL and coverage next to their RMSE they are given a
    homoscedastic Gaussian with the variance of their residuals on held-out validation data (no
    epistemic part: ``variance_f`` is zero).
    """
    if not noise_variance > 0:
        raise InputError(f"noise_variance must be positive, got {noise_variance}")
    mean = mean.detach().to(torch.float64)
    return Prediction(mean, torch.zeros_like(mean), torch.full_like(mean, float(noise_variance)))


def client_position(federation: Federation | None, client: Any, name: str) -> int | None:
    """Where ``client`` sits in the fitted ``federation``, as :meth:`fedgp.FitResult.predict` reads it.

    An int is a position; a ``ClientData`` of the federation (the same object) is that client, any
    other ``ClientData`` a new client (``None``); anything else is an id. ``federation=None``: the
    baseline is not fitted, and only a new ``ClientData`` can be answered.
    """
    if isinstance(client, ClientData):
        members = () if federation is None else federation
        return next((i for i, member in enumerate(members) if member is client), None)
    if federation is None:
        raise NotFittedError(f"{name} is not fitted yet; call fit(federation)")
    if isinstance(client, (int, np.integer)) and not isinstance(client, bool):
        if not 0 <= int(client) < len(federation):
            raise UnknownClientError(
                f"client={int(client)}: {name} was fitted on {len(federation)} clients, positions "
                f"0..{len(federation) - 1}"
            )
        return int(client)
    try:
        return federation.index_of(client)
    except KeyError:
        raise UnknownClientError(f"client={client!r}: no client with that id among {name}'s") from None


def shared_prediction(model: Any, mean: torch.Tensor, client: Any) -> Prediction:
    """The prediction of a global point predictor (FedAvg polynomial, FedAvg MLP) for ``client``:
    ``N(mean, model.noise_variance)``, the same for every client, so ``client`` is only checked
    (:func:`client_position`). Without a held-out ``noise_variance``: the federated training MSE of
    the fit's last round (optimistic)."""
    name = type(model).__name__
    if client is not None:
        client_position(model.federation_, client, name)
    if model.noise_variance is not None:
        return point_prediction(mean, float(model.noise_variance))
    noise = float(model.history_["train_mse"].iloc[-1])
    if not noise > 0:
        raise InputError(
            f"{name} fits its training data exactly (training MSE {noise:.3g}): give it a noise_variance "
            "(a held-out residual variance) for a Gaussian predictive"
        )
    return point_prediction(mean, noise)
