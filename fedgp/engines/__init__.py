"""Engines: who runs the clients' side of the rounds. ``sequential`` is the reference.

``fit(engine=...)`` takes a config — :class:`Sequential`, :class:`Batched`, :class:`Ray`, or
:class:`fedgp.flower.Flower` — a name, ``"auto"``, or an :class:`Engine`
(:mod:`fedgp.engines.config`).
"""

from fedgp.engines.base import Engine, InProcessEngine, faulted_ops
from fedgp.engines.config import (
    ENGINES,
    Batched,
    EngineConfig,
    Ray,
    Sequential,
    auto_engine,
    build_engine,
    engine_config,
)
from fedgp.engines.sequential import SequentialEngine, SequentialOps

__all__ = [
    "Engine",
    "InProcessEngine",
    "faulted_ops",
    "EngineConfig",
    "Sequential",
    "Batched",
    "Ray",
    "engine_config",
    "ENGINES",
    "auto_engine",
    "build_engine",
    "SequentialEngine",
    "SequentialOps",
]
