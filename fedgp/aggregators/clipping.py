"""Centred clipping (Karimireddy, He & Jaggi 2021)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedgp.aggregators.base import StateAggregator, check_count, check_space
from fedgp.errors import InputError

__all__ = ["CenteredClipping"]


@dataclass(frozen=True)
class CenteredClipping(StateAggregator):
    """``v ← v + (1/n) Σ_i (u_i − v) · min(1, τ/‖u_i − v‖)``, ``iterations`` times, centred on the
    previous aggregate (the previous state: ``v₀ = 0`` in update space).

    Uniform over participants (weights p_k ignored: a Byzantine client could inflate its size).
    Each step moves ``v`` by at most τ, so the result lies within ``iterations · τ`` of the previous
    state, whatever any participant sends; the attackers' share of a step is at most ``f τ / n``.
    """

    tau: float = 1.0
    iterations: int = 3
    space: str = "raw"

    def __post_init__(self) -> None:
        check_space(self.space)
        check_count("CenteredClipping: iterations", self.iterations, 1)
        if not self.tau > 0:
            raise InputError(f"CenteredClipping: tau must be > 0, got {self.tau}")

    def combine(self, values, weights, rng=None) -> torch.Tensor:
        v = torch.zeros(values.shape[1], dtype=values.dtype)
        for _ in range(self.iterations):
            diff = values - v
            norm = diff.norm(dim=1, keepdim=True)
            scale = torch.clamp(self.tau / norm.clamp_min(1e-300), max=1.0)
            v = v + (diff * scale).mean(0)
        return v
