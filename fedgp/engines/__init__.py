"""Engines: who runs the clients' side of the rounds. ``sequential`` is the reference."""

from fedgp.engines.base import Engine, InProcessEngine, Outcome, Registry
from fedgp.engines.checkpoint import Checkpoint, CheckpointError, load_checkpoint, save_checkpoint
from fedgp.engines.client import ClientFailure, SimulatedFailure
from fedgp.engines.sequential import SequentialEngine, SequentialOps

__all__ = [
    "Engine",
    "InProcessEngine",
    "Outcome",
    "Registry",
    "SequentialEngine",
    "SequentialOps",
    "ClientFailure",
    "SimulatedFailure",
    "Checkpoint",
    "CheckpointError",
    "load_checkpoint",
    "save_checkpoint",
]
