"""The clustered model's server state, and the names its messages use."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from fedgp.models.linear import LinearMeanModel
from fedgp.models.state import HyperState

__all__ = ["ClusteredState", "ClosedForm", "STATE", "TARGET", "CANDIDATES", "GRAD"]

#: Record prefix of a client's updated state(s).
STATE = "state/"
#: Record prefix of the state a client must update (fixed labels).
TARGET = "target/"
#: Record prefix of the k candidate states a client evaluates.
CANDIDATES = "candidates/"
#: Record prefix of a client's cluster-scattered gradient (a summed field).
GRAD = "grad/"


@dataclass
class ClusteredState:
    """Server state.

    ``states``: cluster states per restart ``(R, k)``; ``assignment``: each client's latest hard
    label per restart ``(R, K)`` (-1 before it took part); ``objective``: ``Σ_i n_i min_j F_i(θ_j)
    / Σ_i n_i`` per restart; ``labels``: fixed labels ``(K,)`` when the initialiser set them
    (one-shot); ``init``: the initialiser's progress while it is still running (``None`` after);
    ``phase_round``: rounds completed in the current phase; ``init_log``: what a multi-round
    initialiser left for diagnostics (Phase 1: its anchors and their estimates at every iteration).
    """

    states: HyperState
    assignment: torch.Tensor
    objective: torch.Tensor
    labels: torch.Tensor | None = None
    init: Any = None
    phase_round: int = 0
    init_log: Any = None

    @property
    def best(self) -> int:
        """The restart with the lowest training objective."""
        return int(torch.argmin(self.objective))

    @property
    def initialising(self) -> bool:
        """Whether the initialiser is still running its rounds."""
        return self.init is not None


@dataclass(frozen=True)
class ClosedForm:
    """A client's view of its spec for the closed forms: its linear mean (``None`` if the mean is
    not linear in its parameters) and whether the noise-only closed forms are used."""

    model: LinearMeanModel | None
    closed: bool
