"""Named configurations of the clustered GP: FedAvg, IFCA (Su–Xu–Yang's Phase-2 style), the oracle,
one-shot clustering and Su, Xu & Yang's two-phase algorithm.

``weighting`` (:func:`ifca`, :func:`oracle`, :func:`two_phase`) chooses Phase 2's aggregation:

* ``"global"`` (the paper): ``θ_j ← Σ_i (n_i/N) θ_ij`` over all clients, a client outside cluster j
  returning ``θ_j`` unchanged (:class:`GlobalWeighted`), so cluster j moves by ``N_j/N`` of its
  members' average change: Theorem 2's contraction ``1 − C₁ s η ρ/κ`` per round with
  ``ρ = min_j N_j/N``, and a cluster holding 4 % of the data needs about 25× the rounds of one
  holding all of it.
* ``"cluster"``: ``θ_j ← Σ_{i∈Ŝ_j} (n_i/N̂_j) θ_ij`` over the clients assigned to j
  (:class:`ClusterAverage`, size-weighted; a cluster nobody chose keeps its state). Lemma 1's
  recursion becomes ``θ_j − (η/N̂_j) Σ_{i∈Ŝ_j} φ_iᵀ P_i (φ_i θ_j − y_i)``: the paper's with η
  scaled by ``N/N̂_j`` for cluster j, i.e. each cluster's own gradient descent on its own data. The
  fixed points are the same (``Σ_{i∈Ŝ_j} n_i (θ_ij − θ_j) = 0``), Lemma 7's bounds on ``K_j`` lose
  their ``N_j/N`` factor, so the contraction becomes ``1 − C₁ s η/κ`` for every cluster under the
  same condition ``η ≲ 1/s``, while the misclustering term (Lemma 2) is divided by ``N_j`` instead
  of ``N``: the error floor keeps its order ``(σκ/ρ) ν log(e/ν)`` and the condition
  ``ν log(e/ν) ≲ ρ/κ`` is unchanged. ``results/two_phase_unbalanced.md`` measures both.
"""

from __future__ import annotations

from fedgp.errors import InputError
from fedgp.models.state import HyperState
from fedgp.strategies.clustered.aggregate import Aggregator, ClusterAverage, GlobalWeighted
from fedgp.strategies.clustered.assign import Assigner, FixedAssigner, HardAssigner
from fedgp.strategies.clustered.init import GivenInit, Initializer, OneShotInit, RandomInit, SpecInit
from fedgp.strategies.clustered.model import ClusteredGP
from fedgp.strategies.clustered.moment_descent import MomentDescentInit
from fedgp.strategies.clustered.solve import GradientDescent, LocalSolver

__all__ = ["fedavg", "ifca", "oracle", "one_shot", "two_phase"]


WEIGHTINGS = ("global", "cluster")


def _phase2(lr, local_steps, units, solver, aggregator, weighting="global"):
    solver = solver if solver is not None else GradientDescent(lr=lr, steps=local_steps, units=units)
    if weighting not in WEIGHTINGS:
        raise InputError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")
    if aggregator is not None:
        if weighting != "global":
            raise InputError("give weighting or an aggregator, not both (weighting picks the aggregator)")
        return solver, aggregator
    return solver, GlobalWeighted() if weighting == "global" else ClusterAverage(weighted=True)


def fedavg(
    lr: float = 0.05,
    local_steps: int = 5,
    units: str = "squared_loss",
    initializer: Initializer | None = None,
    solver: LocalSolver | None = None,
    aggregator: Aggregator | None = None,
    **options,
) -> ClusteredGP:
    """Vanilla FedAvg: one component (k = 1), s local gradient steps, size-weighted averaging."""
    solver, aggregator = _phase2(lr, local_steps, units, solver, aggregator)
    return ClusteredGP(1, initializer or SpecInit(), HardAssigner(), solver, aggregator, **options)


def ifca(
    num_clusters: int,
    lr: float = 0.05,
    local_steps: int = 5,
    units: str = "squared_loss",
    initializer: Initializer | None = None,
    assigner: Assigner | None = None,
    solver: LocalSolver | None = None,
    aggregator: Aggregator | None = None,
    weighting: str = "global",
    **options,
) -> ClusteredGP:
    """IFCA as Su–Xu–Yang run it ("the same as Phase 2" from a random start): random init, hard
    assignment by local likelihood, s local steps, global n_i/N weighting (``weighting="cluster"``:
    within-cluster, see the module docstring). For the original IFCA (model or gradient averaging
    within clusters, restarts) use :class:`~fedgp.strategies.IFCA`."""
    solver, aggregator = _phase2(lr, local_steps, units, solver, aggregator, weighting)
    return ClusteredGP(
        num_clusters, initializer or RandomInit(), assigner or HardAssigner(), solver, aggregator, **options
    )


def oracle(
    states: HyperState, lr: float = 0.05, local_steps: int = 5, units: str = "squared_loss", **kw
) -> ClusteredGP:
    """Oracle iterative clustering: IFCA started at the true cluster states (infeasible; a reference).
    ``weighting`` and the other options as :func:`ifca`'s."""
    return ifca(states.batch_shape[-1], lr, local_steps, units, initializer=GivenInit(states), **kw)


def one_shot(
    num_clusters: int,
    lr: float = 0.05,
    local_steps: int = 5,
    units: str = "squared_loss",
    initializer: OneShotInit | None = None,
    solver: LocalSolver | None = None,
    aggregator: Aggregator | None = None,
    **options,
) -> ClusteredGP:
    """One-shot clustering: local fits, k-means once, then FedAvg within each (fixed) cluster."""
    solver = solver if solver is not None else GradientDescent(lr=lr, steps=local_steps, units=units)
    return ClusteredGP(
        num_clusters,
        initializer or OneShotInit(),
        FixedAssigner(),
        solver,
        aggregator or ClusterAverage(weighted=True),
        **options,
    )


def two_phase(
    num_clusters: int,
    lr: float = 0.05,
    local_steps: int = 5,
    units: str = "squared_loss",
    phase1=None,
    assigner: Assigner | None = None,
    solver: LocalSolver | None = None,
    aggregator: Aggregator | None = None,
    weighting: str = "global",
    **options,
) -> ClusteredGP:
    """Su, Xu & Yang's two-phase algorithm: Phase 1 federated moment descent
    (:class:`~fedgp.strategies.moment_descent.MomentDescentInit`), then Phase 2 — hard assignment
    by local loss, FedAvg (s local steps) or FedProx (``solver=ProximalSolve(...)``), and the
    aggregation ``weighting``: ``"global"`` (the paper's n_i/N) or ``"cluster"`` (n_i/N_j within
    each cluster, so a small cluster is not slowed by its share; module docstring)."""
    solver, aggregator = _phase2(lr, local_steps, units, solver, aggregator, weighting)
    return ClusteredGP(
        num_clusters,
        phase1 if phase1 is not None else MomentDescentInit(),
        assigner or HardAssigner(),
        solver,
        aggregator,
        **options,
    )
