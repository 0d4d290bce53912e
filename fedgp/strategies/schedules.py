"""Step-size schedules across rounds: the local learning rate of round ``r`` (0-based) is
``lr * schedule(r)``.

FGPR's convergence theory (Yue & Kontar) assumes a decaying step, η_t = β/t on the global step
counter; :class:`fedgp.strategies.local.SGD` has that as ``schedule="inverse_t"``. These
schedules decay any local optimiser (Adam included) once per round, so a minibatch run's
jitter shrinks as it goes instead of staying at the size of its constant step.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass

from fedgp.checks import check_settings
from fedgp.errors import InputError
from fedgp.messages import Configurable

__all__ = ["LRSchedule", "InverseRound", "CosineDecay", "StepDecay"]


class LRSchedule(Configurable, ABC):
    """The factor by which round ``r``'s local learning rate is multiplied."""

    @abstractmethod
    def __call__(self, r: int) -> float:
        """The factor for round ``r`` (0-based; round 0 has factor 1)."""


@dataclass(frozen=True)
class InverseRound(LRSchedule):
    """``1 / (1 + r / scale)``: the theory's O(1/t), counted in rounds, halved after ``scale``."""

    scale: float = 10.0

    def __post_init__(self) -> None:
        check_settings(self, scale="positive")

    def __call__(self, r: int) -> float:
        return 1.0 / (1.0 + r / self.scale)


@dataclass(frozen=True)
class CosineDecay(LRSchedule):
    """Half a cosine from 1 at round 0 to ``floor`` at round ``rounds`` (and ``floor`` after)."""

    rounds: int = 100
    floor: float = 0.0

    def __post_init__(self) -> None:
        check_settings(self, rounds="count")
        if not 0 <= self.floor <= 1:
            raise InputError(f"CosineDecay: floor must be in [0, 1], got {self.floor!r}")

    def __call__(self, r: int) -> float:
        done = min(r, self.rounds) / self.rounds
        return self.floor + (1 - self.floor) * 0.5 * (1 + math.cos(math.pi * done))


@dataclass(frozen=True)
class StepDecay(LRSchedule):
    """``gamma ** (r // every)``: the step multiplied by ``gamma`` every ``every`` rounds."""

    every: int = 25
    gamma: float = 0.5

    def __post_init__(self) -> None:
        check_settings(self, every="count")
        if not 0 < self.gamma <= 1:
            raise InputError(f"StepDecay: gamma must be in (0, 1], got {self.gamma!r}")

    def __call__(self, r: int) -> float:
        return self.gamma ** (r // self.every)
