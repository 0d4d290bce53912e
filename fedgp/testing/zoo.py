"""Small runs of every strategy family, shared by the contracts and the project's pinned numbers."""

from __future__ import annotations

import gpytorch
import torch

from fedgp.models import GPSpec, ZeroKernel
from fedgp.strategies import FGPR, IFCA, LocalTraining, MomentDescentInit
from fedgp.strategies import clustered as C
from fedgp.synthetic import gaussian_mixed_regression, gp_federation

__all__ = ["strategy_zoo"]


def _gp_runs(gp, train: LocalTraining) -> dict:
    """FGPR, IFCA and the clustered GP on GP draws."""
    return {
        "fgpr_partial_sgd": (
            gp,
            FGPR(local_steps=3, batch_size=8, optimizer="sgd", lr=0.01, clients_per_round=4),
            4,
        ),
        "fgpr_raw_nearest_epochs": (
            gp,
            FGPR(local_epochs=1, batch_size=10, minibatch="nearest", average_space="raw", prox_mu=0.1),
            3,
        ),
        "fgpr_uniform_sampling": (gp, FGPR(clients_per_round=3, sampling="uniform", batch_size=8), 3),
        "ifca_model_restarts": (gp, IFCA(num_clusters=2, restarts=2, batch_size=8, local_steps=2), 3),
        "ifca_gradient": (
            gp,
            IFCA(num_clusters=2, aggregation="gradient", lr=0.1, gradient_batch_size=12),
            3,
        ),
        "clustered_soft": (
            gp,
            C.ClusteredGP(
                2, C.RandomInit(), C.SoftAssigner(2.0), C.LocalTrainingSolver(train), C.ClusterAverage()
            ),
            3,
        ),
        "clustered_oneshot_train": (
            gp,
            C.ClusteredGP(
                2,
                C.OneShotInit(local="train", training=train),
                C.FixedAssigner(),
                C.LocalTrainingSolver(train),
                C.ClusterAverage(),
            ),
            3,
        ),
    }


def _linear_runs(mr) -> dict:
    """The clustered strategies on mixed linear regression (Su–Xu–Yang, IFCA's gradient variant)."""
    return {
        "linear_one_shot": (mr, C.one_shot(2, lr=0.1), 4),
        "linear_ifca_gradient_cluster": (
            mr,
            C.ClusteredGP(
                2,
                C.RandomInit(),
                C.HardAssigner("sse"),
                C.GradientSolver(),
                C.GradientStep(0.1, "cluster", "squared_loss"),
            ),
            4,
        ),
        "linear_fedprox_soft": (
            mr,
            C.ClusteredGP(
                2,
                C.RandomInit(scale=0.5),
                C.SoftAssigner(),
                C.ProximalSolve(0.1, "squared_loss"),
                C.GlobalWeighted(),
            ),
            4,
        ),
        "linear_two_phase_orth_power": (
            mr,
            C.two_phase(
                2,
                lr=0.1,
                phase1=MomentDescentInit(
                    num_anchors=4,
                    iterations=2,
                    subspace="orth_iter",
                    orth_iters=4,
                    power_iters=5,
                    anchor_pool="all",
                ),
            ),
            None,
        ),
        "linear_two_phase_refill": (
            mr,
            C.two_phase(
                2,
                lr=0.1,
                phase1=MomentDescentInit(num_anchors=3, iterations=2, delta=100.0, anchor_pool="all"),
            ),
            None,
        ),
    }


def strategy_zoo() -> dict:
    """``{name: (data, spec, strategy, rounds)}``: a small run of every strategy family of fedgp, with
    the settings that exercise its less common paths (partial participation, raw averaging,
    gradient aggregation, soft and fixed assignment, Phase-1 refills)."""
    noise = "likelihood.noise_covar.noise"
    gp = gp_federation(num_clients=6, n=[20, 25, 30, 18, 22, 27], d=2, n_test=10, seed=3)
    mr = gaussian_mixed_regression(k=2, d=4, sizes=[6, 9, 12, 30, 30, 8, 5, 25, 30, 7], noise=0.2, seed=5)
    lin = GPSpec(
        kernel=ZeroKernel(),
        mean=gpytorch.means.LinearMean(4, bias=False),
        initial_values={noise: 0.04, "mean_module.weights": torch.zeros(4, 1)},  # LinearMean draws its own
        fixed=[noise],
    )
    train = LocalTraining(steps=3, batch_size=8)
    runs = {**_gp_runs(gp, train), **_linear_runs(mr)}
    return {
        name: (
            data,
            data.spec if hasattr(data, "spec") else lin,
            strategy,
            rounds or strategy.init_rounds + 3,
        )
        for name, (data, strategy, rounds) in runs.items()
    }
