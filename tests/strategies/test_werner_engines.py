"""Every new strategy and every aggregator runs on both engines with the same result, and through
bytes (loopback) bit for bit as in memory: nothing but records crosses the boundary."""

import math

import gpytorch
import pytest
import torch

import fedgp
from fedgp import GPSpec
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
from fedgp.clustering import FixedRadius, KMeansRadius, QuantileRadius
from fedgp.models import GaussianBumpMean
from fedgp.strategies import FGPR, FederatedClustering, MomentumClustering, MyopicClustering
from fedgp.synthetic import bump_federation, gp_federation

AGGREGATORS = [
    WeightedMean(),
    CoordinateMedian(),
    TrimmedMean(f=1),
    GeometricMedian(),
    Krum(f=1),
    MultiKrum(f=1, m=3),
    CenteredClipping(tau=0.5),
    ThresholdMean(),
    Bucketing(2, GeometricMedian()),
]


@pytest.mark.parametrize("rule", AGGREGATORS, ids=lambda r: type(r).__name__)
def test_fgpr_with_every_aggregator_agrees_across_engines(rule):
    draws = gp_federation(num_clients=7, n=25, d=2, seed=4)
    states = [
        fedgp.fit(
            draws.spec, draws.federation, FGPR(batch_size=8, aggregator=rule), engine=e, rounds=3, seed=2
        ).state
        for e in ("sequential", "batched")
    ]
    assert all(torch.allclose(states[0][k], states[1][k], rtol=1e-8) for k in states[0])


def bump_problem():
    data = bump_federation(clusters=2, clients_per_cluster=4, n=6, n_test=5, features=4, seed=3)
    ls, os_, noise = (
        "covar_module.base_kernel.lengthscale",
        "covar_module.outputscale",
        "likelihood.noise_covar.noise",
    )
    spec = GPSpec(
        kernel=gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()),
        mean=GaussianBumpMean(data.centres, data.width),
        initial_values={ls: 0.5, os_: 0.2, noise: 0.05, "mean_module.weights": torch.zeros(4, 1)},
    )
    return data, spec


STRATEGIES = {
    "fc": FederatedClustering(lr=0.05),
    "fc_groups_heavy_ball": FederatedClustering(
        lr=0.05, group_size=3, momentum=0.5, momentum_kind="heavy_ball"
    ),
    "fc_fixed_groups_joint_cd": FederatedClustering(
        lr=0.05, groups=(0, 0, 0, 0, 1, 1, 1, 1), blocks="joint", radius=KMeansRadius()
    ),
    "fc_oracle": FederatedClustering(lr=0.05, groups=(0, 1) * 4, radius=FixedRadius(math.inf), iterations=1),
    "mc": MomentumClustering(lr=0.05, num_clusters=2, radius=QuantileRadius(0.4)),
    "myopic": MyopicClustering(lr=0.05, num_clusters=2),
}


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_gradient_clustering_agrees_across_engines_and_through_bytes(name):
    data, spec = bump_problem()
    runs = {}
    engines = {
        ("sequential", False): fedgp.engines.Sequential(loopback=False),
        ("batched", False): fedgp.engines.Batched(loopback=False),
        ("batched", True): fedgp.engines.Batched(loopback=True),
    }
    for key, engine in engines.items():
        runs[key] = fedgp.fit(spec, data.federation, STRATEGIES[name], rounds=3, engine=engine, seed=1)
    a, b, c = runs.values()
    for k in a.state:
        assert torch.allclose(a.state[k], b.state[k], rtol=1e-8, atol=1e-12), k
        assert torch.equal(b.state[k], c.state[k]), k
    assert torch.allclose(torch.tensor(a.evaluate()["rmse"]), torch.tensor(b.evaluate()["rmse"]), rtol=1e-8)
