"""Every strategy and every part of one travels as JSON and comes back the same."""

import json
import math

import gpytorch
import pytest
import torch

from fedgp import GPSpec
from fedgp import aggregators as A
from fedgp.aggregators import CoordinateMedian, WeightedMean
from fedgp.clustering import FixedRadius, KMeansRadius, QuantileRadius
from fedgp.errors import CodecError
from fedgp.messages import config_json, encode, from_config
from fedgp.models import ZeroKernel
from fedgp.strategies import (
    FGPR,
    IFCA,
    SGD,
    Adam,
    FederatedClustering,
    LocalTraining,
    MomentDescentInit,
    MomentumClustering,
    MyopicClustering,
    WeightedFGPR,
)
from fedgp.strategies import clustered as C


def _linear_states(k=2, d=3):
    spec = GPSpec(kernel=ZeroKernel(), mean=gpytorch.means.LinearMean(d, bias=False))
    return spec.initial_state().expand(k).clone()


STRATEGIES = {
    "fgpr": FGPR(),
    "fgpr_sgd_partial": FGPR(
        optimizer=SGD(lr=0.3, schedule="constant"), clients_per_round=3, sampling="uniform"
    ),
    "fgpr_median": FGPR(aggregator=CoordinateMedian("raw"), local_epochs=2, minibatch="nearest"),
    "fgpr_adam_instance": FGPR(optimizer=Adam(lr=0.01, betas=(0.8, 0.99))),
    "weighted_fgpr": WeightedFGPR(hf_weight=0.3),
    "ifca_model": IFCA(num_clusters=3, restarts=2),
    "ifca_gradient": IFCA(aggregation="gradient", gradient_batch_size=16, init="bernoulli"),
    "ifca_given": IFCA(init=_linear_states()),
    "fedavg": C.fedavg(),
    "ifca_preset": C.ifca(3, units="nll"),
    "oracle": C.oracle(_linear_states()),
    "one_shot": C.one_shot(2, initializer=C.OneShotInit(ridge=0.1)),
    "one_shot_train": C.ClusteredGP(
        2,
        C.OneShotInit(local="train", training=LocalTraining(steps=3)),
        C.FixedAssigner(),
        C.LocalTrainingSolver(),
    ),
    "fixed_labels": C.ClusteredGP(2, C.SpecInit(), C.FixedAssigner((0, 1, 1, 0))),
    "two_phase": C.two_phase(3),
    "two_phase_theta0": C.two_phase(
        2,
        phase1=MomentDescentInit(theta0=torch.tensor([0.5, -1.0, 2.0]), subspace="orth_iter", delta=1.0),
        solver=C.ProximalSolve(0.1, "squared_loss"),
    ),
    "soft_gradient": C.ClusteredGP(
        2,
        C.RandomInit("bernoulli", 0.5),
        C.SoftAssigner(2.0),
        C.GradientSolver(),
        C.GradientStep(0.1, "cluster"),
    ),
    "robust_clusters": C.ClusteredGP(
        2,
        aggregator=C.ClusterAverage(aggregator=CoordinateMedian()),
        clients_per_round=4,
        closed_form="never",
    ),
    "global_median": C.fedavg(aggregator=C.GlobalWeighted(aggregator=WeightedMean("raw"))),
    "fgpr_bucketing": FGPR(aggregator=A.Bucketing(3, A.MultiKrum(f=1, m=2), seed=4)),
    "fgpr_threshold": FGPR(aggregator=A.ThresholdMean(FixedRadius(math.inf), 2, "previous")),
    "fgpr_robust": FGPR(aggregator=A.CenteredClipping(0.3, 2, "constrained")),
    "cluster_trimmed": C.ClusteredGP(2, aggregator=C.ClusterAverage(aggregator=A.TrimmedMean(f=1))),
    "federated_clustering": FederatedClustering(
        lr=0.2,
        momentum=0.9,
        blocks=(("mean_module.",), ("covar_module.",)),
        radius=KMeansRadius(),
        groups=(0, 1),
    ),
    "federated_clustering_init": FederatedClustering(
        init=_linear_states(), group_size=3, radius=QuantileRadius(0.1)
    ),
    "momentum_clustering": MomentumClustering(num_clusters=3, alpha=0.2, radius=FixedRadius(2.0)),
    "myopic": MyopicClustering(num_clusters=4, blocks="joint"),
}


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_strategy_configs_are_json_and_round_trip(name):
    strategy = STRATEGIES[name]
    config = json.loads(json.dumps(strategy.to_config()))  # plain JSON, nothing else
    rebuilt = type(strategy).from_config(config)
    assert type(rebuilt) is type(strategy)
    assert config_json(rebuilt) == config_json(strategy)
    assert repr(rebuilt) == repr(strategy)


def test_configs_build_only_registered_classes():
    with pytest.raises(CodecError, match="type 'os:system' is not a registered or imported fedgp dataclass"):
        from_config({"type": "os:system", "params": {"command": "true"}})
    with pytest.raises(CodecError, match="unrecognised encoded entry"):
        from_config({"__reduce__": ["os.system", ["true"]]})
    with pytest.raises(TypeError, match="describes a Adam, not a FGPR"):
        FGPR.from_config(Adam().to_config())
    assert issubclass(CodecError, ValueError)


def test_config_json_layout():
    """Dataclasses are ``{"type", "params"}``, tensors inline ``{"__tensor__": {data, dtype, shape}}``,
    dicts ``{"__dict__": ...}``, tuples ``{"__tuple__": ...}``."""
    config = STRATEGIES["two_phase_theta0"].to_config()
    assert config["type"] == "fedgp.strategies.clustered.model:ClusteredGP"
    phase1 = config["params"]["initializer"]
    assert phase1["type"] == "fedgp.strategies.clustered.moment_descent:MomentDescentInit"
    assert phase1["params"]["theta0"] == {
        "__tensor__": {"data": [0.5, -1.0, 2.0], "dtype": "float32", "shape": [3]}
    }
    init = STRATEGIES["ifca_given"].to_config()["params"]["init"]["__hyperstate__"]
    weights = init["mean_module.weights"]["__tensor__"]
    assert weights["dtype"] == "float64" and weights["shape"] == [2, 3, 1] and len(weights["data"]) == 6
    adam = STRATEGIES["fgpr_adam_instance"].to_config()["params"]["optimizer"]
    assert adam == {
        "type": "fedgp.strategies.local:Adam",
        "params": {"lr": 0.01, "betas": {"__tuple__": [0.8, 0.99]}, "eps": 1e-08},
    }
    assert encode({"a": (1, torch.tensor([2]))}) == {
        "__dict__": {"a": {"__tuple__": [1, {"__tensor__": {"data": [2], "dtype": "int64", "shape": [1]}}]}}
    }
    assert from_config({"__dict__": {"a": {"__tuple__": [1, 2]}}}) == {"a": (1, 2)}
    assert from_config(adam) == Adam(lr=0.01, betas=(0.8, 0.99))


def test_a_clients_view_omits_other_clients_labels():
    strategy = STRATEGIES["fixed_labels"]
    assert strategy.to_config()["params"]["assigner"]["params"]["labels"] == {"__tuple__": [0, 1, 1, 0]}
    assert strategy.client_view().to_config()["params"]["assigner"]["params"]["labels"] is None


def test_federated_clustering_clients_never_see_the_fixed_groups():
    strategy = STRATEGIES["federated_clustering"]
    assert strategy.to_config()["params"]["groups"] == {"__tuple__": [0, 1]}
    assert strategy.client_view().to_config()["params"]["groups"] is None
