"""The local objective: the exact GP marginal likelihood of a (mini)batch, per point.

FGPR's clients minimise ``-log p(y_ξ | X_ξ, θ) / M`` on random minibatches ξ of size M
(Yue & Kontar, Eq. 2, divided by M as in the authors' code). GPyTorch's
``ExactMarginalLogLikelihood`` computes exactly ``log p / n``; the minibatch is swapped in with
``set_train_data``, the idiom the GPyTorch maintainers recommend for this (gpytorch#160, #863).
All of it runs under :func:`exact_settings`: Cholesky at every size, never CG/Lanczos.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import gpytorch
import torch
from linear_operator.utils.errors import NotPSDError

from fedgp.errors import FactorizationError
from fedgp.models.spec import ExactGPModel

__all__ = ["exact_settings", "minibatch_nll", "factorization_guard", "log_prior"]

#: Jitter GPyTorch adds on the first failed Cholesky (float64); it is multiplied by 10 per retry.
CHOLESKY_JITTER = 1e-8
#: Retries after the first failure: the largest jitter tried is 1e-8 * 10**(tries-1) = 1e-6.
CHOLESKY_MAX_TRIES = 3


_SHARED = threading.Lock()
#: The settings' exit stack while any block is inside :func:`exact_settings`, and how many are.
_entered: dict[str, Any] = {"stack": None, "blocks": 0}


@contextlib.contextmanager
def exact_settings() -> Iterator[None]:
    """Exact (Cholesky) linear algebra at every size, with bounded jitter retries.

    GPyTorch's settings are process-wide class attributes, and a client task cut off at its timeout
    (:mod:`fedgp.engines.deadline`) may leave its block while another thread is inside one: plain
    nesting would then restore GPyTorch's defaults (CG above 800 points) under the other. So the
    first block in, of any thread, enters the settings and the last one out restores them."""
    with _SHARED:
        if _entered["blocks"] == 0:
            stack = contextlib.ExitStack()
            stack.enter_context(gpytorch.settings.max_cholesky_size(10**9))
            stack.enter_context(
                gpytorch.settings.fast_computations(
                    covar_root_decomposition=False, log_prob=False, solves=False
                )
            )
            stack.enter_context(
                gpytorch.settings.cholesky_jitter(float_value=1e-6, double_value=CHOLESKY_JITTER)
            )
            stack.enter_context(gpytorch.settings.cholesky_max_tries(CHOLESKY_MAX_TRIES))
            _entered["stack"] = stack
        _entered["blocks"] += 1
    try:
        yield
    finally:
        with _SHARED:
            _entered["blocks"] -= 1
            if _entered["blocks"] == 0:
                _entered["stack"].close()
                _entered["stack"] = None


@contextlib.contextmanager
def factorization_guard(client: Any, what: str) -> Iterator[None]:
    """Re-raise GPyTorch's ``NotPSDError`` as a :class:`FactorizationError` naming the client."""
    try:
        yield
    except NotPSDError as err:
        raise FactorizationError(
            f"client {client!r}: {what}: covariance matrix not positive definite after "
            f"{CHOLESKY_MAX_TRIES} jitter retries (largest jitter "
            f"{CHOLESKY_JITTER * 10 ** (CHOLESKY_MAX_TRIES - 1):.0e}). Duplicate inputs with a tiny "
            f"noise level, or an extreme lengthscale, are the usual causes. ({err})",
            (client,),
        ) from err


def log_prior(module: torch.nn.Module) -> torch.Tensor:
    """``log p(θ)``: the sum of every registered prior's log density at its parameter's current value,
    as GPyTorch's marginal likelihoods add it (``MarginalLogLikelihood._add_other_terms``)."""
    total = torch.zeros(())
    for _, owner, prior, closure, _ in module.named_priors():
        total = total + prior.log_prob(closure(owner)).sum()
    return total


def minibatch_nll(
    model: ExactGPModel,
    X: torch.Tensor,
    y: torch.Tensor,
    prior_weight: float | None = None,
    noise: torch.Tensor | None = None,
) -> torch.Tensor:
    """``-log p(y | X) / len(y) - w log p(θ)`` under ``model``'s current hyper-parameters
    (differentiable); ``w = 1 / len(y)`` (GPyTorch's ``ExactMarginalLogLikelihood``) unless
    ``prior_weight`` is given (see :class:`~fedgp.models.spec.GPSpec`). ``noise``: the points' known
    noise variances, for a ``FixedNoiseGaussianLikelihood``.

    The model is put in train mode and its training data replaced by ``(X, y)``.
    """
    model.train()
    model.set_train_data(X, y, strict=False)
    if noise is not None:
        model.likelihood.noise = noise
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    with exact_settings():
        if prior_weight is None:
            return -mll(model(X), y)
        data = model.likelihood(model(X)).log_prob(y) / len(y)
        return -(data + prior_weight * log_prior(model))
