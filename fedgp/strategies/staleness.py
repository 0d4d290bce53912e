"""Staleness weights: how much an asynchronous server trusts a reply computed from an old state.

A reply trained from state version ``v`` that reaches a server already at version ``t`` is ``τ = t − v``
versions stale; :class:`~fedgp.strategies.Asynchronous` multiplies its update by ``s(τ)``. Every rule
here has ``s(0) = 1`` (a fresh reply counts in full, so a buffer of fresh replies is the synchronous
round) and is non-increasing in ``τ``.

* :class:`Polynomial` — ``(1 + τ)^(−a)``: FedAsync's polynomial rule (Xie, Koyejo & Gupta 2019) and
  FedBuff's (Nguyen et al. 2022; ``a = 0.5`` is ``1/√(1+τ)``). FLSim additionally normalises by the
  value at an average staleness; fedgp does not: the weight is the formula's.
* :class:`Hinge` — 1 up to ``b`` versions, then ``1 / (a(τ − b) + 1)`` (FedAsync's hinge rule).
* :class:`Constant` — 1 whatever the staleness: stale replies are applied in full.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from fedgp.checks import check_settings
from fedgp.errors import InputError
from fedgp.messages import Configurable

__all__ = ["StalenessWeight", "Polynomial", "Hinge", "Constant"]


class StalenessWeight(Configurable, ABC):
    """``s(τ)``: the factor of a reply ``τ`` server versions stale (``s(0) = 1``)."""

    @abstractmethod
    def __call__(self, staleness: torch.Tensor) -> torch.Tensor:
        """The weights (float64) of integer staleness values ``τ >= 0``, elementwise."""


@dataclass(frozen=True)
class Polynomial(StalenessWeight):
    """``(1 + τ)^(−a)``; ``a = 0`` weighs every reply 1."""

    a: float = 0.5

    def __post_init__(self) -> None:
        check_settings(self, a="nonnegative")

    def __call__(self, staleness: torch.Tensor) -> torch.Tensor:
        return (1.0 + staleness.to(torch.float64)) ** (-self.a)


@dataclass(frozen=True)
class Hinge(StalenessWeight):
    """1 for ``τ <= b``, else ``1 / (a (τ − b) + 1)``."""

    a: float = 10.0
    b: int = 4

    def __post_init__(self) -> None:
        check_settings(self, a="nonnegative")
        if isinstance(self.b, bool) or not isinstance(self.b, int) or self.b < 0:
            raise InputError(f"Hinge: b (the staleness weighed in full) must be an int >= 0, got {self.b!r}")

    def __call__(self, staleness: torch.Tensor) -> torch.Tensor:
        tau = staleness.to(torch.float64)
        return torch.where(tau <= self.b, torch.ones_like(tau), 1.0 / (self.a * (tau - self.b) + 1.0))


@dataclass(frozen=True)
class Constant(StalenessWeight):
    """1 whatever the staleness."""

    def __call__(self, staleness: torch.Tensor) -> torch.Tensor:
        return torch.ones(staleness.shape, dtype=torch.float64)
