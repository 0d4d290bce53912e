"""The nine aggregators of fedgp.aggregators pass the shipped aggregator contract
(fedgp.testing.AggregatorContract). Every closed form here is written out with numpy and scipy,
independently of the rule's code; every breakdown bound is the one the rule's docstring states."""

import math

import numpy as np
import torch
from scipy import optimize, stats
from scipy.spatial.distance import cdist

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
from fedgp.clustering import QuantileRadius
from fedgp.testing.aggregator import AggregatorContract


def _np(values):
    return values.detach().numpy()


def _t(array):
    return torch.from_numpy(np.asarray(array, dtype=np.float64))


def krum_scores(x: np.ndarray, f: int) -> np.ndarray:
    """Each point's sum of squared distances to its n − f − 2 nearest others (Blanchard et al.)."""
    d2 = cdist(x, x, "sqeuclidean")
    np.fill_diagonal(d2, np.inf)
    return np.sort(d2, axis=1)[:, : len(x) - f - 2].sum(1)


def geometric_median(x: np.ndarray) -> np.ndarray:
    """argmin_z Σ_i ‖x_i − z‖ by scipy's BFGS from the mean, polished to the optimum."""
    res = optimize.minimize(
        lambda z: np.linalg.norm(x - z, axis=1).sum(),
        x.mean(0),
        jac=lambda z: -((x - z) / np.linalg.norm(x - z, axis=1, keepdims=True)).sum(0),
        method="BFGS",
        options={"gtol": 1e-13, "maxiter": 10_000},
    )
    return res.x


class TestWeightedMeanContract(AggregatorContract):
    """FedAvg: no robustness at all (one participant at 10⁶ moves it as far as it likes)."""

    aggregator = WeightedMean()

    def closed_form(self, values, weights):
        return _t(np.einsum("p,pd->d", _np(weights), _np(values)))

    def tolerated(self, n):
        return 0


class TestWeightedMeanRawContract(TestWeightedMeanContract):
    aggregator = WeightedMean(space="raw")


class TestCoordinateMedianContract(AggregatorContract):
    """Fewer than half arbitrary: every coordinate within the honest values' range."""

    aggregator = CoordinateMedian()

    def closed_form(self, values, weights):
        return _t(np.median(_np(values), axis=0))

    def tolerated(self, n):
        return (n - 1) // 2


class TestTrimmedMeanContract(AggregatorContract):
    """At most f arbitrary (n > 2f): every coordinate within the honest values' range."""

    aggregator = TrimmedMean(f=2)

    def closed_form(self, values, weights):
        n = len(values)
        return _t(stats.trim_mean(_np(values), (self.aggregator.f + 0.5) / n, axis=0))  # cuts f per side

    def tolerated(self, n):
        return self.aggregator.f


class TestGeometricMedianContract(AggregatorContract):
    """Weiszfeld's iterations reach the geometric median (here, against scipy's optimum, to 1e-7
    after 200 steps); breakdown point 1/2 with Minsker's bound."""

    aggregator = GeometricMedian(iterations=200, smoothing=1e-12)
    rtol = 1e-7
    atol = 1e-9

    def closed_form(self, values, weights):
        return _t(geometric_median(_np(values)))

    def tolerated(self, n):
        return (n - 1) // 2

    def within_bound(self, result, honest, corrupted, previous):
        """‖GM − GM_honest‖ ≤ 2(1 − α)/(1 − 2α) · max_i ‖x_i − GM_honest‖ (Minsker 2015, Lemma 2.1)."""
        alpha = 1 - len(honest) / len(corrupted)
        centre = geometric_median(_np(honest))
        radius = np.linalg.norm(_np(honest) - centre, axis=1).max()
        return float(np.linalg.norm(_np(result) - centre)) <= 2 * (1 - alpha) / (1 - 2 * alpha) * radius


class TestKrumContract(AggregatorContract):
    """n > 2f + 2 and at most f arbitrary: the result is one of the honest updates."""

    aggregator = Krum(f=1)

    def closed_form(self, values, weights):
        return values[int(np.argmin(krum_scores(_np(values), self.aggregator.f)))]

    def tolerated(self, n):
        return self.aggregator.f if n > 2 * self.aggregator.f + 2 else 0

    def within_bound(self, result, honest, corrupted, previous):
        return bool((honest == result).all(1).any())


class TestMultiKrumContract(AggregatorContract):
    """The plain mean of the m = n − f best-scored; with f updates at 10⁶ those are the honest ones."""

    aggregator = MultiKrum(f=2)

    def closed_form(self, values, weights):
        x = _np(values)
        best = np.argsort(krum_scores(x, self.aggregator.f), kind="stable")[: len(x) - self.aggregator.f]
        return _t(x[best].mean(0))

    def tolerated(self, n):
        return self.aggregator.f if n > 2 * self.aggregator.f + 2 else 0


class TestCenteredClippingContract(AggregatorContract):
    """Each step moves v by at most τ: within iterations · τ of the previous state whatever anyone
    sends (so every participant may be arbitrary)."""

    aggregator = CenteredClipping(tau=0.5, iterations=4)

    def closed_form(self, values, weights):
        x, v = _np(values), np.zeros(values.shape[1])
        for _ in range(self.aggregator.iterations):
            d = x - v
            norm = np.linalg.norm(d, axis=1, keepdims=True)
            v = v + (d * np.minimum(1.0, self.aggregator.tau / np.maximum(norm, 1e-300))).mean(0)
        return _t(v)

    def tolerated(self, n):
        return n

    def within_bound(self, result, honest, corrupted, previous):
        reach = self.aggregator.iterations * self.aggregator.tau
        return float((result - previous).norm()) <= reach * (1 + 1e-12)

    def agreed_value(self, rng):
        """A value the clipped steps can reach: within iterations · τ of the previous state (a
        farther one is approached τ per step, as the rule's guarantee says)."""
        u = rng.standard_normal(self.dim)
        reach = self.aggregator.iterations * self.aggregator.tau
        return _t(u / np.linalg.norm(u) * 0.9 * reach)


class TestThresholdMeanContract(AggregatorContract):
    """From the coordinate-wise median, balls of 0.99 × the median distance: with fewer than half
    arbitrary, a 10⁶ update is never inside, and the centre stays in the honest values' range."""

    aggregator = ThresholdMean(radius=QuantileRadius(0.5), iterations=10)

    def closed_form(self, values, weights):
        x = _np(values)
        n, q, scale = len(x), self.aggregator.radius.q, self.aggregator.radius.scale
        v = np.median(x, axis=0)
        for _ in range(self.aggregator.iterations):
            d = np.linalg.norm(x - v, axis=1)
            tau = scale * np.sort(d)[min(math.floor(n * q), n - 1)]
            inside = d <= tau
            v = (x[inside].sum(0) + (n - inside.sum()) * v) / n
        return _t(v)

    def tolerated(self, n):
        return (n - 1) // 2


class TestBucketingContract(AggregatorContract):
    """Buckets of two averaged, then the coordinate-wise median of the bucket means: at most
    (buckets − 1) // 2 buckets may hold an attacker, so that many attackers are tolerated."""

    aggregator = Bucketing(size=2, inner=CoordinateMedian(), seed=4)
    permutation_invariant = False
    not_invariant_because = (
        "Bucketing draws its buckets by position (a seeded shuffle): permuting the participants "
        "changes which updates share a bucket; it is invariant only in distribution"
    )

    def closed_form(self, values, weights):
        x, size = _np(values), self.aggregator.size
        order = np.random.default_rng(self.aggregator.seed).permutation(len(x))
        means = np.stack([x[order[i : i + size]].mean(0) for i in range(0, len(x), size)])
        return _t(np.median(means, axis=0))

    def tolerated(self, n):
        buckets = -(-n // self.aggregator.size)
        return (buckets - 1) // 2
