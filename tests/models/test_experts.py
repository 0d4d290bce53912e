"""The combination rules of local experts (PoE, gPoE, BCM, rBCM) against their closed forms."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from fedgp.errors import InputError
from fedgp.models.experts import RULES, combine_experts


def by_hand(means, variances, rule, prior_mean, prior_variance):
    """Deisenroth & Ng's formulas, written out point by point in plain floats (their prior mean is
    zero; a non-zero one enters BCM and rBCM with the prior's weight)."""
    K, points = means.shape
    out_mean, out_var = [], []
    for j in range(points):
        s2 = [
            min(float(variances[k, j]), float(prior_variance[j]))
            if rule in ("bcm", "rbcm")
            else float(variances[k, j])
            for k in range(K)
        ]
        mu = [float(means[k, j]) for k in range(K)]
        p2 = float(prior_variance[j])
        if rule == "poe":
            beta = [1.0] * K
        elif rule == "gpoe":
            beta = [1.0 / K] * K
        elif rule == "bcm":
            beta = [1.0] * K
        else:
            beta = [0.5 * (math.log(p2) - math.log(v)) for v in s2]
        precision = sum(b / v for b, v in zip(beta, s2))
        numerator = sum(b / v * m for b, v, m in zip(beta, s2, mu))
        if rule in ("bcm", "rbcm"):
            precision += (1.0 - sum(beta)) / p2
            numerator += (1.0 - sum(beta)) / p2 * float(prior_mean[j])
        out_var.append(1.0 / precision)
        out_mean.append(numerator / precision)
    return np.array(out_mean), np.array(out_var)


@given(
    experts=st.integers(1, 6),
    points=st.integers(1, 5),
    seed=st.integers(0, 2**31 - 1),
    rule=st.sampled_from(RULES),
)
def test_each_rule_is_its_closed_form(experts, points, seed, rule):
    gen = torch.Generator().manual_seed(seed)
    prior_variance = 0.2 + 3 * torch.rand(points, generator=gen, dtype=torch.float64)
    prior_mean = torch.randn(points, generator=gen, dtype=torch.float64)
    # posterior variances below the prior's, as an exact GP's are
    variances = prior_variance * (
        0.01 + 0.99 * torch.rand(experts, points, generator=gen, dtype=torch.float64)
    )
    means = torch.randn(experts, points, generator=gen, dtype=torch.float64)
    mean, variance = combine_experts(means, variances, rule, prior_mean, prior_variance)
    want_mean, want_var = by_hand(means, variances, rule, prior_mean, prior_variance)
    np.testing.assert_allclose(mean.numpy(), want_mean, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(variance.numpy(), want_var, rtol=1e-12)
    assert bool((variance > 0).all())


@pytest.mark.parametrize("rule", ["poe", "gpoe", "bcm"])
def test_one_expert_is_returned_as_it_is(rule):
    """(rBCM's β = ½ log(σ_**²/σ²) re-weighs even a single expert against the prior.)"""
    means = torch.tensor([[0.3, -1.0, 2.0]], dtype=torch.float64)
    variances = torch.tensor([[0.1, 0.5, 0.99]], dtype=torch.float64)
    mean, variance = combine_experts(
        means, variances, rule, torch.tensor([1.0, 2.0, 3.0]).double(), torch.ones(3, dtype=torch.float64)
    )
    torch.testing.assert_close(mean, means[0], rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(variance, variances[0], rtol=1e-13, atol=0)


def test_far_from_all_data_the_committees_return_the_prior_and_poe_is_over_confident():
    """Where no expert has data each reports the prior: BCM, rBCM and gPoE give it back, PoE shrinks
    the variance K-fold (the over-confidence Deisenroth & Ng correct)."""
    K, prior_mean, prior_var = 5, torch.tensor([0.7]).double(), torch.tensor([2.0]).double()
    means, variances = prior_mean.expand(K, 1).clone(), prior_var.expand(K, 1).clone()
    for rule in ("gpoe", "bcm", "rbcm"):
        mean, variance = combine_experts(means, variances, rule, prior_mean, prior_var)
        torch.testing.assert_close(variance, prior_var)
        torch.testing.assert_close(mean, prior_mean)
    _, variance = combine_experts(means, variances, "poe")
    torch.testing.assert_close(variance, prior_var / K)


def test_experts_who_know_nothing_change_nothing_under_bcm_and_rbcm_and_dilute_gpoe():
    prior_mean, prior_var = torch.zeros(1).double(), torch.ones(1).double()
    means = torch.tensor([[2.0], [0.0], [0.0]]).double()
    variances = torch.tensor([[0.01], [1.0], [1.0]]).double()
    for rule in ("bcm", "rbcm"):
        alone = combine_experts(means[:1], variances[:1], rule, prior_mean, prior_var)
        together = combine_experts(means, variances, rule, prior_mean, prior_var)
        torch.testing.assert_close(together, alone)
    torch.testing.assert_close(
        combine_experts(means, variances, "bcm", prior_mean, prior_var), (means[0], variances[0])
    )
    _, variance = combine_experts(means, variances, "gpoe")
    assert float(variance) > 2.5 * 0.01  # 1/(1/3 (100 + 1 + 1)) = 0.0294


def test_an_expert_wider_than_the_prior_by_round_off_counts_as_the_prior():
    prior_mean, prior_var = torch.zeros(1).double(), torch.ones(1).double()
    means = torch.zeros(2, 1).double()
    variances = torch.tensor([[1.0 + 1e-12], [1.0 + 1e-12]]).double()
    for rule in ("bcm", "rbcm"):
        _, variance = combine_experts(means, variances, rule, prior_mean, prior_var)
        torch.testing.assert_close(variance, prior_var)


def test_bad_input_is_named():
    m, v = torch.zeros(2, 3).double(), torch.ones(2, 3).double()
    with pytest.raises(InputError, match="combine='pop'"):
        combine_experts(m, v, "pop")
    with pytest.raises(InputError, match="pass prior_mean and prior_variance"):
        combine_experts(m, v, "rbcm")
    with pytest.raises(InputError, match=r"\(experts, points\)"):
        combine_experts(m, v[:, :2], "poe")
    with pytest.raises(InputError, match="positive"):
        combine_experts(m, v * 0, "gpoe")
    with pytest.raises(InputError, match=r"must be \(3,\)"):
        combine_experts(m, v, "bcm", torch.zeros(2).double(), torch.ones(2).double())
