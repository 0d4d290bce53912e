"""Personalised prediction: the shared prior, conditioned on one client's own data.

This is FGPR's personalisation (Yue & Kontar §2.3): the hyper-parameters are learned jointly,
the posterior is local. Nothing here is federated; it is GPyTorch's exact posterior, with the
noise-free (f) and noisy (y) predictive variances both returned, and on request the joint
covariance of f at the test inputs (what sampling and acquisition functions need).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import gpytorch
import torch
from linear_operator.operators import DiagLinearOperator
from linear_operator.utils.cholesky import psd_safe_cholesky

from fedgp.errors import InputError
from fedgp.models import iterative, large
from fedgp.models.objective import exact_settings, factorization_guard
from fedgp.models.spec import ExactGPModel, GPSpec
from fedgp.models.state import HyperState

if TYPE_CHECKING:
    from fedgp.data.client import ClientData

__all__ = ["Prediction", "condition", "condition_client", "predict_with_model", "prediction_metrics"]


@dataclass(frozen=True)
class Prediction:
    """Predictive mean and variances at some inputs: of the latent f, and of a new y = f + ε.

    ``covariance_f`` is the joint ``(points, points)`` covariance of f, present when it was asked
    for (``FitResult.posterior(X, client, full_cov=True)``); the noise is independent per point,
    so the joint covariance of y adds ``variance_y - variance_f`` to its diagonal. Under a
    non-Gaussian likelihood the predictive of y is not Gaussian: ``mean`` and ``variance_y`` are its
    mean and variance, and the helpers below that assume a Gaussian (intervals, ``nll``, ``sample``)
    do not apply.
    """

    mean: torch.Tensor
    variance_f: torch.Tensor
    variance_y: torch.Tensor
    covariance_f: torch.Tensor | None = None
    #: The latent f's mean where ``mean`` is not it: E[y] under a non-Gaussian likelihood
    #: (:class:`~fedgp.models.variational.VariationalGPSpec`); ``None`` where ``mean`` is E[f].
    latent_mean: torch.Tensor | None = None

    def variance(self, observation_noise: bool = False) -> torch.Tensor:
        """The variance of f, or of y with ``observation_noise=True``."""
        return self.variance_y if observation_noise else self.variance_f

    def covariance(self, observation_noise: bool = False) -> torch.Tensor:
        """The joint covariance of f (or of y); raises if the prediction carries only variances."""
        if self.covariance_f is None:
            raise InputError(
                "this prediction holds marginal variances only; ask for the joint covariance with "
                "result.posterior(X, client, full_cov=True)"
            )
        if not observation_noise:
            return self.covariance_f
        return self.covariance_f + torch.diag_embed(self.variance_y - self.variance_f)

    def to_distribution(self, observation_noise: bool = False) -> gpytorch.distributions.MultivariateNormal:
        """A GPyTorch ``MultivariateNormal``: the joint posterior, or a diagonal one (independent
        marginals) when the prediction carries no covariance."""
        if self.covariance_f is None:
            covariance = DiagLinearOperator(self.variance(observation_noise))
        else:
            covariance = self.covariance(observation_noise)
        return gpytorch.distributions.MultivariateNormal(self.mean, covariance)

    def sample(
        self, n: int = 1, generator: torch.Generator | None = None, observation_noise: bool = False
    ) -> torch.Tensor:
        """``n`` joint draws ``(n, points)`` (independent per point without a covariance).

        Written out rather than ``to_distribution().rsample`` because that takes no generator and
        fedgp's draws are reproducible from a seed. The Cholesky factor uses GPyTorch's jitter retries.
        """
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise InputError(f"sample: n must be a positive int, got {n!r}")
        z = torch.randn(n, self.mean.shape[0], generator=generator, dtype=self.mean.dtype)
        if self.covariance_f is None:
            return self.mean + z * self.variance(observation_noise).sqrt()
        factor = psd_safe_cholesky(self.covariance(observation_noise))
        return self.mean + z @ factor.transpose(-1, -2)

    def confidence_region(
        self, level: float = 0.95, observation_noise: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Central interval of the Gaussian predictive with probability ``level``."""
        z = math.sqrt(2.0) * torch.special.erfinv(torch.tensor(level, dtype=torch.float64))
        sd = self.variance(observation_noise).sqrt()
        return self.mean - z * sd, self.mean + z * sd

    def rmse(self, y: torch.Tensor) -> float:
        """Root mean squared error of the mean against ``y``."""
        return float(prediction_metrics([self], [y])["rmse"][0])

    def nll(self, y: torch.Tensor) -> float:
        """Mean Gaussian negative log predictive density of observations ``y`` (uses variance_y)."""
        return float(prediction_metrics([self], [y])["nll"][0])

    def coverage(self, y: torch.Tensor, level: float = 0.95) -> float:
        """The fraction of ``y`` inside the predictive ``level`` interval of y."""
        return float(prediction_metrics([self], [y], level)["coverage95"][0])


def prediction_metrics(
    predictions: Sequence[Prediction], targets: Sequence[torch.Tensor], level: float = 0.95
) -> dict[str, torch.Tensor]:
    """RMSE, mean NLL (of y) and coverage of the central ``level`` interval of y (under the key
    ``coverage95`` whatever the level) of each prediction against its targets: ``(K,)`` each.

    Predictions of equal length are scored as rows of one stacked tensor; a row's mean has the bits
    of the 1-D mean, so each value is the one-prediction value, at microseconds a client instead of
    a hundred or more (in-sample metrics of 10⁶ owners)."""
    z = math.sqrt(2.0) * torch.special.erfinv(torch.tensor(level, dtype=torch.float64))
    out = {name: torch.empty(len(predictions), dtype=torch.float64) for name in ("rmse", "nll", "coverage95")}
    groups: dict[int, list[int]] = {}
    for position, prediction in enumerate(predictions):
        groups.setdefault(prediction.mean.shape[-1], []).append(position)
    for positions in groups.values():
        mean = torch.stack([predictions[i].mean for i in positions])
        var = torch.stack([predictions[i].variance_y for i in positions])
        y = torch.stack([torch.as_tensor(targets[i]) for i in positions]).to(mean.device)
        out["rmse"][positions] = ((mean - y) ** 2).mean(1).sqrt().to(torch.float64)
        nll = 0.5 * (math.log(2 * math.pi) + var.log() + (y - mean) ** 2 / var)
        out["nll"][positions] = nll.mean(1).to(torch.float64)
        sd = var.sqrt()
        inside = (y >= mean - z * sd) & (y <= mean + z * sd)
        out["coverage95"][positions] = inside.to(torch.float64).mean(1)
    return out


def predict_with_model(
    model: ExactGPModel,
    X_train: torch.Tensor,
    y_train: torch.Tensor,
    X_new: torch.Tensor,
    client: Any = None,
    full_cov: bool = False,
) -> Prediction:
    """Exact posterior of ``model`` (hyper-parameters already loaded) given ``(X_train, y_train)``;
    with ``full_cov`` also the joint covariance of f at ``X_new``.

    With no training points (a cold-start client) this is the prior predictive, GPyTorch's
    ``prior_mode``: the mean function, and the prior variance (plus the noise for ``variance_y``).
    Above :data:`~fedgp.models.large.LARGE_CLIENT_ROWS` rows (float64, CPU) the same posterior is
    computed in the memory of one n×n matrix (:mod:`fedgp.models.large`), and above
    :data:`~fedgp.models.iterative.ITERATIVE_CLIENT_ROWS` rows, or where that matrix does not fit in
    free memory, by preconditioned conjugate gradients to a relative residual of 1e-10 in O(n) memory
    (:mod:`fedgp.models.iterative`); a model that is not an ``ExactGPModel`` (a
    :class:`~fedgp.models.multioutput.MultiOutputSpec`'s) by GPyTorch's dense path at every size."""
    n = X_train.shape[0]
    # The memory-lean paths evaluate mean_module and covar_module alone: a model whose prior is more
    # (a multi-output spec's task covariance) takes GPyTorch's path at any size.
    lean = type(model) is ExactGPModel and X_train.dtype == torch.float64 and not X_train.is_cuda
    if n > large.LARGE_CLIENT_ROWS and lean:
        iterate = n > iterative.ITERATIVE_CLIENT_ROWS or not large.fits_in_memory(n)
        solver = iterative.iterative_posterior if iterate else large.large_posterior
        with exact_settings(), factorization_guard(client, "posterior"):
            return Prediction(*solver(model, X_train, y_train, X_new, client, full_cov))
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
        covariance = latent.covariance_matrix.clone() if full_cov else None
        out = Prediction(latent.mean.clone(), latent.variance.clone(), noisy.variance.clone(), covariance)
    model.train()
    return out


def condition(
    spec: GPSpec,
    state: HyperState,
    X_train: torch.Tensor,
    y_train: torch.Tensor,
    X_new: torch.Tensor,
    client: Any = None,
    full_cov: bool = False,
    noise: torch.Tensor | None = None,
) -> Prediction:
    """Condition the prior given by ``(spec, state)`` on ``(X_train, y_train)``; predict at ``X_new``.
    ``noise``: the training points' known noise variances, for a ``FixedNoiseGaussianLikelihood``."""
    if state.batch_shape:
        raise InputError(f"condition needs one state, got batch shape {tuple(state.batch_shape)}")
    model = spec.build()
    spec.load(model, state)
    if noise is not None:
        model.likelihood.noise = noise
    dtype = spec.dtype
    return predict_with_model(
        model, X_train.to(dtype), y_train.to(dtype), torch.as_tensor(X_new, dtype=dtype), client, full_cov
    )


def condition_client(
    spec: GPSpec,
    state: HyperState,
    client: ClientData,
    X_new: torch.Tensor | None = None,
    full_cov: bool = False,
) -> Prediction:
    """:func:`condition` on ``client``'s own training data (and known noise), at ``X_new`` or at its
    test inputs."""
    at = client.X_test if X_new is None else X_new
    return condition(spec, state, client.X, client.y, at, client.id, full_cov, spec.client_noise(client))
