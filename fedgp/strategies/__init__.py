"""Strategy layer: federated algorithms as pure logic over hyper-parameter states."""

from fedgp.strategies import clustered
from fedgp.strategies.base import ClientOps, RoundPlan, ServerContext, Strategy, TrainResult
from fedgp.strategies.clustered import ClusteredGP, ClusteredState
from fedgp.strategies.fgpr import FGPR
from fedgp.strategies.ifca import IFCA, IFCAState
from fedgp.strategies.local import SGD, Adam, LocalTraining
from fedgp.strategies.moment_descent import MomentDescentInit

__all__ = [
    "FGPR",
    "IFCA",
    "IFCAState",
    "Strategy",
    "ClientOps",
    "RoundPlan",
    "ServerContext",
    "TrainResult",
    "LocalTraining",
    "Adam",
    "SGD",
    "ClusteredGP",
    "ClusteredState",
    "MomentDescentInit",
    "clustered",
]
