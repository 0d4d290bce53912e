"""Simulated owner speeds: how long each owner's local work takes, for an asynchronous schedule.

In simulation nothing is slow, so :class:`~fedgp.strategies.Asynchronous` replays a schedule instead:
owner ``k``'s job lasts ``work_k / speed_k`` units of simulated time. Speeds are given (one per
owner, in registration order, e.g. measured on the real machines) or drawn from the run's seed
(:class:`LogUniform`), so a replay is a function of the seed alone. ``work`` is ``"unit"`` (every
job costs 1: speeds are jobs per unit of time) or ``"points"`` (an owner's job costs its share of
the data, ``n_k`` over the mean ``n``: a full-data local step's cost grows with its rows).

``speeds="measured"`` (:data:`MEASURED`) replays nothing: the owners' replies are timed as they
really arrive, on an engine that returns them so (:class:`fedgp.engines.arrivals.Arrivals`: a
Flower grid).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from fedgp.checks import check_settings
from fedgp.errors import InputError, InputTypeError
from fedgp.messages import Configurable, ServerContext
from fedgp.rng import generator

__all__ = ["SpeedDraw", "LogUniform", "check_speeds", "durations", "WORK", "MEASURED"]

#: What one job of an owner costs (module docstring).
WORK = ("unit", "points")
#: ``speeds`` of owners timed as their replies really arrive (module docstring).
MEASURED = "measured"


class SpeedDraw(Configurable, ABC):
    """Speeds drawn per owner from the run's seed."""

    @abstractmethod
    def draw(self, num_clients: int, seed: int) -> torch.Tensor:
        """``(num_clients,)`` float64 speeds > 0, a function of ``seed`` alone."""


@dataclass(frozen=True)
class LogUniform(SpeedDraw):
    """Speeds ``spread^u``, ``u ~ U[0, 1)`` per owner: spread over ``spread``× (log-uniformly)."""

    spread: float = 10.0

    def __post_init__(self) -> None:
        check_settings(self, spread="positive")
        if self.spread < 1:
            raise InputError(f"LogUniform: spread (fastest over slowest) must be >= 1, got {self.spread!r}")

    def draw(self, num_clients: int, seed: int) -> torch.Tensor:
        u = generator(seed, "asynchronous speeds").random(num_clients)
        return torch.from_numpy(self.spread**u)


def check_speeds(
    speeds: Sequence[float] | SpeedDraw | str | None,
) -> tuple[float, ...] | SpeedDraw | str | None:
    """``speeds`` as stored: ``None`` (all 1), a draw, :data:`MEASURED`, or a tuple of finite numbers
    > 0 (a bad one is named by its position)."""
    if speeds is None or isinstance(speeds, SpeedDraw) or (isinstance(speeds, str) and speeds == MEASURED):
        return speeds
    if isinstance(speeds, (np.ndarray, torch.Tensor)):  # measured speeds often come as an array
        speeds = np.asarray(speeds.cpu() if isinstance(speeds, torch.Tensor) else speeds, dtype=float)
        if speeds.ndim != 1:
            raise InputError(f"Asynchronous: speeds must be one number per client, got shape {speeds.shape}")
        speeds = speeds.tolist()
    if isinstance(speeds, (str, bytes)) or not isinstance(speeds, Sequence):
        raise InputTypeError(
            "Asynchronous: speeds must be None (all equal), one number per client, a draw such as "
            f"fedgp.strategies.LogUniform(spread=10), or {MEASURED!r} (timed as replies arrive, on "
            f"Flower); got {speeds!r}"
        )
    out = []
    for i, v in enumerate(speeds):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise InputError(f"Asynchronous: speeds[{i}] must be a finite number > 0, got {v!r}")
        out.append(float(v))
    if not out:
        raise InputError("Asynchronous: speeds is empty; give one number per client, or None")
    return tuple(out)


def durations(
    speeds: tuple[float, ...] | SpeedDraw | str | None, work: str, ctx: ServerContext
) -> torch.Tensor:
    """``(K,)`` float64: how long one job of each registered owner lasts, ``work_k / speed_k``."""
    k = ctx.num_clients
    if isinstance(speeds, str):
        raise InputError(
            f"Asynchronous: speeds={MEASURED!r} has no simulated durations; its replies are timed"
        )
    if speeds is None:
        rate = torch.ones(k, dtype=torch.float64)
    elif isinstance(speeds, SpeedDraw):
        rate = speeds.draw(k, ctx.seed)
    else:
        if len(speeds) != k:
            raise InputError(
                f"Asynchronous: speeds gives {len(speeds)} speeds for {k} registered clients; give one per "
                "client, in registration order"
            )
        rate = torch.tensor(speeds, dtype=torch.float64)
    cost = torch.ones(k, dtype=torch.float64)
    if work == "points":
        sizes = ctx.sizes.to(torch.float64)
        cost = sizes / sizes.mean()
    return cost / rate
