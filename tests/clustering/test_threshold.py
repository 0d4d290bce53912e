"""Threshold-Clustering (Algorithm 3): its closed form when the inside set is fixed, the radius
rules, recovery of a cluster mean, and bounds that hold for any input."""

import math

import hypothesis.strategies as st
import numpy as np
import pytest
import torch
from hypothesis import given

from fedgp.clustering import (
    FixedRadius,
    KMeansRadius,
    QuantileRadius,
    kmeans,
    kmeans_plus_plus,
    threshold_clustering,
)


def clusters(sizes=(10, 8, 6), dim=5, spread=0.05, gap=10.0, seed=0):
    gen = torch.Generator().manual_seed(seed)
    centres = torch.eye(dim, dtype=torch.float64)[: len(sizes)] * gap
    points = torch.cat(
        [c + spread * torch.randn(n, dim, generator=gen, dtype=torch.float64) for c, n in zip(centres, sizes)]
    )
    labels = torch.cat([torch.full((n,), j) for j, n in enumerate(sizes)])
    return points, labels


def test_with_a_fixed_inside_set_tc_contracts_to_the_cluster_mean_at_rate_one_minus_share():
    # v_l = μ + (1 − n_c/N)^l (v_0 − μ) while the ball holds exactly cluster c: eq. 24 unrolled
    points, labels = clusters()
    N, n0 = len(points), int((labels == 0).sum())
    mu = points[labels == 0].mean(0)
    v0 = points[0] + 0.2
    for M in (1, 2, 5, 40):
        got = threshold_clustering(points, v0.unsqueeze(0), M, FixedRadius(3.0))
        expected = mu + (1 - n0 / N) ** M * (v0 - mu)
        assert torch.allclose(got.centres[0], expected, rtol=0, atol=1e-12)
        assert torch.equal(got.inside[0], labels == 0)


def test_tc_recovers_each_cluster_mean_and_ignores_a_distant_liar():
    points, labels = clusters()
    liar = torch.full((1, points.shape[1]), 1e6, dtype=torch.float64)
    with_liar = torch.cat([points, liar])
    for c in range(3):
        start = points[labels == c][0].unsqueeze(0)
        got = threshold_clustering(with_liar, start, 80, FixedRadius(3.0)).centres[0]
        assert torch.allclose(got, points[labels == c].mean(0), atol=1e-10)


def test_quantile_radius_is_the_authors_rule():
    d = torch.tensor([[0.0, 3.0, 1.0, 2.0, 4.0]], dtype=torch.float64)
    mask = torch.ones_like(d, dtype=torch.bool)
    # sorted(d) = 0 1 2 3 4; int(5 · 0.5) = 2 -> 2.0 · 0.99
    assert float(QuantileRadius(0.5)(d, mask)[0]) == pytest.approx(1.98)
    assert float(QuantileRadius(1.0)(d, mask)[0]) == pytest.approx(4 * 0.99)  # clipped to the largest
    masked = mask.clone()
    masked[0, 1] = False  # the 3.0 is padding: sorted 0 1 2 4, int(4 · 0.5) = 2
    assert float(QuantileRadius(0.5, scale=1.0)(d, masked)[0]) == pytest.approx(2.0)


def test_quantile_tc_from_a_members_gradient_keeps_about_q_n_points():
    points, labels = clusters(sizes=(10, 10, 10))
    got = threshold_clustering(points, points[:1], 10, QuantileRadius(0.2))
    inside = got.inside[0]
    assert int(inside.sum()) == 6  # sorted(d)[6] · 0.99 keeps the 6 nearest
    assert bool((labels[inside] == 0).all())


def test_cd_radius_is_the_midpoint_of_the_upper_two_distance_centres():
    d = torch.tensor([[0.0, 0.1, 0.2, 5.0, 5.2, 20.0, 21.0]], dtype=torch.float64)
    tau = KMeansRadius()(d, torch.ones_like(d, dtype=torch.bool))
    assert float(tau[0]) == pytest.approx((5.1 + 20.5) / 2)
    flat = torch.tensor([[1.0, 1.0, 2.0]], dtype=torch.float64)
    assert float(KMeansRadius()(flat, torch.ones_like(flat, dtype=torch.bool))[0]) == 2.0


def test_infinite_radius_is_the_plain_mean_and_survives_json():
    from fedgp.messages import config_json, from_config

    points, _ = clusters()
    got = threshold_clustering(points, torch.zeros(1, 5, dtype=torch.float64), 1, FixedRadius(math.inf))
    assert torch.allclose(got.centres[0], points.mean(0), atol=1e-12)
    import json

    assert from_config(json.loads(config_json(FixedRadius(math.inf)))) == FixedRadius(math.inf)


def test_a_batch_with_padding_equals_the_problems_one_by_one():
    points, _ = clusters()
    a, b = points[:20], points[4:15]
    padded = torch.zeros(2, 20, 5, dtype=torch.float64)
    padded[0], padded[1, :11] = a, b
    mask = torch.zeros(2, 20, dtype=torch.bool)
    mask[0], mask[1, :11] = True, True
    starts = torch.stack([a[:1], b[:1]])
    batch = threshold_clustering(padded, starts, 7, QuantileRadius(0.3), mask)
    for i, pts in enumerate((a, b)):
        one = threshold_clustering(pts, starts[i], 7, QuantileRadius(0.3))
        assert torch.allclose(batch.centres[i], one.centres, rtol=0, atol=1e-14)


def test_bad_input_is_a_clear_value_error():
    pts = torch.zeros(4, 2, dtype=torch.float64)
    with pytest.raises(ValueError, match="iterations"):
        threshold_clustering(pts, pts[:1], 0)
    with pytest.raises(ValueError, match=r"points must be \(N, P\)"):
        threshold_clustering(pts[0], pts[:1])
    with pytest.raises(ValueError, match="do not match"):
        threshold_clustering(pts, torch.zeros(1, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match="NaN"):
        threshold_clustering(torch.full((4, 2), math.nan), pts[:1])
    with pytest.raises(ValueError, match="no points"):
        threshold_clustering(pts, pts[:1], mask=torch.zeros(4, dtype=torch.bool))
    with pytest.raises(ValueError, match="q must be in"):
        QuantileRadius(1.5)
    with pytest.raises(ValueError, match="tau"):
        FixedRadius(-1.0)


vectors = st.lists(st.lists(st.floats(-1e3, 1e3), min_size=2, max_size=2), min_size=1, max_size=12).map(
    lambda rows: torch.tensor(rows, dtype=torch.float64)
)


@given(vectors, st.floats(0.0, 1.0), st.integers(1, 12))
def test_tc_stays_in_the_box_of_its_start_and_points_and_keeps_its_start_without_neighbours(pts, q, M):
    start = pts[:1] + 0.5
    got = threshold_clustering(pts, start, M, QuantileRadius(q)).centres[0]
    lo = torch.minimum(pts.min(0).values, start[0]) - 1e-9
    hi = torch.maximum(pts.max(0).values, start[0]) + 1e-9
    assert bool(((got >= lo) & (got <= hi)).all())
    alone = threshold_clustering(pts, start, M, FixedRadius(0.0)).centres[0]
    assert torch.equal(alone, start[0]) or bool((pts == start).all(1).any())


def test_kmeans_plus_plus_seeds_distinct_points_and_lloyd_splits_separated_clusters():
    points, labels = clusters()
    seeds = kmeans_plus_plus(points, 3, np.random.default_rng(0))
    assert len(set(seeds.tolist())) == 3  # far-apart clusters: each seed in another one
    centres, found = kmeans(points, 3, np.random.default_rng(1))
    found = torch.from_numpy(found)
    for c in range(3):  # each true cluster is one found cluster
        assert len(set(found[labels == c].tolist())) == 1
        assert np.allclose(centres[int(found[labels == c][0])], points[labels == c].mean(0).numpy())
    with pytest.raises(ValueError, match="k must be in"):
        kmeans_plus_plus(points, 0, np.random.default_rng(0))
