"""Shared plumbing for the baselines: clients stacked into padded tensors, Gaussian predictions."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedgp.data.client import ClientData, Federation
from fedgp.models.posterior import Prediction

__all__ = ["Stacked", "stack", "point_prediction", "check_federation"]


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
        raise ValueError("every client needs a test split here")
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
        raise TypeError(f"{name}.fit needs a fedgp.data.Federation, got {type(federation).__name__}")


def point_prediction(mean: torch.Tensor, noise_variance: float) -> Prediction:
    """A point predictor turned into a Gaussian predictive ``N(mean, noise_variance)``.

    The baselines predict a mean only; to put NLL and coverage next to their RMSE they are given a
    homoscedastic Gaussian with the variance of their residuals on held-out validation data (no
    epistemic part: ``variance_f`` is zero).
    """
    if not noise_variance > 0:
        raise ValueError(f"noise_variance must be positive, got {noise_variance}")
    mean = mean.detach().to(torch.float64)
    return Prediction(mean, torch.zeros_like(mean), torch.full_like(mean, float(noise_variance)))
