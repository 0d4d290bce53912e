"""Every strategy family of fedgp passes the shipped strategy contract (fedgp.testing.StrategyContract):
records only, the declared reply table, determinism, and no client seeing another's rows."""

from dataclasses import dataclass

import gpytorch
import pytest
import torch

from fedgp.aggregators import CoordinateMedian
from fedgp.models import GPSpec, ZeroKernel
from fedgp.strategies import (
    DPFGPR,
    FGPR,
    IFCA,
    FederatedClustering,
    LocalTraining,
    MomentDescentInit,
    MomentumClustering,
    MyopicClustering,
)
from fedgp.strategies import clustered as C
from fedgp.synthetic import gaussian_mixed_regression
from fedgp.testing.engine import Saboteur
from fedgp.testing.strategy import StrategyContract

TRAINED = {"state/*": "individual", "loss": "individual"}
CLUSTERED = {"choice": "individual", "nll": "individual"}


class TestFGPRContract(StrategyContract):
    strategy = FGPR()
    expected_replies = TRAINED


class TestFGPRRobustPartialContract(StrategyContract):
    """A robust rule, and sampling with replacement (a client may fill two slots)."""

    strategy = FGPR(local_steps=2, batch_size=8, clients_per_round=4, aggregator=CoordinateMedian())
    expected_replies = TRAINED


class TestFGPRPersonalContract(StrategyContract):
    """Personal noise and outputscale: kept by the owners, in no reply."""

    strategy = FGPR(local_steps=2, batch_size=8, personal=("noise", "covar_module.raw_outputscale"))
    expected_replies = TRAINED


class TestDPFGPRPersonalContract(StrategyContract):
    """Client-level DP with personal noise and outputscale: only the shared update, clipped, summed."""

    strategy = DPFGPR(
        FGPR(local_steps=2, batch_size=8, personal=("noise", "covar_module.raw_outputscale")),
        clip=0.5,
        noise=0.5,
        reproducible=True,
        noise_at="clients",
        noise_shares=2,
    )
    expected_replies = {"update/*": "summed"}


class TestIFCAModelAveragingContract(StrategyContract):
    strategy = IFCA(num_clusters=2, restarts=2, local_steps=2, batch_size=8)
    expected_replies = {**CLUSTERED, **TRAINED}


class TestIFCAGradientContract(StrategyContract):
    """Gradients and cluster counts travel only as sums."""

    strategy = IFCA(num_clusters=2, aggregation="gradient", lr=0.1, gradient_batch_size=8)
    expected_replies = {**CLUSTERED, "grad/*": "summed", "members": "summed"}


class TestClusteredSoftContract(StrategyContract):
    strategy = C.ClusteredGP(
        2,
        C.RandomInit(),
        C.SoftAssigner(2.0),
        C.LocalTrainingSolver(LocalTraining(steps=2, batch_size=8)),
        C.ClusterAverage(),
    )
    expected_replies = {**CLUSTERED, "resp": "individual", **TRAINED}


@pytest.mark.filterwarnings("ignore:Phase 1 merged the anchors")  # this data set makes Phase 1 refill
class TestTwoPhaseContract(StrategyContract):
    """Su–Xu–Yang on mixed linear regression: Phase 1's moments and their weights are summed, the
    anchors' and the refill's fits individual; Phase 2 is hard-assignment FedAvg."""

    strategy = C.two_phase(
        2, lr=0.1, phase1=MomentDescentInit(num_anchors=3, iterations=2, delta=100.0, anchor_pool="all")
    )
    rounds = strategy.init_rounds + 1  # every Phase-1 stage, then one Phase-2 round
    expected_replies = {
        "moment": "summed",
        "weight": "summed",
        "theta": "individual",
        "sigma_hat": "individual",
        "moved": "individual",
        "fit": "individual",
        "estimate": "individual",
        **CLUSTERED,
        "state/*": "individual",
    }

    def make_data(self):
        noise = "likelihood.noise_covar.noise"
        spec = GPSpec(
            kernel=ZeroKernel(),
            mean=gpytorch.means.LinearMean(4, bias=False),
            initial_values={noise: 0.04, "mean_module.weights": torch.zeros(4, 1)},
            fixed=[noise],
        )
        data = gaussian_mixed_regression(
            k=2, d=4, sizes=[6, 9, 12, 30, 30, 8, 5, 25, 30, 7], noise=0.2, seed=5
        )
        return spec, data.federation


class TestFederatedClusteringContract(StrategyContract):
    """Random groups: each client gets its group's models and returns its gradients at each."""

    strategy = FederatedClustering(lr=0.05, group_size=3)
    expected_replies = {"grad/*": "individual", "loss": "individual"}


class TestMomentumClusteringContract(StrategyContract):
    strategy = MomentumClustering(lr=0.05)
    expected_replies = {"momentum/*": "individual", "loss": "individual"}


class TestMyopicClusteringContract(StrategyContract):
    strategy = MyopicClustering(lr=0.05)
    expected_replies = {"momentum/*": "individual", "loss": "individual"}


# -- the contract catches strategies that break it ----------------------------------------------------


@dataclass(frozen=True)
class PeekingFGPR(FGPR):
    """Adds the mean target of every client in its batch to each loss: a leak that only shows when
    an engine runs several clients together."""

    def local_update(self, ops, task):
        reply = super().local_update(ops, task)
        reply["loss"] = reply["loss"] + torch.stack([c.y.mean() for c in ops.clients]).mean()
        return reply


@dataclass(frozen=True)
class JitteryFGPR(FGPR):
    """Aggregates with a draw from torch's global generator, which no seed of the run controls."""

    def aggregate(self, rnd, server, plan, replies, ctx):
        new, metrics = super().aggregate(rnd, server, plan, replies, ctx)
        return new.map(lambda v, e: v * (1 + 1e-6 * torch.rand(()))), metrics


def contract_for(strategy, expected=TRAINED):
    """A contract case (not collected) for ``strategy``, its data and its reference run."""
    case = type(
        "Case", (StrategyContract,), {"strategy": strategy, "expected_replies": expected, "rounds": 2}
    )()
    problem = case.make_data()
    return case, problem, case._run_rounds(*problem)


def test_the_contract_catches_a_client_reading_other_clients_targets():
    case, problem, trace = contract_for(PeekingFGPR(local_steps=1, batch_size=8))
    case.test_every_reply_passes_its_declaration(trace, problem)  # one client at a time: no sign
    with pytest.raises(AssertionError, match="changed other clients' \\['loss'\\]"):
        case.test_other_clients_targets_never_reach_a_reply(trace, problem)
    with pytest.raises(AssertionError, match="'loss' changed"):
        case.test_a_reply_does_not_depend_on_who_else_takes_part(trace, problem)


def test_the_contract_catches_a_wrong_or_stale_reply_table():
    case, _, trace = contract_for(
        FGPR(local_steps=1, batch_size=8), {"state/*": "individual", "loss": "summed"}
    )
    with pytest.raises(AssertionError, match="'loss' is individual"):
        case.test_declared_replies_match_the_table(trace)
    case, _, trace = contract_for(FGPR(local_steps=1, batch_size=8), {**TRAINED, "extra/*": "summed"})
    with pytest.raises(AssertionError, match="extra"):
        case.test_declared_replies_match_the_table(trace)
    case, _, trace = contract_for(FGPR(local_steps=1, batch_size=8), {"state/*": "individual"})
    with pytest.raises(AssertionError, match="'loss' .* not in expected_replies"):
        case.test_declared_replies_match_the_table(trace)


def test_the_contract_catches_a_reply_that_fails_its_declaration():
    case, problem, trace = contract_for(Saboteur(local_steps=1, batch_size=8, victim=1, how="nan"))
    with pytest.raises(AssertionError, match="client 1's reply fails its declaration: field 'loss' is not"):
        case.test_every_reply_passes_its_declaration(trace, problem)


def test_the_contract_catches_an_unseeded_draw():
    case = contract_for(JitteryFGPR(local_steps=1, batch_size=8, server_optimizer=None))[0]  # a bare state
    with pytest.raises(AssertionError, match="covar_module|likelihood"):
        case.test_same_seed_same_fit(case.make_data())
