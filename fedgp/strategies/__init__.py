"""Strategy layer: federated algorithms as pure logic over hyper-parameter states.

A strategy talks to its clients in the protocol of :mod:`fedgp.messages` (``RoundPlan``,
``Replies``, ``ServerContext``) and combines replies with the rules of :mod:`fedgp.aggregators`.
"""

from fedgp.strategies import clustered, gradient_clustering
from fedgp.strategies.asynchronous import Asynchronous, AsyncServer
from fedgp.strategies.base import ClientOps, Strategy, TrainResult
from fedgp.strategies.clustered import ClusteredGP, ClusteredState, MomentDescentInit
from fedgp.strategies.fgpr import FGPR
from fedgp.strategies.gradient_clustering import FederatedClustering, MomentumClustering, MyopicClustering
from fedgp.strategies.ifca import IFCA, IFCAState
from fedgp.strategies.local import SGD, Adam, LocalTraining
from fedgp.strategies.memory import ClientMemory
from fedgp.strategies.private import DPFGPR
from fedgp.strategies.schedules import CosineDecay, InverseRound, LRSchedule, StepDecay
from fedgp.strategies.server import FedAdam, FedAvgM, FedYogi, ServerOptimizer, ServerState
from fedgp.strategies.shrinkage import Shrinkage
from fedgp.strategies.speeds import LogUniform, SpeedDraw
from fedgp.strategies.staleness import Constant, Hinge, Polynomial, StalenessWeight
from fedgp.strategies.weighted import WeightedFGPR

__all__ = [
    "FGPR",
    "WeightedFGPR",
    "DPFGPR",
    "Asynchronous",
    "AsyncServer",
    "StalenessWeight",
    "Polynomial",
    "Hinge",
    "Constant",
    "SpeedDraw",
    "LogUniform",
    "FederatedClustering",
    "MomentumClustering",
    "MyopicClustering",
    "IFCA",
    "IFCAState",
    "Strategy",
    "ClientOps",
    "TrainResult",
    "ClientMemory",
    "Shrinkage",
    "LocalTraining",
    "Adam",
    "SGD",
    "ServerOptimizer",
    "ServerState",
    "FedAvgM",
    "FedAdam",
    "FedYogi",
    "LRSchedule",
    "InverseRound",
    "CosineDecay",
    "StepDecay",
    "ClusteredGP",
    "ClusteredState",
    "MomentDescentInit",
    "clustered",
    "gradient_clustering",
]
