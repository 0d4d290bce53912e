"""Multi-fidelity test functions, pinned against independently known values, and the federation."""

import math

import numpy as np
import pytest
import torch

from fedgp.synthetic import multifidelity as mf
from fedgp.synthetic.multifidelity import (
    MF_FUNCTIONS,
    TABLE1_FUNCTIONS,
    borehole,
    branin,
    currin,
    forrester,
    hartmann3,
    multifidelity_federation,
    nonlinear_example,
    park,
)


def test_branin_global_minima():
    # Branin's three global minimisers, f* = 0.397887 (Dixon & Szegö 1978; Surjanovic & Bingham,
    # Virtual Library of Simulation Experiments, "Branin function").
    X = [[-math.pi, 12.275], [math.pi, 2.275], [9.42478, 2.475]]
    np.testing.assert_allclose(branin(X), 0.397887, atol=1e-6)
    # ... and they are minima: nearby points are higher.
    rng = np.random.default_rng(0)
    for x in X:
        assert (branin(np.asarray(x) + 0.05 * rng.standard_normal((20, 2))) > 0.397887).all()


def test_branin_lower_levels_follow_perdikaris():
    # Perdikaris et al. (2017): f2(x) = 10 sqrt(f3(x - 2)) + 2(x1 - 0.5) - 3(3 x2 - 1) - 1,
    # f1(x) = f2(1.2 (x + 2)) - 3 x2 + 1. At x = (π + 2, 2.275 + 2), x - 2 is a minimiser of f3.
    x = np.array([[math.pi + 2, 4.275]])
    expected_medium = 10 * math.sqrt(0.3978873577) + 2 * (math.pi + 1.5) - 3 * (3 * 4.275 - 1) - 1
    np.testing.assert_allclose(branin(x, "medium"), expected_medium, rtol=1e-9)
    z = np.array([[1.0, 2.0]])
    np.testing.assert_allclose(branin(z, "low"), branin(1.2 * (z + 2), "medium") - 3 * 2.0 + 1, rtol=1e-12)


def test_hartmann3_global_minimum():
    # Hartmann-3D: f* = -3.86278 at (0.114614, 0.555649, 0.852547) (Surjanovic & Bingham, VLSE).
    np.testing.assert_allclose(hartmann3([[0.114614, 0.555649, 0.852547]]), -3.86278, atol=1e-5)
    # Lower levels use α + (3 - t)δ with δ = (0.01, -0.01, -0.1, 0.1) (emukit, FGPR App. Ex. 6):
    # at a point where one term dominates, level t differs by the matching α change.
    P0 = [[0.3689, 0.1170, 0.2673]]  # the first centre: exp(0) term has weight α_1
    diff = hartmann3(P0, "medium") - hartmann3(P0, "high")
    assert diff[0] == pytest.approx(-0.01, abs=2e-3)


def test_forrester_values():
    # Forrester et al. (2008): f(1) = (6 - 2)² sin(8) = 16 sin 8 = 15.8297...; global minimum
    # -6.02074 at x ≈ 0.757249 (Surjanovic & Bingham, VLSE "Forrester et al. (2008) function").
    assert forrester([[1.0]])[0] == pytest.approx(16 * math.sin(8), rel=1e-12)
    assert forrester([[1.0]])[0] == pytest.approx(15.8297, abs=1e-4)
    assert forrester([[0.757249]])[0] == pytest.approx(-6.02074, abs=1e-5)
    # Low fidelity: 0.5 f(x) + 10 (x - 0.5) + 5 -> 0.5 * 15.8297 + 5 + 5 at x = 1.
    assert forrester([[1.0]], "low")[0] == pytest.approx(0.5 * 16 * math.sin(8) + 10, rel=1e-12)


def test_nonlinear_example_values():
    # y_l = cos 15x, y_h = x exp(y_l(2x - 0.2)) - 1 (FGPR §5 Ex. 2): at x = 0.1, 2x - 0.2 = 0.
    assert nonlinear_example([[0.1]])[0] == pytest.approx(0.1 * math.e - 1, rel=1e-12)
    assert nonlinear_example([[0.0]], "low")[0] == pytest.approx(1.0)
    assert nonlinear_example.bounds.tolist() == [[0.0, 2.0]]


def test_currin_values_and_low_fidelity_average():
    # Currin et al. (1991), hand-evaluated: at (0.5, 0.5) the factor is 1 - e^{-1} and the ratio
    # (2300/8 + 1900/4 + 1046 + 60) / (100/8 + 500/4 + 2 + 20) = 1868.5 / 159.5.
    assert currin([[0.5, 0.5]])[0] == pytest.approx((1 - math.exp(-1)) * 1868.5 / 159.5, rel=1e-12)
    # x2 = 0: exp(-1/0) = 0, so the factor is 1 and the value at x1 = 0 is 60/20 = 3 (finite).
    assert currin([[0.0, 0.0]])[0] == pytest.approx(3.0)
    # LF = average of HF at the four (±0.05, ±0.05) neighbours, with x2 - 0.05 floored at 0.
    x = np.array([[0.3, 0.02]])
    corners = [[0.35, 0.07], [0.35, 0.0], [0.25, 0.07], [0.25, 0.0]]
    assert currin(x, "low")[0] == pytest.approx(currin(corners).mean(), rel=1e-12)


def test_park_uses_x3_squared():
    # Park (1991) / Xiong et al. (2013), evaluated term by term with the textbook form
    # (x1/2)[sqrt(1 + (x2 + x3²) x4 / x1²) - 1] + (x1 + 3 x4) e^{1 + sin x3}.
    x1, x2, x3, x4 = 0.5, 0.3, 0.7, 0.9
    term1 = (x1 / 2) * (math.sqrt(1 + (x2 + x3**2) * x4 / x1**2) - 1)
    expected = term1 + (x1 + 3 * x4) * math.exp(1 + math.sin(x3))
    assert park([[x1, x2, x3, x4]])[0] == pytest.approx(expected, rel=1e-12)
    # The emukit bug (x2 + x3) gives a different number: we are not reproducing it.
    buggy = (x1 / 2) * (math.sqrt(1 + (x2 + x3) * x4 / x1**2) - 1) + (x1 + 3 * x4) * math.exp(
        1 + math.sin(x3)
    )
    assert abs(park([[x1, x2, x3, x4]])[0] - buggy) > 0.01
    low = (1 + math.sin(x1) / 10) * expected - 2 * x1 + x2**2 + x3**2 + 0.5
    assert park([[x1, x2, x3, x4]], "low")[0] == pytest.approx(low, rel=1e-12)
    # Finite at the domain edge x1 = 0 (the limit is sqrt((x2 + x3²) x4) / 2 + 3 x4 e^{1 + sin x3}).
    edge = park([[0.0, x2, x3, x4]])[0]
    assert edge == pytest.approx(math.sqrt((x2 + x3**2) * x4) / 2 + 3 * x4 * math.exp(1 + math.sin(x3)))


def _borehole_textbook(rw, r, tu, hu, tl, hl, length, kw, low=False):
    # Harper & Gupta (1983) as written in Surjanovic & Bingham (VLSE "Borehole function"); the LF
    # form of Xiong et al. (2013) with the FGPR paper's constant 5π.
    a, one = (5 * math.pi, 1.5) if low else (2 * math.pi, 1.0)
    lr = math.log(r / rw)
    return a * tu * (hu - hl) / (lr * (one + 2 * length * tu / (lr * rw**2 * kw) + tu / tl))


def test_borehole_against_the_textbook_formula():
    # A documented input point (the example of the R package apts.doe's `borehole` help page) and
    # the domain centre; both evaluated with the scalar textbook formula above.
    x = [0.12650025, 897.8873, 97266.21, 1041.3891, 76.17152, 745.6965, 1608.609, 11853.055]
    assert borehole([x])[0] == pytest.approx(_borehole_textbook(*x), rel=1e-12)
    assert borehole([x], "low")[0] == pytest.approx(_borehole_textbook(*x, low=True), rel=1e-12)
    centre = borehole.bounds.mean(axis=1)
    assert borehole([centre])[0] == pytest.approx(_borehole_textbook(*centre), rel=1e-12)
    # The flow is proportional to the head difference Hu - Hl (physics of the model).
    doubled = centre.copy()
    doubled[5] = centre[3] - 2 * (centre[3] - centre[5])
    assert borehole([doubled])[0] == pytest.approx(2 * borehole([centre])[0], rel=1e-12)
    # The paper's range for Tl ends at 115 (literature: 116).
    assert borehole.bounds[4].tolist() == [63.1, 115.0]


def test_borehole_mean_over_domain_is_about_77():
    # outerbase's `obtest_borehole8d` subtracts 77 to centre Borehole over the uniform box.
    y = borehole(borehole.sample(20000, 0))
    assert 74 < y.mean() < 81


@pytest.mark.parametrize("name", sorted(MF_FUNCTIONS))
def test_functions_are_vectorised_float64(name):
    fn = MF_FUNCTIONS[name]
    X = fn.sample(7, 0)
    assert X.shape == (7, fn.d)
    assert ((X >= fn.bounds[:, 0]) & (X <= fn.bounds[:, 1])).all()
    for level in range(fn.num_levels):
        y = fn(X, level)
        assert y.shape == (7,) and y.dtype == np.float64 and np.isfinite(y).all()
        # one row at a time gives the same numbers
        np.testing.assert_allclose(np.concatenate([fn(X[i : i + 1], level) for i in range(7)]), y, rtol=1e-13)
    np.testing.assert_allclose(fn.from_unit(fn.to_unit(X)), X, rtol=1e-12)


def test_bad_inputs_raise_value_errors():
    with pytest.raises(ValueError, match="X must have shape"):
        currin(np.zeros((3, 3)))
    with pytest.raises(ValueError, match="NaN"):
        currin([[0.1, np.nan]])
    with pytest.raises(ValueError, match="level must be one of"):
        currin([[0.1, 0.2]], "medium")
    with pytest.raises(ValueError, match="level index"):
        branin([[0.1, 0.2]], 3)
    with pytest.raises(ValueError, match="function must be one of"):
        multifidelity_federation("rosenbrock")
    with pytest.raises(ValueError, match="sizes: unknown level"):
        multifidelity_federation("currin", {"medium": 5})
    with pytest.raises(ValueError, match="sizes: level 'high' needs at least 2"):
        multifidelity_federation("currin", {"high": 1})
    with pytest.raises(ValueError, match="sizes: branin has 3 levels"):
        multifidelity_federation("branin", [10, 20])
    with pytest.raises(ValueError, match="n_test"):
        multifidelity_federation("currin", n_test=0)
    with pytest.raises(ValueError, match="bounds"):
        mf.MultiFidelityFunction("bad", [[1.0, 0.0]], (mf._currin_low, mf._currin_high), (2, 2))


def test_federation_layout_scaling_and_standardisation():
    p = multifidelity_federation("branin", seed=3)
    fed = p.federation
    assert fed.ids == ["high", "medium", "low"]
    assert fed.sizes.tolist() == [20, 40, 200]  # the paper's HF/MF/LF
    assert float(fed.weights[0]) == pytest.approx(20 / 260)
    for client in fed:
        assert float(client.X.min()) >= 0 and float(client.X.max()) <= 1  # unit cube
        assert float(client.y.mean()) == pytest.approx(0, abs=1e-12)  # per-client standardisation
        assert float(client.y.std(unbiased=False)) == pytest.approx(1, rel=1e-12)
        level = client.metadata["level"]
        raw = branin(branin.from_unit(client.X.numpy()), level)
        m, s = client.metadata["y_mean"], client.metadata["y_std"]
        np.testing.assert_allclose(client.y.numpy() * s + m, raw, rtol=1e-12)
    # the HF test set: 1,000 uniform points, standardised with the HF *training* statistics
    hf = fed[0]
    assert hf.X_test.shape == (1000, 2) and not fed[1].has_test
    truth = branin(branin.from_unit(hf.X_test.numpy()))
    np.testing.assert_allclose(hf.y_test.numpy(), (truth - p.y_mean[-1]) / p.y_std[-1], rtol=1e-12)
    # the centralised view holds the same data, lowest level first
    assert torch.equal(p.levels[-1][0], hf.X) and torch.equal(p.levels[0][1], fed[2].y)


def test_federation_is_seeded_and_lf_design_does_not_depend_on_hf_size():
    a = multifidelity_federation("currin", {"high": 10}, seed=5)
    b = multifidelity_federation("currin", {"high": 80}, seed=5)
    c = multifidelity_federation("currin", {"high": 10}, seed=5)
    d = multifidelity_federation("currin", {"high": 10}, seed=6)
    assert torch.equal(a.levels[0][0], b.levels[0][0])  # same LF design at both HF sizes
    assert torch.equal(a.hf.X, c.hf.X) and torch.equal(a.X_test, c.X_test)
    assert not torch.equal(a.hf.X, d.hf.X)
    assert a.hf.n == 10 and b.hf.n == 80


def test_table1_functions_have_the_paper_sizes():
    sizes = {name: MF_FUNCTIONS[name].paper_sizes[::-1] for name in TABLE1_FUNCTIONS}
    assert sizes == {
        "currin": (40, 200),
        "park": (50, 300),
        "branin": (20, 40, 200),
        "hartmann3": (50, 100, 200),
        "borehole": (50, 200),
    }


def test_vertices_option_adds_the_cube_corners_like_the_authors_code():
    plain = multifidelity_federation("currin", seed=2)
    with_corners = multifidelity_federation("currin", seed=2, vertices=True)
    for a, b in zip(plain.federation, with_corners.federation):
        assert b.n == a.n + 4
        assert torch.equal(b.X[: a.n], a.X)  # the same random points, then the corners
        assert sorted(map(tuple, b.X[a.n :].tolist())) == [(0.0, 0.0), (0.0, 1.0), (1.0, 0.0), (1.0, 1.0)]
    assert torch.equal(plain.X_test, with_corners.X_test)
