"""Which point an owner evaluates next: a BoTorch acquisition on its own model, optimised in its box.

``"qlogei"`` (``qLogExpectedImprovement``, the best value observed so far as ``best_f``), ``"qucb"``
(``qUpperConfidenceBound(beta)``), ``"ts"`` (Thompson sampling: one posterior path drawn by
BoTorch's pathwise sampler, ``PathwiseThompsonSampling``, and maximised), or any factory
``(model, best_f, bounds) -> AcquisitionFunction``. Every choice is optimised by BoTorch's
``optimize_acqf`` with the same options (restarts, raw samples), after ``torch.manual_seed`` of a seed
derived from ``(seed, owner, iteration)``: the proposal is a function of those, whatever ran before.

Owners are optimised one after another: ``optimize_acqf`` refuses a model batch of K owners
(its initialiser does not support t-batches of initial conditions), and ``optimize_acqf_list`` is
sequential greedy, passing earlier owners' candidates as pending points — wrong for independent
owners.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from fedgp.errors import InputError, InputTypeError, import_extra
from fedgp.rng import generator

if TYPE_CHECKING:
    from botorch.acquisition import AcquisitionFunction
    from botorch.models.model import Model

__all__ = ["Acquisition", "ACQUISITIONS", "acquisition_seed"]

#: The built-in acquisitions by name.
ACQUISITIONS = ("qlogei", "qucb", "ts")


def acquisition_seed(seed: int, owner: int, iteration: int) -> int:
    """The torch seed set before owner ``owner`` (position) proposes at ``iteration``."""
    return int(generator(seed, "bo acquisition", owner, iteration).integers(2**31))


@dataclass(frozen=True)
class Acquisition:
    """How owners propose: ``kind`` (a name of :data:`ACQUISITIONS` or a factory
    ``(model, best_f, bounds) -> AcquisitionFunction``), ``beta`` for ``"qucb"``, and
    ``optimize_acqf``'s ``num_restarts`` and ``raw_samples``."""

    kind: str | Callable[..., Any] = "qlogei"
    beta: float = 2.0
    num_restarts: int = 4
    raw_samples: int = 128

    def __post_init__(self) -> None:
        if isinstance(self.kind, str):
            if self.kind not in ACQUISITIONS:
                raise InputError(f"acquisition must be one of {ACQUISITIONS} or a factory, got {self.kind!r}")
        elif not callable(self.kind):
            raise InputTypeError(
                "acquisition must be a name or a factory (model, best_f, bounds) -> AcquisitionFunction, "
                f"got {type(self.kind).__name__}"
            )
        for name in ("num_restarts", "raw_samples"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(f"Acquisition({name}=...) must be an int >= 1, got {value!r}")
        if not float(self.beta) > 0:
            raise InputError(f"Acquisition(beta=...) must be > 0, got {self.beta!r}")

    @classmethod
    def of(cls, given: Acquisition | str | Callable[..., Any]) -> Acquisition:
        """``given`` as an :class:`Acquisition` (a name or a factory takes the default options)."""
        return given if isinstance(given, Acquisition) else cls(given)

    @property
    def name(self) -> str:
        """The name in history tables: the built-in's, or the factory's ``__name__``."""
        return self.kind if isinstance(self.kind, str) else getattr(self.kind, "__name__", "factory")

    def build(self, model: Model, best_f: torch.Tensor, bounds: torch.Tensor) -> AcquisitionFunction:
        """The BoTorch acquisition function on ``model``."""
        if callable(self.kind):
            return self.kind(model, best_f, bounds)
        if self.kind == "qlogei":
            from botorch.acquisition.logei import qLogExpectedImprovement

            return qLogExpectedImprovement(model, best_f=best_f)
        if self.kind == "qucb":
            from botorch.acquisition.monte_carlo import qUpperConfidenceBound

            return qUpperConfidenceBound(model, beta=float(self.beta))
        from botorch.acquisition.thompson_sampling import PathwiseThompsonSampling

        return PathwiseThompsonSampling(model)

    def propose(
        self, model: Model, y: torch.Tensor, bounds: torch.Tensor, seed: int
    ) -> tuple[torch.Tensor, float]:
        """``(candidate (1 x d), its acquisition value)``: the acquisition built after
        ``torch.manual_seed(seed)`` (Thompson sampling draws its path there) and maximised by
        ``optimize_acqf``."""
        import_extra("botorch", "fedgp.bo")
        from botorch.optim import optimize_acqf

        torch.manual_seed(seed)
        acq = self.build(model, y.max(), bounds)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # BoTorch's input-scaling and optimiser-restart warnings
            X, value = optimize_acqf(
                acq, bounds, q=1, num_restarts=self.num_restarts, raw_samples=self.raw_samples
            )
        return X.detach(), float(value)
