"""One prediction from many local experts: PoE, gPoE, BCM and rBCM (Deisenroth & Ng, ICML 2015).

Each client is an expert: it conditions the shared prior on its own data and reports its
predictive mean μ_k and variance σ_k² of f at the test inputs; nothing else leaves it. The server
multiplies the experts' Gaussians, point by point, with weights β_k:

* ``"poe"`` (product of experts): σ⁻² = Σ_k σ_k⁻², μ = σ² Σ_k σ_k⁻² μ_k. Every expert counts the
  prior once, so far from all data the variance shrinks to σ_**²/K: over-confident.
* ``"gpoe"`` (generalised PoE, Cao & Fleet 2014): β_k = 1/K, σ⁻² = Σ_k β_k σ_k⁻²,
  μ = σ² Σ_k β_k σ_k⁻² μ_k. Far from data it returns the prior's variance; near data it is wider
  than the best expert.
* ``"bcm"`` (Bayesian committee machine, Tresp 2000): divides out the K − 1 extra copies of the prior,
  σ⁻² = Σ_k σ_k⁻² + (1 − K) σ_**⁻².
* ``"rbcm"`` (robust BCM): β_k = ½ (log σ_**² − log σ_k²), the entropy an expert removes from the prior,
  σ⁻² = Σ_k β_k σ_k⁻² + (1 − Σ_k β_k) σ_**⁻².

σ_**² is the prior variance of f at the point. Deisenroth & Ng write the means for a zero prior mean;
here the prior mean m(x) (a ``ConstantMean``, the outcome transform's offset) enters the BCM and rBCM
means with the prior's own weight, μ = σ² (Σ_k β_k σ_k⁻² μ_k + (1 − Σ_k β_k) σ_**⁻² m), which is the
same product of Gaussians and reduces to theirs when m = 0. PoE and gPoE do not use the prior.

BCM and rBCM need the experts to share that prior: one set of hyper-parameters (FGPR's global state,
not a clustered strategy's per-cluster states) and one outcome transform (not each client's own
``Standardize(local=True)``). With a single expert PoE, gPoE and BCM return that expert; rBCM's
β = ½ log(σ_**²/σ²) re-weighs even one expert against the prior (Deisenroth & Ng's definition, kept).
An expert that reports the prior (no data near the point) changes neither BCM nor rBCM.
"""

from __future__ import annotations

import torch

from fedgp.errors import InputError

__all__ = ["RULES", "SHARED_PRIOR_RULES", "combine_experts"]

#: The combination rules, by name.
RULES = ("poe", "gpoe", "bcm", "rbcm")
#: The rules that divide out the prior, and so need its mean and variance.
SHARED_PRIOR_RULES = ("bcm", "rbcm")


def combine_experts(
    means: torch.Tensor,
    variances: torch.Tensor,
    rule: str,
    prior_mean: torch.Tensor | None = None,
    prior_variance: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The combined ``(mean, variance)`` of f at each point, from the experts' ``means`` and
    ``variances`` of f, ``(K, points)``; ``prior_mean`` and ``prior_variance`` ``(points,)``, needed by
    ``"bcm"`` and ``"rbcm"``. See the module docstring for the formulas.

    An exact GP's posterior variance never exceeds its prior's; an expert's that does by round-off is
    taken as the prior's (so rBCM's β_k is never negative and BCM's precision never below the prior's)."""
    if rule not in RULES:
        raise InputError(f"combine={rule!r}: choose one of {', '.join(map(repr, RULES))}")
    if means.dim() != 2 or means.shape != variances.shape or means.shape[0] < 1:
        raise InputError(
            f"combine_experts: means and variances must both be (experts, points) with at least one "
            f"expert; got {tuple(means.shape)} and {tuple(variances.shape)}"
        )
    if not bool((variances > 0).all()):
        raise InputError("combine_experts: every expert's variance must be positive")
    K = means.shape[0]
    if rule in SHARED_PRIOR_RULES:
        if prior_mean is None or prior_variance is None:
            raise InputError(f"combine={rule!r} divides out the prior: pass prior_mean and prior_variance")
        if prior_variance.shape != means.shape[1:] or prior_mean.shape != means.shape[1:]:
            raise InputError(
                f"combine_experts: prior_mean and prior_variance must be ({means.shape[1]},); got "
                f"{tuple(prior_mean.shape)} and {tuple(prior_variance.shape)}"
            )
        variances = torch.minimum(variances, prior_variance)
    precisions = variances.reciprocal()
    if rule == "poe":
        beta = torch.ones_like(means)
    elif rule == "gpoe":
        beta = torch.full_like(means, 1.0 / K)
    elif rule == "bcm":
        beta = torch.ones_like(means)
    else:
        beta = 0.5 * (prior_variance.log() - variances.log())
    weighted = beta * precisions
    precision = weighted.sum(0)
    numerator = (weighted * means).sum(0)
    if rule in SHARED_PRIOR_RULES:
        prior_weight = (1.0 - beta.sum(0)) / prior_variance
        precision = precision + prior_weight
        numerator = numerator + prior_weight * prior_mean
    variance = precision.reciprocal()
    return variance * numerator, variance
