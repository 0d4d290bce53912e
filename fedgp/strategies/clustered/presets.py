"""Named configurations of the clustered GP: FedAvg, IFCA (Su–Xu–Yang's Phase-2 style), the oracle,
one-shot clustering and Su, Xu & Yang's two-phase algorithm."""

from __future__ import annotations

from fedgp.models.state import HyperState
from fedgp.strategies.clustered.aggregate import Aggregator, ClusterAverage, GlobalWeighted
from fedgp.strategies.clustered.assign import Assigner, FixedAssigner, HardAssigner
from fedgp.strategies.clustered.init import GivenInit, Initializer, OneShotInit, RandomInit, SpecInit
from fedgp.strategies.clustered.model import ClusteredGP
from fedgp.strategies.clustered.moment_descent import MomentDescentInit
from fedgp.strategies.clustered.solve import GradientDescent, LocalSolver

__all__ = ["fedavg", "ifca", "oracle", "one_shot", "two_phase"]


def _phase2(lr, local_steps, units, solver, aggregator):
    solver = solver if solver is not None else GradientDescent(lr=lr, steps=local_steps, units=units)
    aggregator = aggregator if aggregator is not None else GlobalWeighted()
    return solver, aggregator


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
    **options,
) -> ClusteredGP:
    """IFCA as Su–Xu–Yang run it ("the same as Phase 2" from a random start): random init, hard
    assignment by local likelihood, s local steps, global n_i/N weighting. For the original IFCA
    (model or gradient averaging within clusters, restarts) use :class:`~fedgp.strategies.IFCA`."""
    solver, aggregator = _phase2(lr, local_steps, units, solver, aggregator)
    return ClusteredGP(
        num_clusters, initializer or RandomInit(), assigner or HardAssigner(), solver, aggregator, **options
    )


def oracle(states: HyperState, lr: float = 0.05, local_steps: int = 5, units: str = "squared_loss", **kw):
    """Oracle iterative clustering: IFCA started at the true cluster states (infeasible; a reference)."""
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
    **options,
) -> ClusteredGP:
    """Su, Xu & Yang's two-phase algorithm: Phase 1 federated moment descent
    (:class:`~fedgp.strategies.moment_descent.MomentDescentInit`), then Phase 2 — hard assignment
    by local loss, FedAvg (s local steps) or FedProx (``solver=ProximalSolve(...)``), and the global
    n_i/N aggregation."""
    solver, aggregator = _phase2(lr, local_steps, units, solver, aggregator)
    return ClusteredGP(
        num_clusters,
        phase1 if phase1 is not None else MomentDescentInit(),
        assigner or HardAssigner(),
        solver,
        aggregator,
        **options,
    )
