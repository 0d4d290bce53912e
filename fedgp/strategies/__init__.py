"""Strategy layer: federated algorithms as pure logic over hyper-parameter states."""

from fedgp.aggregators import CoordinateMedian, StateAggregator, WeightedMean
from fedgp.strategies import clustered
from fedgp.strategies.base import ClientOps, Replies, RoundPlan, ServerContext, Strategy, TrainResult
from fedgp.strategies.clustered import ClusteredGP, ClusteredState, MomentDescentInit
from fedgp.strategies.fgpr import FGPR
from fedgp.strategies.ifca import IFCA, IFCAState
from fedgp.strategies.local import SGD, Adam, LocalTraining

__all__ = [
    "FGPR",
    "IFCA",
    "IFCAState",
    "Strategy",
    "ClientOps",
    "RoundPlan",
    "Replies",
    "ServerContext",
    "TrainResult",
    "LocalTraining",
    "Adam",
    "SGD",
    "StateAggregator",
    "WeightedMean",
    "CoordinateMedian",
    "ClusteredGP",
    "ClusteredState",
    "MomentDescentInit",
    "clustered",
]
