"""Black boxes for the Flower BO tests, imported on each node by name (``bo-objective``): three
owners of one smooth family in two inputs on [0, 1]², their optima shifted (deterministic, so the
deployment and the in-process loop evaluate the same values)."""

from __future__ import annotations

import torch

BOUNDS = [[0.0, 0.0], [1.0, 1.0]]
#: Each owner's optimum location; the maximum value of every objective is 1.
CENTRES = {"plant_a": (0.3, 0.6), "plant_b": (0.45, 0.5), "plant_c": (0.6, 0.35)}


def _bump(X: torch.Tensor, centre: tuple[float, float]) -> torch.Tensor:
    c = torch.tensor(centre, dtype=X.dtype)
    return torch.exp(-((X - c) ** 2).sum(-1) / 0.08) + 0.1 * torch.sin(6 * X[..., 0]) * X[..., 1]


def plant_a(X: torch.Tensor) -> torch.Tensor:
    return _bump(X, CENTRES["plant_a"])


def plant_b(X: torch.Tensor) -> torch.Tensor:
    return _bump(X, CENTRES["plant_b"])


def plant_c(X: torch.Tensor) -> torch.Tensor:
    return _bump(X, CENTRES["plant_c"])
