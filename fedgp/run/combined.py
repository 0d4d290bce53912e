"""A prediction for points no client owns: every client's posterior, combined on the server.

``FitResult.posterior(X, combine="rbcm")`` sends one ``predict`` task to every training client.
Each conditions its personal state on its own data and replies its predictive mean and variances
at ``X`` (the ``predict`` reply's individual fields: nothing else leaves it), and the server
combines them with a rule of :mod:`fedgp.models.experts`. The prior that BCM and rBCM divide out is
computed on the server from the state it holds, in the same units as the replies.

``result`` below is a :class:`~fedgp.run.FitResult`, which calls these (not imported here, so that
the two modules depend one way).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from fedgp.errors import EngineError, FedGPWarning, InputError, RoundFailedError
from fedgp.models.experts import SHARED_PRIOR_RULES, combine_experts
from fedgp.models.multioutput import MultiOutputSpec
from fedgp.models.objective import exact_settings
from fedgp.models.own_features import OwnFeaturesSpec
from fedgp.models.posterior import Prediction
from fedgp.run.exchange import ask
from fedgp.run.streaming import with_grown

__all__ = ["check_experts", "combined_posterior", "shared_prior"]


def shared_prior(result: Any, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The prior mean and variance of f at ``X`` in the data's units, under the one state and outcome
    transform every client shares; refuses (naming why) where the clients do not share them."""
    state = result.state
    if state.batch_shape:
        raise InputError(
            f"{type(result.strategy).__name__} learned {state.batch_shape[0]} states (one per cluster), so "
            "its clients are experts under different priors: BCM and rBCM, which divide out one shared "
            "prior, do not apply; use combine='gpoe' or 'poe', or predict per client"
        )
    if result.transform.y_local:
        raise InputError(
            "each client standardised its outcome with its own mean and sd (Standardize(local=True)), so "
            "the experts' priors differ in the data's units: BCM and rBCM do not apply; use "
            "combine='gpoe' or 'poe', or fit with Transforms(outcome=Standardize())"
        )
    own = sorted(n for n in result.strategy.personal_names(result.spec) if not n.startswith("likelihood."))
    if own:
        raise InputError(
            f"each owner keeps its own {', '.join(own)} (personal hyper-parameters), so the experts' priors "
            "of f differ and the server holds none of them: BCM and rBCM do not apply; use combine='gpoe' "
            "or 'poe', or predict per client"
        )
    model = result.spec.build()
    result.spec.load(model, state)
    Xt = result.transform.inputs(X.to(result.spec.dtype))
    with torch.no_grad(), exact_settings():
        mean = model.mean_module(Xt).detach()
        variance = model.covar_module(Xt, diag=True).detach()
    prior = result.transform.untransform(Prediction(mean, variance, variance))  # f's prior: no noise
    return prior.mean, prior.variance_f


def check_experts(result: Any) -> None:
    """Refuse a result without clients to ask (one read back by ``fedgp.load``), or whose predictives are
    not Gaussian (a variational spec's non-Gaussian likelihood: the rules combine Gaussians)."""
    if not result.spec.conjugate:
        raise InputError(
            f"combine= multiplies Gaussian predictives; a {type(result.spec.likelihood).__name__}'s are not: "
            "predict for a client (client=...) instead"
        )
    if isinstance(result.spec, MultiOutputSpec):
        raise InputError(
            "combine= is built for one-output specs (its shared prior reads the kernel alone); a "
            "MultiOutputSpec predicts per client: predict(rows, client=...)"
        )
    if isinstance(result.spec, OwnFeaturesSpec):
        raise InputError(
            "combine= asks every owner at the same points, but an owner with own features predicts from "
            "its own columns too, which a point no owner holds does not have: predict per owner (client=...)"
        )
    if result.engine is None:
        raise InputError(
            "a loaded result holds no client data, so no client can act as an expert: combine needs the "
            "result of fit (or predict per ClientData)"
        )


def combined_posterior(result: Any, X: torch.Tensor, rule: str) -> Prediction:
    """The ``rule`` combination of every training client's posterior at ``X`` (checked inputs).

    A client that fails to reply is left out, with a ``FedGPWarning`` naming it and the reason. The
    noise added for ``variance_y`` is the experts' mean noise variance at each point (one value when
    they share a state)."""
    check_experts(result)
    prior = shared_prior(result, X) if rule in SHARED_PRIOR_RULES else (None, None)
    roster = result.roster
    everyone = torch.arange(len(roster.ids))
    try:
        replies = ask(result, "predict", everyone, X=X)
    except RoundFailedError as err:
        raise EngineError(
            f"no client could predict, so there is nothing to combine: {err.failures}"
        ) from None
    if replies.failures:
        failed = {roster.ids[p]: reason for p, reason in replies.failures.items()}
        warnings.warn(
            f"combined without the clients that failed to predict: {failed}", FedGPWarning, stacklevel=3
        )
    answers = with_grown(result, "predict", replies, X)  # owners that added rows: from their factors
    variance_f = answers["variance_f"]
    mean, variance = combine_experts(answers["mean"], variance_f, rule, *prior)
    noise = (answers["variance_y"] - variance_f).mean(0)
    return Prediction(mean, variance, variance + noise)
