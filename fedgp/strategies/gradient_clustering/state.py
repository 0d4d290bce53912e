"""The server state of the gradient-clustering strategies, and the names their messages use."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedgp.models.state import HyperState

__all__ = ["PersonalState", "STATE", "MODEL", "GRAD", "MOMENTUM", "CANDIDATES"]

#: Record prefix of a client's own state.
STATE = "state/"
#: Record prefix of the models a client evaluates.
MODEL = "model/"
#: Record prefix of a client's raw gradients.
GRAD = "grad/"
#: Record prefix of a client's momentum.
MOMENTUM = "momentum/"
#: Record prefix of every client's state, offered to a client the server has never seen.
CANDIDATES = "candidates/"


@dataclass
class PersonalState:
    """One state per client and what the update rule carries between rounds.

    ``states``: every client's personal state, batch ``(N,)``, constrained units; ``buffer``: the
    step's momentum buffer per client, raw ``(N, D)``; ``started``: whether it holds a value yet
    (the first step sets it, as in both of the authors' codes); ``momenta``: the clients' last
    momenta ``(N, D)`` (Momentum-Clustering); ``centres``: the cluster centres of each block
    (Momentum-Clustering, warm start); ``assignment``: each client's cluster per block ``(N, B)``
    (-1: none yet).
    """

    states: HyperState
    buffer: torch.Tensor
    started: torch.Tensor
    assignment: torch.Tensor
    momenta: torch.Tensor | None = None
    centres: list[torch.Tensor] | None = None
