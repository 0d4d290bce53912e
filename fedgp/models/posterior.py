"""Personalised prediction: the shared prior, conditioned on one client's own data.

This is FGPR's personalisation (Yue & Kontar §2.3): the hyper-parameters are learned jointly,
the posterior is local. Nothing here is federated; it is GPyTorch's exact posterior, with the
noise-free (f) and noisy (y) predictive variances both returned.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import gpytorch
import torch

from fedgp.models.objective import exact_settings, factorization_guard
from fedgp.models.spec import ExactGPModel, GPSpec
from fedgp.models.state import HyperState

__all__ = ["Prediction", "condition", "predict_with_model"]


@dataclass(frozen=True)
class Prediction:
    """Predictive mean and variances at some inputs: of the latent f, and of a new y = f + ε."""

    mean: torch.Tensor
    variance_f: torch.Tensor
    variance_y: torch.Tensor

    def variance(self, observation_noise: bool = False) -> torch.Tensor:
        return self.variance_y if observation_noise else self.variance_f

    def confidence_region(self, level: float = 0.95, observation_noise: bool = False):
        """Central interval of the Gaussian predictive with probability ``level``."""
        z = math.sqrt(2.0) * torch.special.erfinv(torch.tensor(level, dtype=torch.float64))
        sd = self.variance(observation_noise).sqrt()
        return self.mean - z * sd, self.mean + z * sd

    def rmse(self, y: torch.Tensor) -> float:
        return float(((self.mean - y) ** 2).mean().sqrt())

    def nll(self, y: torch.Tensor) -> float:
        """Mean Gaussian negative log predictive density of observations ``y`` (uses variance_y)."""
        var = self.variance_y
        return float((0.5 * (math.log(2 * math.pi) + var.log() + (y - self.mean) ** 2 / var)).mean())

    def coverage(self, y: torch.Tensor, level: float = 0.95) -> float:
        lo, hi = self.confidence_region(level, observation_noise=True)
        return float(((y >= lo) & (y <= hi)).to(torch.float64).mean())


def predict_with_model(
    model: ExactGPModel,
    X_train: torch.Tensor,
    y_train: torch.Tensor,
    X_new: torch.Tensor,
    client: Any = None,
) -> Prediction:
    """Exact posterior of ``model`` (hyper-parameters already loaded) given ``(X_train, y_train)``.

    With no training points (a cold-start client) this is the prior predictive, GPyTorch's
    ``prior_mode``: the mean function, and the prior variance (plus the noise for ``variance_y``)."""
    model.set_train_data(X_train, y_train, strict=False)
    model.eval()
    with (
        torch.no_grad(),
        exact_settings(),
        gpytorch.settings.prior_mode(X_train.shape[0] == 0),
        factorization_guard(client, "posterior"),
        warnings.catch_warnings(),
    ):
        # Predicting at training inputs is legitimate here (e.g. in-sample checks).
        warnings.simplefilter("ignore", gpytorch.utils.warnings.GPInputWarning)
        latent = model(X_new)
        noisy = model.likelihood(latent, X_new)
        out = Prediction(latent.mean.clone(), latent.variance.clone(), noisy.variance.clone())
    model.train()
    return out


def condition(
    spec: GPSpec,
    state: HyperState,
    X_train: torch.Tensor,
    y_train: torch.Tensor,
    X_new: torch.Tensor,
    client: Any = None,
) -> Prediction:
    """Condition the prior given by ``(spec, state)`` on ``(X_train, y_train)``; predict at ``X_new``."""
    if state.batch_shape:
        raise ValueError(f"condition needs one state, got batch shape {tuple(state.batch_shape)}")
    model = spec.build()
    spec.load(model, state)
    dtype = spec.dtype
    return predict_with_model(
        model, X_train.to(dtype), y_train.to(dtype), torch.as_tensor(X_new, dtype=dtype), client
    )
