"""The strategy interface: an algorithm as pure logic over states, talking to clients in records.

A round has three parts, in the spirit of Flower's configure/aggregate hooks:

1. ``configure`` (server): pick the participants, their aggregation weights and what they receive —
   a shared :class:`~fedgp.messages.Record` and one personal row each — and declare the reply
   fields (:class:`~fedgp.messages.Field`: shape, dtype, individual or summed).
2. ``local_update`` (client): given a :class:`ClientOps` for a *batch* of clients and the round's
   :class:`~fedgp.messages.Task`, return the reply tensors (one row per client). ``ClientOps`` is the
   engine's: it evaluates, differentiates and trains states on the clients' own data. The
   sequential engine passes batches of one client, the batched engine batches of many, a Flower
   node its own client; strategy code is the same.
3. ``aggregate`` (server): combine the :class:`Replies` that arrived — individual fields per
   participant, summed fields only as sums — into the next server state.

For prediction and evaluation, ``configure_personal`` (server) tells each client what it needs to
choose the state it conditions on, and ``personal_state`` (client) chooses it. Predictions,
``FitResult.client_state`` and per-client test metrics all go through this one pair.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from fedgp.data.client import ClientData
from fedgp.errors import InputError
from fedgp.messages import Configurable, Field, Record, Replies, RoundPlan, ServerContext, Task, read_state
from fedgp.models.posterior import Prediction
from fedgp.models.spec import GPSpec
from fedgp.models.state import HyperState
from fedgp.strategies.local import LocalTraining
from fedgp.strategies.memory import ClientMemory
from fedgp.strategies.surface import AttackSurface

__all__ = [
    "COLD_START",
    "given_or_best_state",
    "ClientOps",
    "TrainResult",
    "Strategy",
    "sample_participants",
]


@dataclass(frozen=True)
class TrainResult:
    """What ``ClientOps.train`` returns: the trained states and the mean minibatch loss."""

    states: HyperState  # batch (B, *extra), constrained units
    loss: torch.Tensor  # (B, *extra): mean per-point minibatch NLL over the local steps
    steps: torch.Tensor  # (B,): local steps taken


class ClientOps(Protocol):
    """Engine-provided operations on the data of a batch of B clients: the client side of a round.

    States passed in have batch shape ``(B, *extra)``: one or more states per client.
    """

    spec: GPSpec  # the clients' own model specification
    indices: torch.Tensor  # (B,) the clients' keys (their positions in the engine's registry)
    sizes: torch.Tensor  # (B,) their training-set sizes
    round: int
    seed: int  # the master seed: client-side draws are functions of (seed, stream, round, key)
    # The clients' own data, for local computations other than the GP likelihood (e.g. the
    # moment statistics of Su–Xu–Yang's Phase 1). Only what a strategy replies ever leaves.
    clients: Sequence[ClientData]
    # What these clients keep between tasks, never sent (fedgp.strategies.memory): set by an engine
    # that keeps it for a strategy that keeps anything (else None); read it with memory_of(ops),
    # which gives an empty one where none is kept.
    memory: ClientMemory | None

    def nll(self, states: HyperState) -> torch.Tensor:
        """Per-point exact NLL of each client's full local data under each state: ``(B, *extra)``."""

    def gradient(self, states: HyperState, batch_size: int | None = None) -> tuple[torch.Tensor, HyperState]:
        """Per-point NLL and its gradient w.r.t. the raw trainable parameters (full data, or one
        random minibatch of ``batch_size``). Gradients of fixed parameters are zero."""

    def train(self, states: HyperState, local: LocalTraining) -> TrainResult:
        """Run ``local`` from each state; every extra state of a client sees the same minibatches."""

    def predict(
        self, states: HyperState, X_new: torch.Tensor | None = None, full_cov: bool = False
    ) -> list[Prediction]:
        """Condition each client's state (batch ``(B,)``) on its training data; predict at its test
        inputs, or at ``X_new`` (with ``full_cov``, also the joint covariance of f there)."""


#: Shared field of a "choose" personal task: the candidate a client without data conditions on.
COLD_START = "cold_start"


def given_or_best_state(
    ops: ClientOps, task: Task, given: str, state: str, candidates: str
) -> tuple[HyperState, torch.Tensor]:
    """A personal task's state for each client of ``ops``: its own row's state (prefix ``state``)
    when the task's ``personal`` setting is ``given``; otherwise the shared candidate (prefix
    ``candidates``) its ``cluster`` names, or where that is -1 (a client never seen in training)
    the candidate with the lowest NLL on its own data. A client with no data at all (a cold
    start) cannot compare candidates: it takes the server's default, the shared ``COLD_START``."""
    cluster = task.tensor("cluster")
    if task.setting("personal") == given:
        return read_state(task.personal.tensors, ops.spec, state), cluster
    options = read_state(task.shared.tensors, ops.spec, candidates).expand(len(ops.indices))
    unknown = cluster < 0
    if bool(unknown.any()):
        empty = ops.sizes == 0
        if bool(empty.any()):
            default = task.shared.tensors.get(COLD_START)
            if default is None:
                raise InputError(
                    f"client {ops.clients[int(empty.nonzero()[0])].id!r} has no data to choose a "
                    f"candidate with, and the server sent no {COLD_START!r} default"
                )
            cluster = torch.where(empty & unknown, default.to(torch.long), cluster)
        unknown = cluster < 0
        if bool(unknown.any()):  # only clients with data are left to choose by their own NLL
            cluster = torch.where(unknown, ops.nll(options).argmin(dim=-1), cluster)
    return options.gather(cluster), cluster


class Strategy(Configurable, ABC):
    """Base class of federated algorithms. Subclasses are frozen dataclasses of settings."""

    # -- server ---------------------------------------------------------------------------------
    @abstractmethod
    def initialize(self, ctx: ServerContext, rng: np.random.Generator) -> Any:
        """The server state before round 1."""

    @abstractmethod
    def configure(self, rnd: int, server: Any, ctx: ServerContext, rng: np.random.Generator) -> RoundPlan:
        """Participants, their payloads and the declared replies for round ``rnd`` (0-based)."""

    @abstractmethod
    def aggregate(
        self, rnd: int, server: Any, plan: RoundPlan, replies: Replies, ctx: ServerContext
    ) -> tuple[Any, dict[str, Any]]:
        """The next server state, and round metrics for the history."""

    @property
    def keeps_client_memory(self) -> bool:
        """Whether its clients keep values of their own between rounds
        (:mod:`fedgp.strategies.memory`, e.g. personal hyper-parameters): then only an engine that
        keeps them (:attr:`fedgp.engines.Engine.keeps_client_memory`) can run it."""
        return False

    def personal_names(self, spec: GPSpec) -> frozenset[str]:
        """The hyper-parameters (state names of ``spec``) each owner keeps and trains for itself,
        never in a reply (none by default; :mod:`fedgp.strategies.personal`)."""
        return frozenset()

    def kept_names(self, spec: GPSpec) -> frozenset[str]:
        """The names a client's memory may hold (:mod:`fedgp.strategies.memory`), which a saved
        result and a checkpoint store: its personal hyper-parameters, unless the strategy keeps more."""
        return self.personal_names(spec)

    def reply_fields(self, ctx: ServerContext) -> Mapping[str, Field]:
        """The fields a participant's reply to a training round declares (what ``configure``'s plan
        puts in ``replies``): each individual or summed, so what a client sends can be judged
        before any round, e.g. by :class:`fedgp.run.ClientDP`. The default: round 1's plan from the
        initial state; a strategy whose first rounds are of another kind (an initialisation phase)
        gives those of its training rounds."""
        rng = np.random.default_rng(0)
        return self.configure(0, self.initialize(ctx, rng), ctx, rng).replies

    @abstractmethod
    def configure_personal(
        self, server: Any, ctx: ServerContext, positions: torch.Tensor
    ) -> tuple[Record, Record]:
        """What clients at ``positions`` (``-1``: a client the server has never seen) receive to
        choose the state they condition on: ``(shared, personal rows)``."""

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

    def attack_surface(
        self, plan: RoundPlan, personal: Record, replies: Mapping[str, torch.Tensor], spec: GPSpec
    ) -> AttackSurface | None:
        """What an omniscient attack may forge in this round's replies (individual fields only;
        rows = the clients that replied, ``personal`` their rows of the plan), or ``None`` when
        nothing is forgeable this round. The default refuses: a strategy that does not describe
        its replies can only be attacked through its data (:class:`fedgp.attacks.LabelFlip`)."""
        raise InputError(
            f"{type(self).__name__} does not describe its replies to attacks (attack_surface); "
            "only data attacks such as fedgp.attacks.LabelFlip apply to it"
        )

    def client_view(self) -> Strategy:
        """The settings a client needs (the default: all of them). Override to strip what only the
        server may know, e.g. every client's given cluster label."""
        return self

    # -- client ---------------------------------------------------------------------------------
    @abstractmethod
    def local_update(self, ops: ClientOps, task: Task) -> dict[str, torch.Tensor]:
        """The clients' side of a training round: reply tensors with one row per client."""

    @abstractmethod
    def personal_state(self, ops: ClientOps, task: Task) -> tuple[HyperState, torch.Tensor]:
        """The state each client of ``ops`` conditions on (batch ``(B,)``) and its cluster index."""


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
        raise InputError(f"clients_per_round must be in [1, {n}] for uniform sampling")
    if clients_per_round < 1:
        raise InputError("clients_per_round must be >= 1")
    if sampling == "weighted":
        chosen = torch.from_numpy(rng.choice(n, size=clients_per_round, replace=True, p=ctx.weights.numpy()))
        return chosen, torch.full((clients_per_round,), 1.0 / clients_per_round, dtype=torch.float64)
    if sampling == "uniform":
        chosen = torch.from_numpy(np.sort(rng.choice(n, size=clients_per_round, replace=False)))
        w = ctx.weights[chosen]
        return chosen, w / w.sum()
    raise InputError(f"sampling must be 'weighted' or 'uniform', got {sampling!r}")
