"""``DPFTSDE``: differentially private FTS with distributed exploration (Dai et al., NeurIPS 2021).

As in the authors' code (``daizhongxiang/Differentially-Private-Federated-Bayesian-Optimization``,
``landmine_dp_fts_de.py``, ``create_partitions.py``): the box is cut into ``P = per_dim^d`` grid
cells; agent n is assigned cell ``n mod P``. After every iteration each agent shares one weight draw
``ω_n`` on the shared Fourier features (as in :class:`~fedgp.bo.FTS`), and a trusted server
Poisson-samples agents with probability ``q``, clips each sampled draw to ``S/√P`` and releases, for
every cell i, ``ω_i = Σ_sampled φ_{i,n} ω̂_n / q + N(0, (max_n φ_{i,n} · z S / q)² I)``. The
distributed-exploration weights ``φ_{i,n} ∝ e^a`` for agents assigned to cell i and ``e^b`` for the
others, ``a`` held for ``a_iterations`` aggregations, then falling linearly to ``b`` over
``decay_iterations`` (then 1). An agent proposes, with probability ``1 - 1/t``, from its own GP
(fresh features, its own posterior draw), else by maximising ``φ(x)ᵀ ω_{cell(x)}`` piecewise; the
first proposal is always federated. ``private=False``: no sampling, clipping or noise (FTS-DE).

Privacy: each release is the sampled Gaussian mechanism on the clipped draws (Poisson rate ``q``,
noise multiplier ``z``; the paper's Theorem 1 accounts it with the moments accountant), one release
at the start and one after every iteration. The history's ``epsilon`` column is the ε at ``delta``
of every release so far, by dp-accounting's RDP accountant (:func:`fedgp.run.privacy.epsilon_spent`,
the same as :class:`~fedgp.run.ClientDP`'s), so the two methods' ε compare on one scale.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from fedgp.bo.features import DTYPE
from fedgp.bo.fts import FTS, maximise_draw
from fedgp.errors import InputError
from fedgp.rng import generator
from fedgp.run.privacy import epsilon_spent

__all__ = ["DPFTSDE", "de_weights", "private_cells", "cell_of"]


def de_weights(
    assignment: np.ndarray,
    cells: int,
    step: int,
    a: float,
    b: float,
    a_iterations: int,
    decay_iterations: int,
) -> np.ndarray:
    """``cells x N`` weights of aggregation ``step`` (0-based), each row summing to 1."""
    if step < a_iterations:
        high = a
    elif step - a_iterations < decay_iterations:
        high = float(np.linspace(a, b, decay_iterations)[step - a_iterations])
    else:
        high = 1.0  # the authors' schedule ends at 1 (their b is 1 too)
    w = np.where(assignment[None, :] == np.arange(cells)[:, None], math.exp(high), math.exp(b))
    return w / w.sum(axis=1, keepdims=True)


def private_cells(
    draws: torch.Tensor, weights: np.ndarray, q: float, clip: float, z: float, rng: np.random.Generator
) -> torch.Tensor:
    """The released ``cells x M`` vectors from the agents' ``N x M`` draws (module docstring). No agent
    sampled (rare): uniform random vectors, as the authors' code does."""
    cells, (N, M) = len(weights), draws.shape
    sampled = np.flatnonzero(rng.uniform(size=N) < q)
    if not len(sampled):
        return torch.as_tensor(rng.random((cells, M)), dtype=DTYPE)
    bound = clip / math.sqrt(cells)
    chosen = draws[sampled]
    clipped = chosen / (chosen.norm(dim=1, keepdim=True) / bound).clamp_min(1.0)
    w = torch.as_tensor(weights[:, sampled], dtype=DTYPE)
    sd = torch.as_tensor(weights.max(axis=1) * z * clip / q, dtype=DTYPE).unsqueeze(-1)
    return w @ clipped / q + sd * torch.as_tensor(rng.standard_normal((cells, M)), dtype=DTYPE)


def cell_of(X: torch.Tensor, bounds: torch.Tensor, per_dim: int) -> torch.Tensor:
    """The grid cell (row-major over the inputs, as the authors' partitions) of each row of ``X``."""
    u = ((X - bounds[0]) / (bounds[1] - bounds[0]) * per_dim).floor().clamp(0, per_dim - 1).long()
    radix = per_dim ** torch.arange(X.shape[-1] - 1, -1, -1)
    return (u * radix).sum(-1)


class DPFTSDE(FTS):
    """DP-FTS-DE (module docstring); ``q``, ``clip`` (S), ``z`` as the paper's, defaults its Landmine
    setting (q = 0.35, S = 22, z = 1, M = 100, a = 16, b = 1, 10 then 30 iterations); ``delta``: the
    δ of the ε in the history."""

    name = "dp-fts-de"

    def __init__(
        self, lengthscale: float, outputscale: float = 1.0, noise: float = 1e-3, *, q: float = 0.35,
        clip: float = 22.0, z: float = 1.0, per_dim: int = 2, a: float = 16.0, b: float = 1.0,
        a_iterations: int = 10, decay_iterations: int = 30, private: bool = True, delta: float = 1e-5,
        **options,
    ):  # fmt: skip
        super().__init__(lengthscale, outputscale, noise, **options)
        if not 0 < q <= 1 or not clip > 0 or not z >= 0:
            raise InputError(f"DPFTSDE: need 0 < q <= 1, clip > 0, z >= 0; got q={q}, clip={clip}, z={z}")
        if not 0 < delta < 1:
            raise InputError(f"DPFTSDE: need 0 < delta < 1, got delta={delta}")
        self.delta = float(delta)
        self.releases = 0
        self.q, self.clip, self.z, self.per_dim, self.private = (
            float(q),
            float(clip),
            float(z),
            per_dim,
            private,
        )
        self.schedule = (a, b, a_iterations, decay_iterations)
        self.cells: torch.Tensor | None = None

    def _share(self, loop, iteration: int) -> None:
        super()._share(loop, iteration)
        N, P = len(loop.owners), self.per_dim ** loop.owners[0].dim
        weights = de_weights(np.arange(N) % P, P, iteration, *self.schedule)
        draws = torch.stack(self.shared_weights)
        if not self.private:
            self.cells = torch.as_tensor(weights, dtype=DTYPE) @ draws
            return
        rng = generator(loop.seed, "dp-fts-de server", iteration)
        self.cells = private_cells(draws, weights, self.q, self.clip, self.z, rng)
        self.releases += 1

    def _spent(self) -> dict:
        """The ``epsilon`` history column: ε at ``delta`` of the releases so far (private runs only)."""
        return {"epsilon": epsilon_spent(self.z, self.q, self.releases, self.delta)} if self.private else {}

    def start(self, loop) -> dict:
        self.releases = 0
        super().start(loop)
        return self._spent()

    def update(self, loop, iteration: int) -> dict:
        super().update(loop, iteration)
        return self._spent()

    def resume(self, loop, iteration: int, folder, key=None) -> None:
        """As FTS resumes, with the releases so far counted: one at the start and one per iteration
        (the ε reported next composes them all)."""
        super().resume(loop, iteration, folder, key)
        self.releases = iteration + 1

    def propose(self, loop, iteration: int) -> list:
        out = []
        for k, owner in enumerate(loop.owners):
            rng = generator(loop.seed, "dp-fts-de propose", k, iteration)
            if rng.uniform() < 1.0 - 1.0 / iteration:
                f = self._own_draw(owner, rng)
            else:
                cells, shared, bounds = self.cells, self.shared, owner.bounds
                f = lambda X, c=cells, s=shared, b=bounds: (s(X) * c[cell_of(X, b, self.per_dim)]).sum(-1)  # noqa: E731
            out.append(maximise_draw(f, owner.bounds, int(rng.integers(2**31)), self.candidates))
        return out
