"""Strategy layer: federated algorithms as pure logic over hyper-parameter states."""

from fedgp.strategies.base import ClientOps, RoundPlan, ServerContext, Strategy, TrainResult
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
    "ServerContext",
    "TrainResult",
    "LocalTraining",
    "Adam",
    "SGD",
]
