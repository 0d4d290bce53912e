"""The nine aggregators: each against a closed form or a hand-computed case, and each breakdown
bound — f of n participants replaced by 10⁶ moves the result by less than the rule's stated bound."""

import math

import gpytorch
import hypothesis.strategies as st
import numpy as np
import pytest
import torch
from hypothesis import given

from fedgp import GPSpec, HyperState
from fedgp.aggregators import (
    Bucketing,
    CenteredClipping,
    CoordinateMedian,
    GeometricMedian,
    Krum,
    MultiKrum,
    ThresholdMean,
    TrimmedMean,
    WeightedMean,
)
from fedgp.clustering import FixedRadius
from fedgp.models import ZeroKernel

T = lambda rows: torch.tensor(rows, dtype=torch.float64)  # noqa: E731
UNIFORM = lambda n: torch.full((n,), 1.0 / n, dtype=torch.float64)  # noqa: E731


def test_coordinate_median_and_trimmed_mean_by_hand():
    x = T([[1.0, 10.0], [2.0, 20.0], [3.0, -5.0], [100.0, 0.0], [4.0, 7.0]])
    assert torch.equal(CoordinateMedian().combine(x, UNIFORM(5)), T([3.0, 7.0]))
    # drop 1 and 100 / -5 and 20: mean(2, 3, 4) = 3, mean(0, 7, 10) = 17/3
    assert torch.allclose(TrimmedMean(f=1).combine(x, UNIFORM(5)), T([3.0, 17 / 3]))
    assert torch.allclose(TrimmedMean(f=0).combine(x, UNIFORM(5)), x.mean(0))
    with pytest.raises(ValueError, match="more than 4"):
        TrimmedMean(f=2).combine(x[:4], UNIFORM(4))


def test_geometric_median_of_an_equilateral_triangle_is_its_centroid():
    # every angle < 120°: the Fermat point is the centroid (0.5, √3/6)
    x = T([[0.0, 0.0], [1.0, 0.0], [0.5, math.sqrt(3) / 2]])
    got = GeometricMedian(iterations=200).combine(x, UNIFORM(3))
    assert torch.allclose(got, T([0.5, math.sqrt(3) / 6]), atol=1e-9)
    # with the weights set aside: a heavier reported weight changes nothing
    assert torch.equal(got, GeometricMedian(iterations=200).combine(x, T([0.98, 0.01, 0.01])))


def test_krum_and_multi_krum_by_hand():
    # n = 5, f = 1: scores sum the n − f − 2 = 2 smallest squared distances
    x = T([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [3.0, 3.0], [50.0, 50.0]])
    # a: 1 + 1 = 2; b: 1 + 2 = 3; c: 1 + 2 = 3; d: 13 + 13 = 26; e: large
    assert torch.equal(Krum(f=1).combine(x, UNIFORM(5)), x[0])
    assert torch.allclose(MultiKrum(f=1, m=3).combine(x, UNIFORM(5)), T([1 / 3, 1 / 3]))
    assert torch.allclose(MultiKrum(f=1).combine(x, UNIFORM(5)), x[:4].mean(0))  # m = n − f
    with pytest.raises(ValueError, match="at least f \\+ 3 = 6"):
        Krum(f=3).combine(x, UNIFORM(5))


def test_centered_clipping_one_step_by_hand():
    x = T([[3.0, 4.0], [0.5, 0.0], [0.0, -2.0]])
    # clip to τ = 1 around 0: (0.6, 0.8), (0.5, 0), (0, -1)
    assert torch.allclose(
        CenteredClipping(tau=1.0, iterations=1).combine(x, UNIFORM(3)), T([1.1 / 3, -0.2 / 3])
    )
    # τ larger than every distance: the plain mean after one step, and it stays there
    assert torch.allclose(CenteredClipping(tau=10.0, iterations=4).combine(x, UNIFORM(3)), x.mean(0))


def test_threshold_mean_closed_form_with_a_fixed_ball():
    # from the previous state (0), τ = 1 holds the three small updates and never the (5, 5):
    # v_l = μ_S (1 − (1 − 3/4)^l)
    x = T([[0.1, 0.0], [0.0, 0.1], [-0.1, 0.3], [5.0, 5.0]])
    mu = x[:3].mean(0)
    for M in (1, 3, 8):
        got = ThresholdMean(FixedRadius(1.0), M, start="previous").combine(x, UNIFORM(4))
        assert torch.allclose(got, mu * (1 - 0.25**M), atol=1e-15)


def test_bucketing_averages_random_buckets_then_applies_the_inner_rule():
    x = T([[float(i), float(i * i)] for i in range(6)])
    order = np.random.default_rng(7).permutation(6)
    means = torch.stack([x[order[i : i + 2]].mean(0) for i in (0, 2, 4)])
    got = Bucketing(size=2, inner=CoordinateMedian(), seed=7).combine(x, UNIFORM(6))
    assert torch.equal(got, torch.quantile(means, 0.5, dim=0))
    # size 1 is the inner rule; the mean of equal buckets' means is the mean
    assert torch.equal(Bucketing(1, Krum(f=1)).combine(x, UNIFORM(6)), Krum(f=1).combine(x, UNIFORM(6)))
    mean = Bucketing(3, WeightedMean()).combine(x, UNIFORM(6))
    assert torch.allclose(mean, x.mean(0))


# -- the rules as FGPR's aggregator: updates in raw space, fixed parameters kept -------------------------

SPEC = GPSpec(
    kernel=gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()), fixed=["likelihood.noise_covar.noise"]
)


def test_vector_rules_act_on_raw_updates_and_never_touch_fixed_parameters():
    previous = SPEC.initial_state()
    gen = torch.Generator().manual_seed(0)
    raw_prev = SPEC.to_raw(previous)
    raw = raw_prev.expand(5).map(lambda v, e: v + 0.3 * torch.randn(v.shape, generator=gen, dtype=v.dtype))
    states = SPEC.from_raw(raw)
    rule = GeometricMedian(iterations=50)
    got = rule(SPEC, states, UNIFORM(5), previous)
    names = [p.name for p in SPEC.params if p.trainable]
    updates = torch.cat([(raw[k] - raw_prev[k]).reshape(5, -1) for k in names], 1)
    step = rule.combine(updates, UNIFORM(5))
    for i, k in enumerate(names):
        p = SPEC.param(k)
        assert torch.allclose(got[k], p.transform(raw_prev[k] + step[i].reshape(p.shape)), rtol=1e-13)
    noise = "likelihood.noise_covar.noise"
    assert torch.equal(got[noise], previous[noise])
    with pytest.raises(ValueError, match="empty set"):
        rule(SPEC, states.index(slice(0, 0)), torch.zeros(0, dtype=torch.float64), previous)


# -- breakdown: f of n replaced by 10⁶ -------------------------------------------------------------------

N, F, D = 13, 3, 4


def corrupted(seed=0):
    gen = torch.Generator().manual_seed(seed)
    honest = torch.randn(N - F, D, generator=gen, dtype=torch.float64)
    return honest, torch.cat([honest, torch.full((F, D), 1e6, dtype=torch.float64)])


def in_box(result, honest, slack=0.0):
    return bool(((result >= honest.min(0).values - slack) & (result <= honest.max(0).values + slack)).all())


@pytest.mark.parametrize("seed", range(3))
def test_breakdown_bounds(seed):
    honest, all_ = corrupted(seed)
    w = UNIFORM(N)
    # coordinate-wise rules (f < n/2, f <= trim): every coordinate within the honest range
    for rule in (CoordinateMedian(), TrimmedMean(f=F), Bucketing(2, CoordinateMedian(), seed=seed)):
        assert in_box(rule.combine(all_, w), honest), rule
    # Krum picks an honest update; Multi-Krum (m = n − f) averages exactly the honest ones
    krum = Krum(f=F).combine(all_, w)
    assert bool((honest == krum).all(1).any())
    assert torch.allclose(MultiKrum(f=F).combine(all_, w), honest.mean(0))
    # geometric median: ‖GM − GM_honest‖ ≤ 2(1 − α)/(1 − 2α) · max_i ‖x_i − GM_honest‖
    alpha = F / N
    gm_honest = GeometricMedian(iterations=200).combine(honest, UNIFORM(N - F))
    radius = (honest - gm_honest).norm(dim=1).max()
    moved = (GeometricMedian().combine(all_, w) - gm_honest).norm()
    assert float(moved) <= 2 * (1 - alpha) / (1 - 2 * alpha) * float(radius)
    # centred clipping: within iterations · τ of the previous state, whatever is sent
    cc = CenteredClipping(tau=0.5, iterations=3)
    assert float(cc.combine(all_, w).norm()) <= 3 * 0.5 + 1e-12
    # threshold mean: the 10⁶ points are never inside, the result stays in the honest box
    assert in_box(ThresholdMean().combine(all_, w), honest)
    # the weighted mean has no breakdown point: three liars of thirteen move it by ~2.3e5
    assert float(WeightedMean().combine(all_, w).abs().min()) > 1e5


# -- properties for any input ------------------------------------------------------------------------------

matrices = st.integers(5, 9).flatmap(
    lambda n: st.lists(st.lists(st.floats(-1e3, 1e3), min_size=3, max_size=3), min_size=n, max_size=n).map(T)
)
shift = st.lists(st.floats(-1e3, 1e3), min_size=3, max_size=3).map(T)

RULES = [
    WeightedMean(),
    CoordinateMedian(),
    TrimmedMean(f=1),
    GeometricMedian(),
    Krum(f=1),
    MultiKrum(f=1),
    ThresholdMean(),
    Bucketing(2, CoordinateMedian()),
]


@given(matrices)
def test_every_rule_stays_in_the_box_of_the_points(x):
    for rule in RULES + [CenteredClipping(tau=0.1)]:
        got = rule.combine(x, UNIFORM(len(x)))
        slack = 1e-9 * (1 + float(x.abs().max()))
        ref = (
            torch.cat([x, torch.zeros(1, 3, dtype=torch.float64)])
            if isinstance(rule, CenteredClipping)
            else x
        )
        assert in_box(got, ref, slack), rule


@given(matrices, shift)
def test_every_rule_but_centred_clipping_is_translation_equivariant(x, c):
    for rule in RULES:
        a = rule.combine(x + c, UNIFORM(len(x)))
        b = rule.combine(x, UNIFORM(len(x))) + c
        assert torch.allclose(a, b, rtol=1e-9, atol=1e-6), rule


@given(matrices)
def test_when_everyone_agrees_every_rule_returns_the_agreed_update(x):
    same = x[:1].expand(len(x), 3).clone()
    for rule in RULES:
        assert torch.allclose(rule.combine(same, UNIFORM(len(x))), x[0], rtol=1e-12, atol=1e-9), rule


def test_settings_are_checked_where_they_enter():
    for bad, match in [
        (lambda: TrimmedMean(f=-1), "f must be an int"),
        (lambda: Krum(f=1.5), "f must be an int"),
        (lambda: GeometricMedian(iterations=0), "iterations"),
        (lambda: CenteredClipping(tau=0), "tau must be > 0"),
        (lambda: ThresholdMean(start="zero"), "start must be"),
        (lambda: Bucketing(size=0), "size"),
        (lambda: WeightedMean("log"), "average_space"),
    ]:
        with pytest.raises(ValueError, match=match):
            bad()


def test_linear_mean_updates_are_the_states_themselves():
    # an unconstrained mean: raw = constrained, so the robust result is the rule on the states
    spec = GPSpec(
        kernel=ZeroKernel(),
        mean=gpytorch.means.LinearMean(2, bias=False),
        fixed=["likelihood.noise_covar.noise"],
    )
    prev = spec.initial_state()
    w = T([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [3.0, 3.0], [50.0, 50.0]]).reshape(5, 2, 1)
    states = HyperState({**dict(prev.expand(5)), "mean_module.weights": w}, spec.event_shapes)
    got = Krum(f=1)(spec, states, UNIFORM(5), prev)
    assert torch.equal(got["mean_module.weights"], w[0])
