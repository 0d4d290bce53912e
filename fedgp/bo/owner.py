"""``Owner``: one party of a federated BO run — its black box, its search box, its evaluations.

An owner's objective is a plain Python function on the owner's own process (in-process engines run
every owner here); the loop calls it with the points the owner chose and keeps the rows it returns
with the owner, never elsewhere. Everything the objective returns is checked where it enters: a
wrong shape, a NaN or an infinity is an :class:`~fedgp.errors.InputError` naming the owner, not a
failure three calls later inside a Cholesky factorisation.

BoTorch maximises; so does this loop. To minimise ``g``, give ``lambda X: -g(X)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from fedgp.errors import InputError, InputTypeError

__all__ = ["Owner"]

DTYPE = torch.float64


def _as_bounds(bounds: Any, who: str) -> torch.Tensor:
    try:
        b = torch.as_tensor(np.asarray(bounds, dtype=float), dtype=DTYPE)
    except (TypeError, ValueError) as err:
        raise InputTypeError(f"{who}: bounds must be a 2 x d array of numbers ({err})") from None
    if b.ndim != 2 or b.shape[0] != 2 or b.shape[1] < 1:
        raise InputError(f"{who}: bounds must have shape (2, d) (lower row, upper row), got {tuple(b.shape)}")
    if not torch.isfinite(b).all() or not (b[0] < b[1]).all():
        raise InputError(f"{who}: bounds must be finite with lower < upper in every column, got {b.tolist()}")
    return b


@dataclass
class Owner:
    """One owner: ``objective(X) -> y`` on points ``X`` (``q x d`` tensor, float64) returning ``q``
    values to maximise, inside ``bounds`` (``2 x d``: lower and upper row).

    Args:
        id: the owner's name, in every error and history row.
        objective: the black box (noisy evaluations are fine).
        bounds: the search box.
        truth: optional noise-free version of the objective, used only to report the simple regret of
            the points evaluated (a benchmark's privilege; a real owner leaves it out).
        optimum: optional known maximum of ``truth`` (or of the objective): the regret's reference.
        X, y: evaluations the owner already has (default none).
    """

    id: Any
    objective: Callable[[torch.Tensor], Any]
    bounds: Any
    truth: Callable[[torch.Tensor], Any] | None = None
    optimum: float | None = None
    X: torch.Tensor | None = None
    y: torch.Tensor | None = None
    evaluations: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if not callable(self.objective):
            raise InputTypeError(
                f"owner {self.id!r}: objective must be callable, got {type(self.objective).__name__}"
            )
        self.bounds = _as_bounds(self.bounds, f"owner {self.id!r}")
        d = self.dim
        if (self.X is None) != (self.y is None):
            raise InputError(f"owner {self.id!r}: give both X and y (its evaluations so far) or neither")
        if self.X is None:
            self.X, self.y = torch.empty(0, d, dtype=DTYPE), torch.empty(0, dtype=DTYPE)
        else:
            self.X = torch.as_tensor(self.X, dtype=DTYPE)
            if self.X.ndim != 2 or self.X.shape[1] != d:
                raise InputError(f"owner {self.id!r}: X must have shape (n, {d}), got {tuple(self.X.shape)}")
            self.y = self._values(self.y, len(self.X), "y")
        if self.optimum is not None and not np.isfinite(float(self.optimum)):
            raise InputError(f"owner {self.id!r}: optimum must be finite, got {self.optimum!r}")

    @property
    def dim(self) -> int:
        """The number of inputs d."""
        return int(self.bounds.shape[1])

    def _values(self, values: Any, q: int, what: str) -> torch.Tensor:
        """``values`` as a float64 vector of ``q`` finite numbers, or an error naming the owner."""
        try:
            v = torch.as_tensor(np.asarray(values, dtype=float), dtype=DTYPE)
        except (TypeError, ValueError) as err:
            raise InputTypeError(
                f"owner {self.id!r}: {what} returned something that is not numbers ({err})"
            ) from None
        if v.ndim == 2 and v.shape[1] == 1:
            v = v[:, 0]
        if v.shape != (q,):
            raise InputError(
                f"owner {self.id!r}: {what} must give {q} value(s) for {q} point(s) (shape ({q},) or "
                f"({q}, 1)), got shape {tuple(v.shape)}"
            )
        if not torch.isfinite(v).all():
            bad = int((~torch.isfinite(v)).nonzero()[0, 0])
            raise InputError(
                f"owner {self.id!r}: {what} gave a non-finite value ({float(v[bad])}) at point {bad}"
            )
        return v

    def evaluate(self, X: torch.Tensor) -> torch.Tensor:
        """Call the objective on ``X`` (``q x d``, inside the bounds), check its values and keep the rows."""
        X = torch.as_tensor(X, dtype=DTYPE).reshape(-1, self.dim)
        lower, upper = self.bounds
        if not ((X >= lower - 1e-9) & (X <= upper + 1e-9)).all():
            raise InputError(f"owner {self.id!r}: asked to evaluate points outside its bounds: {X.tolist()}")
        X = X.clamp(lower, upper)
        y = self._values(self.objective(X.clone()), len(X), "objective")
        self.X, self.y = torch.cat([self.X, X]), torch.cat([self.y, y])
        self.evaluations += len(X)
        return y

    def best_observed(self) -> float:
        """The largest value the objective returned so far (NaN before any evaluation)."""
        return float(self.y.max()) if len(self.y) else float("nan")

    def regret(self) -> float:
        """Simple regret ``optimum - max truth(x_i)`` over the points so far (``truth`` defaults to the
        objective's observed values); NaN without a known optimum."""
        if self.optimum is None or not len(self.y):
            return float("nan")
        best = (
            self._values(self.truth(self.X.clone()), len(self.X), "truth").max()
            if self.truth
            else self.y.max()
        )
        return float(self.optimum) - float(best)
