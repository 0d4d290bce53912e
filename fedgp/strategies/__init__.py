"""Strategy layer: federated algorithms as pure logic over hyper-parameter states."""

from fedgp.aggregators import CoordinateMedian, StateAggregator, WeightedMean
from fedgp.strategies import clustered, gradient_clustering
from fedgp.strategies.base import ClientOps, Replies, RoundPlan, ServerContext, Strategy, TrainResult
from fedgp.strategies.clustered import ClusteredGP, ClusteredState, MomentDescentInit
from fedgp.strategies.fgpr import FGPR
from fedgp.strategies.gradient_clustering import FederatedClustering, MomentumClustering, MyopicClustering
from fedgp.strategies.ifca import IFCA, IFCAState
from fedgp.strategies.local import SGD, Adam, LocalTraining

__all__ = [
    "FGPR",
    "FederatedClustering",
    "MomentumClustering",
    "MyopicClustering",
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
    "gradient_clustering",
]
