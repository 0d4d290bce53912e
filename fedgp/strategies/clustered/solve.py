"""Local solvers: what a client does with the state(s) it updates in a clustered round."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch

from fedgp.checks import check_settings
from fedgp.errors import InputError
from fedgp.messages import Configurable
from fedgp.models.linear import LinearMeanModel
from fedgp.models.state import HyperState
from fedgp.strategies.base import ClientOps
from fedgp.strategies.clustered.state import ClosedForm
from fedgp.strategies.local import SGD, Adam, LocalTraining

__all__ = [
    "LocalSolver",
    "GradientDescent",
    "ProximalSolve",
    "LocalTrainingSolver",
    "GradientSolver",
    "step_sizes",
    "check_units",
]


def step_sizes(lr: float, units: str, model: LinearMeanModel | None, states: HyperState) -> torch.Tensor:
    """The NLL-scale step size per state: ``lr``, or ``lr · σ²`` for squared-loss units."""
    batch = tuple(states.batch_shape)
    if units == "nll":
        return torch.full(batch, float(lr), dtype=torch.float64)
    if model is None:
        raise InputError("step sizes in squared-loss units need a mean linear in its parameters")
    return lr * model.noise(states)


def _single_lr(lrs: torch.Tensor) -> float:
    if lrs.numel() and not bool((lrs == lrs.reshape(-1)[0]).all()):
        raise InputError(
            "squared-loss step sizes with the generic (GPyTorch) path need one noise variance for all "
            "states; fix the noise or give the step in NLL units"
        )
    return float(lrs.reshape(-1)[0])


def check_units(units: str) -> None:
    """Refuse units other than ``"nll"`` or ``"squared_loss"`` with a ``ValueError``."""
    if units not in ("nll", "squared_loss"):
        raise InputError(f"units must be 'nll' or 'squared_loss', got {units!r}")


class LocalSolver(Configurable, ABC):
    """What a client does with the state(s) it updates: batch ``(B, *E)`` in, the same out."""

    returns_gradient = False

    @abstractmethod
    def solve(
        self, ops: ClientOps, states: HyperState, form: ClosedForm
    ) -> tuple[HyperState, torch.Tensor | None]:
        """Client: new states from the given ones (batch ``(B, R)``), and the training loss if known."""

    def has_loss(self, closed: bool) -> bool:
        """Whether :meth:`solve` returns a training loss (declared in advance as a reply field)."""
        return not closed


def _closed_form(form: ClosedForm, states: HyperState, step) -> HyperState:
    """``step(model, θ, σ²)`` on the mean-parameter vectors of ``states``, written back into them."""
    model = form.model
    return model.with_vector(states, step(model, model.vector(states), model.noise(states)))


def _trained(ops: ClientOps, states: HyperState, local: LocalTraining):
    result = ops.train(states, local)
    return result.states, result.loss


@dataclass(frozen=True)
class GradientDescent(LocalSolver):
    """``steps`` full-batch gradient steps on the client's per-point NLL: FedAvg's local update.

    ``units="squared_loss"`` reads ``lr`` as the step η on the squared loss ``‖y − Φθ‖²/(2n)`` of the
    mixed-regression papers (the NLL step is then ``η σ²``; exact for the noise-only GP). Closed form
    for the noise-only linear model; otherwise ``ClientOps.train`` with constant-step SGD.
    """

    lr: float = 0.05
    steps: int = 1
    units: str = "nll"

    def __post_init__(self) -> None:
        check_units(self.units)
        check_settings(self, lr="positive", steps="count")

    def solve(self, ops, states, form) -> tuple[HyperState, torch.Tensor | None]:
        """``steps`` gradient steps (closed form for a linear mean, else SGD through the engine)."""
        lrs = step_sizes(self.lr, self.units, form.model, states)
        if form.closed:
            step = lambda m, theta, noise: m.gradient_steps(ops.clients, theta, noise, lrs, self.steps)  # noqa: E731
            return _closed_form(form, states, step), None
        sgd = SGD(lr=_single_lr(lrs), schedule="constant")
        return _trained(ops, states, LocalTraining(steps=self.steps, batch_size=None, optimizer=sgd))


@dataclass(frozen=True)
class ProximalSolve(LocalSolver):
    """FedProx: ``argmin_u F_i(u) + ‖u − θ‖² / (2 lr)`` (Su–Xu–Yang's FedProx with μ = 1/η).

    Exact closed form for the noise-only linear model (Lemma 1's ``(I + η XXᵀ/n)⁻¹``). Otherwise
    approximated by ``inner_steps`` full-batch Adam steps (step ``inner_lr``) on the local NLL plus
    the proximal term on the raw parameters — an inexact proximal step, as FedProx allows.
    """

    lr: float = 0.05
    units: str = "nll"
    inner_steps: int = 200
    inner_lr: float = 0.01

    def __post_init__(self) -> None:
        check_units(self.units)
        check_settings(self, lr="positive", inner_steps="count", inner_lr="positive")

    def solve(self, ops, states, form) -> tuple[HyperState, torch.Tensor | None]:
        """One proximal step (closed form for a linear mean, else inner SGD steps on the proximal
        objective)."""
        lrs = step_sizes(self.lr, self.units, form.model, states)
        if form.closed:
            step = lambda m, theta, noise: m.proximal_step(ops.clients, theta, noise, lrs)  # noqa: E731
            return _closed_form(form, states, step), None
        local = LocalTraining(
            steps=self.inner_steps,
            batch_size=None,
            optimizer=Adam(lr=self.inner_lr),
            prox_mu=1.0 / _single_lr(lrs),
        )
        return _trained(ops, states, local)


@dataclass(frozen=True)
class LocalTrainingSolver(LocalSolver):
    """Any :class:`~fedgp.strategies.local.LocalTraining` (minibatch Adam/SGD, epochs, FedProx μ)
    run by the engine: FGPR's and IFCA model averaging's local update."""

    local: LocalTraining = field(default_factory=LocalTraining)

    def solve(self, ops, states, form) -> tuple[HyperState, torch.Tensor | None]:
        """The configured local training from each state."""
        return _trained(ops, states, self.local)

    def has_loss(self, closed) -> bool:
        return True


@dataclass(frozen=True)
class GradientSolver(LocalSolver):
    """One gradient of the per-point NLL w.r.t. the raw trainable parameters (IFCA option I), on all
    local data or a minibatch of ``batch_size``. Pair it with :class:`GradientStep`."""

    batch_size: int | None = None
    returns_gradient = True

    def __post_init__(self) -> None:
        check_settings(self, batch_size="batch_or_none")

    def solve(self, ops, states, form) -> tuple[HyperState, torch.Tensor | None]:
        """The gradient at each state (as a state-shaped update) for the server's gradient step."""
        if form.closed and self.batch_size is None:
            model = form.model
            grad = model.gradient(ops.clients, model.vector(states), model.noise(states))
            zeros = states.map(lambda v, e: torch.zeros_like(v))
            return model.with_vector(zeros, grad), None
        _, grads = ops.gradient(states, self.batch_size)
        return grads, None

    def has_loss(self, closed) -> bool:
        return False
