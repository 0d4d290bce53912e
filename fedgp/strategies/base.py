"""The strategy interface: an algorithm as pure logic over states, independent of the engine.

A round has three parts, in the spirit of Flower's configure/aggregate hooks:

1. ``configure`` (server): pick the participating clients and the payload they receive.
2. ``local_update`` (client): given a :class:`ClientOps` for a *batch* of clients and the payload,
   compute the reply. ``ClientOps`` is provided by the engine; it evaluates, differentiates and
   trains states on the clients' data. The sequential engine passes batches of one client, the
   batched engine batches of many, a Flower node its own single client; strategy code is the same.
3. ``aggregate`` (server): combine the replies into the next server state.

Replies are dicts of tensors / :class:`HyperState` values whose first dimension runs over the
participants, in the order of ``RoundPlan.participants`` (duplicates included).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from fedgp.data.client import ClientData
from fedgp.models.spec import GPSpec
from fedgp.models.state import HyperState
from fedgp.strategies.local import LocalTraining

__all__ = [
    "ClientOps",
    "TrainResult",
    "ServerContext",
    "RoundPlan",
    "Strategy",
    "Reply",
    "concat_replies",
    "index_reply",
    "sample_participants",
    "average_states",
]

Reply = dict[str, Any]


@dataclass(frozen=True)
class TrainResult:
    """What ``ClientOps.train`` returns: the trained states and the mean minibatch loss."""

    states: HyperState  # batch (B, *extra), constrained units
    loss: torch.Tensor  # (B, *extra): mean per-point minibatch NLL over the local steps
    steps: torch.Tensor  # (B,): local steps taken


class ClientOps(Protocol):
    """Engine-provided operations on the data of a batch of B clients (never exposes the data).

    States passed in have batch shape ``(B, *extra)``: one or more states per client.
    """

    indices: torch.Tensor  # (B,) positions of these clients in the federation
    sizes: torch.Tensor  # (B,) their training-set sizes
    round: int
    # The clients' own data, for local computations other than the GP likelihood (e.g. the
    # moment statistics of Su–Xu–Yang's Phase 1). It is read on the client; only what a
    # strategy puts in its reply ever leaves it.
    clients: Sequence[ClientData]

    def nll(self, states: HyperState) -> torch.Tensor:
        """Per-point exact NLL of each client's full local data under each state: ``(B, *extra)``."""

    def gradient(self, states: HyperState, batch_size: int | None = None) -> tuple[torch.Tensor, HyperState]:
        """Per-point NLL and its gradient w.r.t. the raw trainable parameters (full data, or one
        random minibatch of ``batch_size``). Gradients of fixed parameters are zero."""

    def train(self, states: HyperState, local: LocalTraining) -> TrainResult:
        """Run ``local`` from each state; every extra state of a client sees the same minibatches."""


@dataclass(frozen=True)
class ServerContext:
    """What the server knows: the spec, client sizes/weights/ids, and the master seed."""

    spec: GPSpec
    sizes: torch.Tensor
    weights: torch.Tensor
    ids: Sequence[Any]
    seed: int

    @property
    def num_clients(self) -> int:
        return len(self.sizes)


@dataclass(frozen=True)
class RoundPlan:
    """Participants of a round (may repeat), their aggregation weights, and the broadcast payload."""

    participants: torch.Tensor
    weights: torch.Tensor
    payload: Any


class Strategy(ABC):
    """Base class of federated algorithms. Subclasses are frozen dataclasses of settings."""

    @abstractmethod
    def initialize(self, ctx: ServerContext, rng: np.random.Generator) -> Any:
        """The server state before round 1."""

    @abstractmethod
    def configure(self, rnd: int, server: Any, ctx: ServerContext, rng: np.random.Generator) -> RoundPlan:
        """Choose participants and payload for round ``rnd`` (0-based)."""

    @abstractmethod
    def local_update(self, ops: ClientOps, payload: Any) -> Reply:
        """The clients' side of a round."""

    @abstractmethod
    def aggregate(
        self, rnd: int, server: Any, plan: RoundPlan, replies: Reply, ctx: ServerContext
    ) -> tuple[Any, dict[str, float]]:
        """The next server state, and round metrics for the history."""

    @abstractmethod
    def personal_state(self, server: Any, ops: ClientOps) -> HyperState:
        """The state each client of ``ops`` conditions on to predict: batch ``(B,)``."""

    @abstractmethod
    def global_state(self, server: Any) -> HyperState:
        """The learned hyper-parameters a user inspects (``FitResult.state``)."""

    def describe(self, server: Any) -> dict[str, float]:
        """History columns for the server state (default: the global state's values)."""
        state = self.global_state(server)
        if state.batch_shape:
            return {
                f"{j}/{k}": v
                for j in range(state.batch_shape[0])
                for k, v in state.index(j).to_dict().items()
            }
        return state.to_dict()


# -- helpers shared by strategies ---------------------------------------------------------------


def concat_replies(parts: Sequence[Reply]) -> Reply:
    """Concatenate replies of consecutive client batches along the participant dimension."""
    out: Reply = {}
    for key in parts[0]:
        values = [p[key] for p in parts]
        if isinstance(values[0], HyperState):
            out[key] = HyperState.cat(values)
        else:
            out[key] = torch.cat(values, 0)
    return out


def index_reply(reply: Reply, idx: torch.Tensor) -> Reply:
    return {k: (v.index(idx) if isinstance(v, HyperState) else v[idx]) for k, v in reply.items()}


def sample_participants(
    ctx: ServerContext, clients_per_round: int | None, sampling: str, rng: np.random.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Participants and aggregation weights, as in FGPR §2.2.

    * ``clients_per_round=None``: everyone, weights ``p_k`` (synchronous FedAvg).
    * ``sampling="weighted"``: ``K_c`` draws with replacement, probability ``p_k``, then a simple
      average counting duplicates (Li et al. 2019's scheme I; unbiased, as the FGPR proof uses).
    * ``sampling="uniform"``: ``K_c`` distinct clients uniformly, weights ``p_k`` renormalised.
    """
    n = ctx.num_clients
    if clients_per_round is None:
        return torch.arange(n), ctx.weights.clone()
    if not 1 <= clients_per_round <= n and sampling == "uniform":
        raise ValueError(f"clients_per_round must be in [1, {n}] for uniform sampling")
    if clients_per_round < 1:
        raise ValueError("clients_per_round must be >= 1")
    if sampling == "weighted":
        chosen = torch.from_numpy(rng.choice(n, size=clients_per_round, replace=True, p=ctx.weights.numpy()))
        return chosen, torch.full((clients_per_round,), 1.0 / clients_per_round, dtype=torch.float64)
    if sampling == "uniform":
        chosen = torch.from_numpy(np.sort(rng.choice(n, size=clients_per_round, replace=False)))
        w = ctx.weights[chosen]
        return chosen, w / w.sum()
    raise ValueError(f"sampling must be 'weighted' or 'uniform', got {sampling!r}")


def average_states(
    spec: GPSpec, states: HyperState, weights: torch.Tensor, previous: HyperState, space: str
) -> HyperState:
    """``sum_i w_i θ_i`` over the first batch dimension, in constrained or raw units.

    Fixed (untrained) parameters are copied from ``previous`` so that averaging never perturbs them.
    """
    if space == "constrained":
        mean = states.weighted_mean(weights)
    elif space == "raw":
        mean = spec.from_raw(spec.to_raw(states).weighted_mean(weights))
    else:
        raise ValueError(f"average_space must be 'constrained' or 'raw', got {space!r}")
    return HyperState(
        {p.name: (mean[p.name] if p.trainable else previous[p.name]) for p in spec.params},
        spec.event_shapes,
    )
