"""Engines: who runs the rounds. ``sequential`` is the reference."""

from fedgp.engines.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from fedgp.engines.sequential import SequentialEngine, SequentialOps

__all__ = ["SequentialEngine", "SequentialOps", "Checkpoint", "load_checkpoint", "save_checkpoint"]
