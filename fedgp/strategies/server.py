"""Server optimisers: what the server does with the clients' average, FedOpt style.

FedAvg replaces the global state by the clients' (weighted) average. FedOpt (Reddi et al., 2021,
"Adaptive Federated Optimization", Algorithm 2) reads the move to that average as a
pseudo-gradient, ``Δ_t = avg_t − x_t``, and lets a server optimiser take the step: momentum
(FedAvgM, Hsu et al., 2019) or per-parameter adaptive steps (FedAdam, FedYogi). The clients then
need no adaptivity of their own, and the fixed point is where the *average* of the clients'
updates vanishes: with a few plain SGD steps per round, the stationary point of the summed
objective. (An Adam restarted every round on the clients takes steps of about ``lr`` whatever
the gradient's size, so the average of their updates vanishes where as many clients push up as
down, not where the summed gradient does.)

Steps are taken on GPyTorch's raw (unconstrained) parameters, as the local optimisers do, except
on those the spec names in ``server_averaged`` (a :class:`~fedgp.VariationalGPSpec`'s inducing
locations), which take the plain average. The rules are written as pure functions over tensors,
like :mod:`fedgp.strategies.local`, so that a strategy's server state (the moments) is plain
tensors a checkpoint can hold. Flower ships the
same rules (``flwr.server.strategy.FedAvgM``, ``FedAdam``, ``FedYogi``); Flower's FedAdam adds
Adam's bias correction and starts ``v`` at 0, where Reddi et al. start it at ``τ²`` without one:
these follow the paper.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from fedgp.checks import RULES, check_settings
from fedgp.errors import InputError
from fedgp.messages import Configurable
from fedgp.models.spec import GPSpec
from fedgp.models.state import HyperState

__all__ = ["ServerOptimizer", "FedAvgM", "FedAdam", "FedYogi", "ServerState"]

Tensors = dict[str, torch.Tensor]


@dataclass(frozen=True)
class ServerState:
    """A strategy's server state under a server optimiser: the global hyper-parameters, the
    optimiser's slots (raw-space tensors per parameter, e.g. Adam's moments) and its step count."""

    theta: HyperState
    slots: dict[str, dict[str, torch.Tensor]]
    steps: int = 0


class ServerOptimizer(Configurable, ABC):
    """A server step rule on the pseudo-gradient ``Δ = average − x`` (raw parameters)."""

    def init(self, raw: Tensors) -> dict[str, Tensors]:
        """The slots before the first round (none for plain momentum-free steps)."""
        return {}

    @abstractmethod
    def update(self, x: torch.Tensor, delta: torch.Tensor, slots: Tensors) -> tuple[torch.Tensor, Tensors]:
        """The new value of one raw parameter and of its slots."""

    def start(self, theta: HyperState) -> ServerState:
        """The server state of round 0."""
        return ServerState(theta, self.init(dict(theta.items())), 0)

    def step(self, spec: GPSpec, server: ServerState, average: HyperState) -> ServerState:
        """One server step from ``server`` towards the clients' ``average``; the parameters the spec
        names in ``server_averaged`` take the average itself (FedAvg), their slots untouched."""
        x, target = spec.to_raw(server.theta), spec.to_raw(average)
        new, slots = {}, {name: dict(values) for name, values in server.slots.items()}
        averaged = spec.server_averaged
        for name in x:
            if name in averaged:
                new[name] = target[name]
                continue
            own = {slot: values[name] for slot, values in slots.items()}
            new[name], own = self.update(x[name], target[name] - x[name], own)
            for slot, value in own.items():
                slots[slot][name] = value
        theta = spec.from_raw(HyperState(new, spec.event_shapes))
        return ServerState(theta, slots, server.steps + 1)


@dataclass(frozen=True)
class FedAvgM(ServerOptimizer):
    """Server momentum (Hsu et al., 2019): ``v ← β v + Δ``, ``x ← x + η v``. ``lr=1,
    momentum=0`` is FedAvg."""

    lr: float = 1.0
    momentum: float = 0.9

    def __post_init__(self) -> None:
        check_settings(self, lr="positive", momentum="fraction")

    def init(self, raw) -> dict[str, Tensors]:
        return {"v": {k: torch.zeros_like(v) for k, v in raw.items()}}

    def update(self, x, delta, slots) -> tuple[torch.Tensor, Tensors]:
        v = self.momentum * slots["v"] + delta
        return x + self.lr * v, {"v": v}


@dataclass(frozen=True)
class FedAdam(ServerOptimizer):
    """FedAdam (Reddi et al., 2021, Alg. 2): ``m ← β₁ m + (1 − β₁) Δ``,
    ``v ← β₂ v + (1 − β₂) Δ²``, ``x ← x + η m / (√v + τ)``, from ``m = 0``, ``v = τ²``."""

    lr: float = 0.1
    betas: tuple[float, float] = (0.9, 0.99)
    tau: float = 1e-3

    def __post_init__(self) -> None:
        check_settings(self, lr="positive", tau="positive")
        if len(self.betas) != 2 or not all(RULES["fraction"][0](b) for b in self.betas):
            raise InputError(
                f"{type(self).__name__}: betas must be two numbers in [0, 1), got {self.betas!r}"
            )

    def init(self, raw) -> dict[str, Tensors]:
        return {
            "m": {k: torch.zeros_like(v) for k, v in raw.items()},
            "v": {k: torch.full_like(v, self.tau**2) for k, v in raw.items()},
        }

    def second_moment(self, v: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        """Adam's running mean of ``Δ²``."""
        b2 = self.betas[1]
        return b2 * v + (1 - b2) * delta * delta

    def update(self, x, delta, slots) -> tuple[torch.Tensor, Tensors]:
        m = self.betas[0] * slots["m"] + (1 - self.betas[0]) * delta
        v = self.second_moment(slots["v"], delta)
        return x + self.lr * m / (v.sqrt() + self.tau), {"m": m, "v": v}


@dataclass(frozen=True)
class FedYogi(FedAdam):
    """FedYogi (Reddi et al., 2021, Alg. 2): FedAdam with Yogi's additive second moment,
    ``v ← v − (1 − β₂) Δ² sign(v − Δ²)``, which grows no faster than ``Δ²`` does."""

    def second_moment(self, v, delta) -> torch.Tensor:
        """Yogi's second moment."""
        square = delta * delta
        return v - (1 - self.betas[1]) * square * torch.sign(v - square)
