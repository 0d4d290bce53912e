"""``FTS``: federated Thompson sampling (Dai, Low & Jaillet, NeurIPS 2020).

All agents share one set of ``features`` random Fourier features (frequencies, phases and the RBF
hyper-parameters: :class:`~fedgp.bo.features.FourierFeatures`). After every iteration each agent
draws one weight vector from its posterior on the shared features and shares it (M numbers, not the
posterior). To propose at iteration ``t``, agent k, with probability ``p_t = 1 - 1/t²`` (``p_1 :=
p_2``, as in the authors' Landmine script), Thompson-samples its own GP — a fresh set of
``target_features`` features, a weight draw from its own posterior — and otherwise picks another
agent n uniformly and maximises ``φ(x)ᵀω_n``, agent n's latest shared draw. With one agent it always
samples its own.

The hyper-parameters (``lengthscale``, ``outputscale``, ``noise``, and a constant prior ``mean``,
0 by default) are given, in the objectives' units, as in the paper's experiments (no agent fits
them); :class:`~fedgp.bo.FederatedFTS` learns them in the federation instead. A draw is maximised
over ``candidates`` uniform points of the box, then polished by L-BFGS-B from the best one.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from fedgp.bo.features import FourierFeatures, WeightPosterior
from fedgp.bo.loop import uniform_points
from fedgp.bo.maximise import maximise
from fedgp.bo.method import Method
from fedgp.errors import InputError
from fedgp.rng import generator

__all__ = ["FTS", "maximise_draw", "own_probability"]


def own_probability(t: int) -> float:
    """``p_t = 1 - 1/t²`` for ``t >= 2``, and ``p_1 = p_2 = 0.75``."""
    return 1.0 - 1.0 / max(t, 2) ** 2


def maximise_draw(
    f: Callable[[torch.Tensor], torch.Tensor], bounds: torch.Tensor, seed: int, candidates: int
) -> torch.Tensor:
    """The best of ``candidates`` uniform points of ``bounds`` (from ``seed``) for ``f``, polished by
    L-BFGS-B; a ``1 x d`` tensor."""
    x, _ = maximise(f, uniform_points(bounds, candidates, seed, "fts candidates"), bounds)
    return x.unsqueeze(0)


class FTS(Method):
    """Federated Thompson sampling with ``features`` shared features (M) and ``target_features`` for
    an agent's own draws, on ``outputscale · RBF_lengthscale`` with noise variance ``noise``, around the
    constant ``mean``."""

    name = "fts"

    def __init__(
        self,
        lengthscale: float,
        outputscale: float = 1.0,
        noise: float = 1e-3,
        *,
        mean: float = 0.0,
        features: int = 100,
        target_features: int = 200,
        candidates: int = 1000,
    ):
        for label, value in (("lengthscale", lengthscale), ("outputscale", outputscale), ("noise", noise)):
            if not np.all(np.asarray(value, dtype=float) > 0):
                raise InputError(f"FTS: {label} must be > 0, got {value!r}")
        if not np.isfinite(mean):
            raise InputError(f"FTS: mean must be a finite number, got {mean!r}")
        self.lengthscale, self.outputscale, self.noise = lengthscale, float(outputscale), float(noise)
        self.mean = float(mean)
        self.features, self.target_features, self.candidates = features, target_features, candidates
        self.shared: FourierFeatures | None = None
        self.shared_weights: list[torch.Tensor] = []

    def _share(self, loop, iteration: int) -> None:
        """Each agent's draw on the shared features: all that leaves it."""
        self.shared_weights = [
            WeightPosterior.fit(self.shared, o.X, o.y - self.mean, self.noise).sample(
                generator(loop.seed, "fts share", k, iteration)
            )
            for k, o in enumerate(loop.owners)
        ]

    def _draw_features(self, loop) -> None:
        """The shared features, from the seed's stream at the current hyper-parameters."""
        rng = generator(loop.seed, "fts shared features")
        self.shared = FourierFeatures.sample(
            self.features, loop.owners[0].dim, self.lengthscale, self.outputscale, rng
        )

    def start(self, loop) -> dict:
        self._draw_features(loop)
        self._share(loop, 0)
        return {}

    def resume(self, loop, iteration: int, folder, key=None) -> None:
        """The shared features and the agents' draws are functions of the seed and the owners' rows:
        drawn again as ``start`` and ``update(iteration)`` drew them."""
        self.start(loop)
        if iteration:
            self._share(loop, iteration)

    def _own_draw(self, owner, rng: np.random.Generator):
        features = FourierFeatures.sample(
            self.target_features, owner.dim, self.lengthscale, self.outputscale, rng
        )
        weight = WeightPosterior.fit(features, owner.X, owner.y - self.mean, self.noise).sample(rng)
        return lambda X: features(X) @ weight

    def propose(self, loop, iteration: int) -> list:
        out, K = [], len(loop.owners)
        for k, owner in enumerate(loop.owners):
            rng = generator(loop.seed, "fts propose", k, iteration)
            if K == 1 or rng.uniform() < own_probability(iteration):
                f = self._own_draw(owner, rng)
            else:
                n = int(rng.choice([i for i in range(K) if i != k]))
                weight, shared = self.shared_weights[n], self.shared
                f = lambda X, w=weight, s=shared: s(X) @ w  # noqa: E731
            out.append(maximise_draw(f, owner.bounds, int(rng.integers(2**31)), self.candidates))
        return out

    def update(self, loop, iteration: int) -> dict:
        self._share(loop, iteration)
        return {}
