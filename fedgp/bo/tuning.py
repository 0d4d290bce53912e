"""Owners that tune a model on their own data: the real-data benchmark family of federated BO.

FTS's Landmine task in spirit (29 fields, each agent tunes an SVM on its own field's data): here
each owner is one turbofan engine of NASA's C-MAPSS (:func:`fedgp.datasets.load_cmapss`, FD001: 100
run-to-failure engines, public, read offline from ``FEDGP_DATA``), and tunes kernel ridge regression
predicting the engine's remaining useful life (capped at 125 cycles, the usual piecewise-linear
target) from its 14 informative sensors. The owners are real units with their own degradation and
noise, the same two hyper-parameters matter to all of them, and 100 engines give K = 100 owners
without cutting a data set into slivers.

The black box, :class:`KernelRidgeTuning`, maps ``u ∈ [0, 1]²`` to ``log10 α`` (the ridge) and
``log10 (ℓ / √p)`` (the RBF lengthscale relative to the sensors' dimension ``p``) and returns
``-log(RMSE / sd)`` of the validation predictions (sd: the validation targets' standard deviation):
0 for predicting the mean, higher is better, and a regret of 0.1 means a validation RMSE about 10 %
above the best tuning. Every third cycle is validation, the rest training; sensors are
standardised by the training rows' mean and sd. The black box is exact linear algebra in torch, so
:meth:`KernelRidgeTuning.maximum` polishes a grid's best points with gradients.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from fedgp.bo.maximise import maximise
from fedgp.bo.owner import DTYPE, Owner
from fedgp.errors import InputError

__all__ = ["KernelRidgeTuning", "cmapss_tuning_owners", "INFORMATIVE_SENSORS", "UNIT_BOX"]

#: The 14 C-MAPSS sensors that vary in FD001 (the other seven are constant there).
INFORMATIVE_SENSORS = tuple(f"s{i}" for i in (2, 3, 4, 7, 8, 9, 11, 12, 13, 14, 15, 17, 20, 21))
#: Every owner searches the unit square.
UNIT_BOX = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=DTYPE)


@dataclass(frozen=True)
class KernelRidgeTuning:
    """``u -> -log(validation RMSE / sd)`` of RBF kernel ridge on ``(X_train, y_train)``, predicting
    ``y_val`` at ``X_val`` (module docstring); ``alpha_range`` and ``lengthscale_range`` are the
    ``log10`` ranges that ``u``'s two coordinates span."""

    X_train: torch.Tensor
    y_train: torch.Tensor
    X_val: torch.Tensor
    y_val: torch.Tensor
    alpha_range: tuple[float, float] = (-3.0, 2.0)
    lengthscale_range: tuple[float, float] = (-1.0, 1.0)

    @classmethod
    def from_arrays(cls, X: np.ndarray, y: np.ndarray, every: int = 3, **ranges) -> KernelRidgeTuning:
        """Rows ``every-1, 2·every-1, ...`` for validation, the rest for training; inputs standardised
        by the training rows (a constant column is left centred, not divided by zero)."""
        X, y = np.asarray(X, dtype=float), np.asarray(y, dtype=float)
        if X.ndim != 2 or y.shape != (len(X),) or len(X) < 2 * every:
            raise InputError(
                f"KernelRidgeTuning: need X (n x p) and y (n) with n >= {2 * every}, got {X.shape}, {y.shape}"
            )
        val = np.arange(len(X)) % every == every - 1
        mean, sd = X[~val].mean(0), X[~val].std(0)
        X = (X - mean) / np.where(sd > 0, sd, 1.0)
        t = lambda a: torch.as_tensor(a, dtype=DTYPE)  # noqa: E731
        return cls(t(X[~val]), t(y[~val]), t(X[val]), t(y[val]), **ranges)

    def hyper_parameters(self, U: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(α, ℓ)`` of each row of ``U`` (``n x 2`` in the unit square)."""
        (a0, a1), (l0, l1) = self.alpha_range, self.lengthscale_range
        alpha = 10.0 ** (a0 + U[..., 0] * (a1 - a0))
        lengthscale = 10.0 ** (l0 + U[..., 1] * (l1 - l0)) * math.sqrt(self.X_train.shape[1])
        return alpha, lengthscale

    def __call__(self, U: torch.Tensor) -> torch.Tensor:
        U = torch.as_tensor(U, dtype=DTYPE).reshape(-1, 2)
        train = torch.cdist(self.X_train, self.X_train).square()
        cross = torch.cdist(self.X_val, self.X_train).square()
        eye = torch.eye(len(self.X_train), dtype=DTYPE)
        centre = self.y_train.mean()
        scale = self.y_val.std()
        alpha, lengthscale = self.hyper_parameters(U)
        out = []
        for a, ell in zip(alpha, lengthscale):
            K = torch.exp(-train / (2 * ell * ell)) + a * eye
            weights = torch.cholesky_solve((self.y_train - centre).unsqueeze(-1), torch.linalg.cholesky(K))
            pred = (torch.exp(-cross / (2 * ell * ell)) @ weights).squeeze(-1) + centre
            out.append(-torch.log((pred - self.y_val).square().mean().sqrt() / scale))
        return torch.stack(out)

    def maximum(self, grid: int = 31, starts: int = 3) -> tuple[torch.Tensor, float]:
        """``(u*, value)``: the best of a ``grid x grid`` grid, polished by L-BFGS-B from its
        ``starts`` best points."""
        g = torch.linspace(0.0, 1.0, grid, dtype=DTYPE)
        return maximise(self, torch.cartesian_prod(g, g), UNIT_BOX, starts=starts)


def cmapss_tuning_owners(
    frame: pd.DataFrame, units: Sequence[int], *, cap: float = 125.0, grid: int | None = 31, **ranges
) -> list[Owner]:
    """One :class:`~fedgp.bo.Owner` per engine of ``units`` in a C-MAPSS training ``frame``
    (``load_cmapss(...).frame("train")``): its objective the :class:`KernelRidgeTuning` of that
    engine's rows (target: remaining useful life capped at ``cap``), its box the unit square, its
    ``optimum`` :meth:`KernelRidgeTuning.maximum` on a ``grid x grid`` grid (``grid=None``: no
    optimum, so no regret; for a caller that has them already)."""
    missing = [c for c in ("unit", "cycle", *INFORMATIVE_SENSORS) if c not in frame.columns]
    if missing:
        raise InputError(f"cmapss_tuning_owners: the frame lacks the column(s) {missing}")
    present = set(frame["unit"].unique().tolist())
    owners = []
    for unit in units:
        if unit not in present:
            raise InputError(f"cmapss_tuning_owners: engine {unit!r} is not in the frame")
        rows = frame[frame["unit"] == unit].sort_values("cycle")
        life = rows["cycle"].max() - rows["cycle"].to_numpy()
        task = KernelRidgeTuning.from_arrays(
            rows[list(INFORMATIVE_SENSORS)].to_numpy(), np.minimum(life, cap), **ranges
        )
        optimum = None if grid is None else task.maximum(grid)[1]
        owners.append(Owner(int(unit), task, UNIT_BOX, optimum=optimum))
    return owners
