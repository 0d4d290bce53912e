"""Local training: what a client does with a state between two communications.

``LocalTraining`` says how many minibatch steps, of which size, drawn how, with which optimiser;
engines carry it out. The optimisers are written as pure functions over batched tensors instead of
``torch.optim`` objects because engines must (a) mask steps per client (clients with fewer points
do fewer steps in an epoch), (b) restart the optimiser state every round, as the FGPR authors'
code does, and (c) take the same step whether one client or ten thousand are updated at once.
Steps are taken on GPyTorch's raw (unconstrained) parameters, as ``torch.optim`` would.
A test checks ``Adam`` against ``torch.optim.Adam`` step for step.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch

from fedgp.checks import RULES, check_settings
from fedgp.errors import InputError
from fedgp.messages import Configurable

__all__ = ["Adam", "SGD", "LocalOptimizer", "LocalTraining", "make_optimizer", "STRATEGY_LOCAL_SETTINGS"]

#: The rules (:func:`fedgp.checks.check_settings`) for the local-training settings a strategy
#: takes under its own names: checked there, so an error names the strategy's argument.
STRATEGY_LOCAL_SETTINGS = {
    "local_steps": "count_or_none",
    "local_epochs": "count_or_none",
    "batch_size": "batch_or_none",
    "lr": "positive",
    "clients_per_round": "count_or_none",
}

Tensors = dict[str, torch.Tensor]


def _mask(active: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor | None:
    if active is None:
        return None
    return active.reshape(tuple(active.shape) + (1,) * (like.dim() - active.dim()))


class LocalOptimizer(Configurable, ABC):
    """A step rule over batched tensors; the base applies it per parameter and masks inactive rows."""

    def init(self, params: Tensors) -> dict:
        """The optimiser's state for ``params`` (none for plain SGD)."""
        return {}

    @abstractmethod
    def update(
        self, p: torch.Tensor, g: torch.Tensor, slots: dict, global_step: torch.Tensor
    ) -> tuple[torch.Tensor, dict]:
        """The new value of one parameter and of its optimiser slots (e.g. Adam's moments)."""

    def step(
        self,
        params: Tensors,
        grads: Tensors,
        state: dict,
        global_step: torch.Tensor,
        active: torch.Tensor | None,
    ) -> Tensors:
        """One step for every parameter; rows with ``active`` False keep their values and slots."""
        out = {}
        for k, p in params.items():
            slots = {name: values[k] for name, values in state.items()}
            new_p, new_slots = self.update(p, grads[k], slots, global_step)
            mask = _mask(active, p)
            if mask is not None:
                new_p = torch.where(mask, new_p, p)
                new_slots = {name: torch.where(mask, v, slots[name]) for name, v in new_slots.items()}
            for name, v in new_slots.items():
                state[name][k] = v
            out[k] = new_p
        return out


@dataclass(frozen=True)
class Adam(LocalOptimizer):
    """Adam (Kingma & Ba), state re-initialised at the start of every round."""

    lr: float = 0.05
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8

    def __post_init__(self) -> None:
        check_settings(self, lr="positive", eps="positive")
        if len(self.betas) != 2 or not all(RULES["fraction"][0](b) for b in self.betas):
            raise InputError(
                f"Adam: betas must be two numbers in [0, 1), got {self.betas!r} (default (0.9, 0.999))"
            )

    def init(self, params: Tensors) -> dict:
        """Adam's zero first and second moments and step counts for ``params``."""
        return {
            "m": {k: torch.zeros_like(v) for k, v in params.items()},
            "v": {k: torch.zeros_like(v) for k, v in params.items()},
            "t": {k: torch.zeros_like(v) for k, v in params.items()},
        }

    def update(self, p, g, slots, global_step) -> tuple[torch.Tensor, dict]:
        b1, b2 = self.betas
        m, v, t = slots["m"], slots["v"], slots["t"]
        new_t = t + 1
        new_m = torch.lerp(m, g, 1 - b1)
        new_v = (v * b2).addcmul(g, g, value=1 - b2)
        # The same operation order as torch.optim.Adam (single-tensor path).
        bias1 = 1 - b1**new_t
        bias2_sqrt = (1 - b2**new_t).sqrt()
        denom = new_v.sqrt() / bias2_sqrt + self.eps
        return p - (self.lr / bias1) * new_m / denom, {"m": new_m, "v": new_v, "t": new_t}


@dataclass(frozen=True)
class SGD(LocalOptimizer):
    """Plain SGD. ``schedule="inverse_t"`` is the FGPR theory's η_t = β/t on the *global* step t.

    ``t`` counts every local step of the client since round 0 (``round * E_k + s``), so the step
    size keeps decaying across rounds; η_0 = β as in the paper's proof.
    """

    lr: float = 0.01
    schedule: str = "inverse_t"

    def __post_init__(self) -> None:
        check_settings(self, lr="positive")
        if self.schedule not in ("inverse_t", "constant"):
            raise InputError(f"schedule must be 'inverse_t' or 'constant', got {self.schedule!r}")

    def update(self, p, g, slots, global_step) -> tuple[torch.Tensor, dict]:
        if self.schedule == "inverse_t":
            eta = self.lr / global_step.to(p.dtype).clamp_min(1.0)
            eta = eta.reshape(tuple(eta.shape) + (1,) * (p.dim() - eta.dim()))
        else:
            eta = self.lr
        return p - eta * g, {}


#: The optimisers by name: ``"sgd"`` is the FGPR theory's β/t, ``"sgd-constant"`` a constant step.
OPTIMIZERS = {
    "adam": lambda lr: Adam(lr=lr),
    "sgd": lambda lr: SGD(lr=lr),
    "sgd-constant": lambda lr: SGD(lr=lr, schedule="constant"),
}


def make_optimizer(optimizer: str | Adam | SGD, lr: float) -> Adam | SGD:
    """An :class:`Adam` or :class:`SGD` from its name and learning rate (an instance passes through)."""
    if isinstance(optimizer, (Adam, SGD)):
        return optimizer
    if isinstance(optimizer, str) and optimizer in OPTIMIZERS:
        return OPTIMIZERS[optimizer](lr)
    raise InputError(
        f"optimizer must be one of {', '.join(map(repr, OPTIMIZERS))} or an Adam/SGD instance, "
        f"got {optimizer!r}"
    )


@dataclass(frozen=True)
class LocalTraining(Configurable):
    """How a client trains a state locally in one round.

    Args:
        steps: minibatch steps per round (E). Give ``steps`` or ``epochs``, not both.
        epochs: local epochs per round; one epoch is ``max(1, N_k // M_k)`` steps, so clients
            with more data do more steps (the FGPR authors' code).
        batch_size: minibatch size M; a client with fewer points uses all of them (M_k = min(M, N_k)).
            ``None`` means full local data every step.
        optimizer: ``Adam`` (default) or ``SGD``.
        minibatch: ``"uniform"`` (without replacement) or ``"nearest"`` (a random point and its
            nearest neighbours: the correlated-minibatch scheme of the authors' multi-fidelity runs).
        prox_mu: FedProx proximal weight μ: adds ``μ/2 ||raw - raw_start||²`` to the local loss.
    """

    steps: int | None = 5
    epochs: int | None = None
    batch_size: int | None = 32
    optimizer: Adam | SGD = field(default_factory=Adam)
    minibatch: str = "uniform"
    prox_mu: float = 0.0

    def __post_init__(self) -> None:
        if (self.steps is None) == (self.epochs is None):
            raise InputError("give exactly one of steps or epochs")
        if (self.steps is not None and self.steps < 1) or (self.epochs is not None and self.epochs < 1):
            raise InputError("steps/epochs must be >= 1")
        if self.batch_size is not None and self.batch_size < 2:
            raise InputError(f"batch_size must be >= 2 (or None for full batches), got {self.batch_size}")
        if self.minibatch not in ("uniform", "nearest"):
            raise InputError(f"minibatch must be 'uniform' or 'nearest', got {self.minibatch!r}")
        check_settings(self, prox_mu="nonnegative")

    def batch_sizes(self, sizes: torch.Tensor) -> torch.Tensor:
        """M_k = min(M, N_k) for each client."""
        if self.batch_size is None:
            return sizes.clone()
        return sizes.clamp(max=self.batch_size)

    def num_steps(self, sizes: torch.Tensor) -> torch.Tensor:
        """E_k for each client."""
        if self.steps is not None:
            return torch.full_like(sizes, self.steps)
        return self.epochs * (sizes // self.batch_sizes(sizes)).clamp_min(1)
