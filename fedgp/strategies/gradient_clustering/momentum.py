"""Momentum-Clustering (Werner et al., Algorithm 4) and Myopic-Clustering (Algorithm 1).

Both ask each client only about its *own* state (O(N) messages). In Momentum-Clustering client i
updates its momentum ``m_i ← α g_i(x_i) + (1 − α) m_i`` (``m_i = g_i`` at its first round) and
sends it; the server runs Threshold-Clustering with K centres warm-started from the previous
round (the first centres: k-means++ seeds among the first momenta, from the master seed) and
steps each client with the centre nearest its momentum, ``k_i = argmin_k ‖m_i − v_k‖`` (the
assignment the paper leaves open; digest §5.4). Momenta change slowly, so one clustering mistake
does less harm, and they carry less noise (Lemma 14).

Myopic-Clustering is the paper's straw man: α = 1 (the momentum *is* the gradient) and the
server clusters the N gradients afresh each round with k-means (k-means++ seeds from the round's
generator; Algorithm 1 leaves the method open). It cannot undo a mistake: at a saddle shared with
another cluster's optimum two clients look alike and stay stuck together (Fig. 1a), and as all
gradients vanish near the optima every client ends in one cluster.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fedgp.clustering import assign, kmeans, kmeans_plus_plus, threshold_clustering
from fedgp.errors import InputError
from fedgp.messages import Field, Record, Replies, RoundPlan, ServerContext, Task, read_state, state_tensors
from fedgp.rng import generator
from fedgp.strategies.base import ClientOps
from fedgp.strategies.gradient_clustering.personal import PersonalStrategy
from fedgp.strategies.gradient_clustering.state import MOMENTUM, STATE, PersonalState
from fedgp.strategies.surface import AttackSurface

__all__ = ["MomentumClustering", "MyopicClustering"]

METHODS = ("threshold", "kmeans")


@dataclass(frozen=True)
class MomentumClustering(PersonalStrategy):
    """Momentum-Clustering (Algorithm 4): clients send EMA momenta, the server clusters them.

    Args (beyond :class:`~fedgp.strategies.gradient_clustering.personal.PersonalStrategy`'s):
        num_clusters: K.
        alpha: α, the weight of the new gradient in the momentum (0.1: β = 0.9).
        clustering: ``"threshold"`` (TC with K warm-started centres, the paper's) or ``"kmeans"``
            (k-means re-seeded every round, Myopic's).

    Messages: participant i receives its state (``state/<θ>``), its previous momentum
    (``momentum/<θ>``, raw; the server keeps it for the stateless client) and whether it has one
    (``started``); it returns its new momentum (individual: the server clusters them) and its NLL.
    """

    num_clusters: int = 2
    alpha: float = 0.1
    clustering: str = "threshold"

    def __post_init__(self) -> None:
        super().__post_init__()
        name = type(self).__name__
        if (
            isinstance(self.num_clusters, bool)
            or not isinstance(self.num_clusters, int)
            or self.num_clusters < 1
        ):
            raise InputError(f"{name}: num_clusters must be an int >= 1, got {self.num_clusters!r}")
        if not 0.0 < self.alpha <= 1.0:
            raise InputError(f"{name}: alpha must be in (0, 1], got {self.alpha}")
        if self.clustering not in METHODS:
            raise InputError(f"{name}: clustering must be one of {METHODS}, got {self.clustering!r}")

    # -- server ---------------------------------------------------------------------------------
    def initialize(self, ctx: ServerContext, rng: np.random.Generator) -> PersonalState:
        state = super().initialize(ctx, rng)
        state.momenta = torch.zeros_like(state.buffer)
        return state

    def configure(
        self, rnd: int, server: PersonalState, ctx: ServerContext, rng: np.random.Generator
    ) -> RoundPlan:
        n = ctx.num_clients
        who = torch.arange(n)
        blocks = self._blocks(ctx.spec)
        personal = {
            **state_tensors(server.states, STATE),
            **{MOMENTUM + k: v for k, v in blocks.unflatten(server.momenta).items()},
            "started": server.started.clone(),
        }
        replies = {
            f"{MOMENTUM}{name}": Field(tuple(shape)) for name, shape in zip(blocks.names, blocks.shapes)
        }
        replies["loss"] = Field()
        return RoundPlan(
            who, torch.full((n,), 1.0 / n, dtype=torch.float64), Record(), Record(personal), replies
        )

    def _cluster(
        self, points: torch.Tensor, centres: torch.Tensor | None, rng
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Centres ``(K, P)`` and each point's centre."""
        k = self.num_clusters
        if k > len(points):
            raise InputError(f"{type(self).__name__}: {k} clusters for {len(points)} replies")
        if self.clustering == "kmeans":
            found, labels = kmeans(points, k, rng)
            return torch.from_numpy(found), torch.from_numpy(labels)
        if centres is None:
            centres = points[torch.from_numpy(kmeans_plus_plus(points, k, rng))]
        found = threshold_clustering(points, centres, self.iterations, self.radius).centres
        return found, assign(points, found)

    def aggregate(
        self, rnd: int, server: PersonalState, plan: RoundPlan, replies: Replies, ctx: ServerContext
    ) -> tuple[PersonalState, dict[str, float]]:
        blocks = self._blocks(ctx.spec)
        who = replies.participants
        momenta = blocks.flatten(replies.individual, (len(who),), MOMENTUM)
        rng = generator(ctx.seed, "momentum clustering", rnd)
        direction = torch.empty_like(momenta)
        centres, assignment = [], server.assignment.clone()
        for b, cols in enumerate(blocks.columns):
            warm = None if server.centres is None else server.centres[b]
            found, labels = self._cluster(momenta[:, cols], warm, rng)
            direction[:, cols] = found[labels]
            centres.append(found)
            assignment[who, b] = labels
        stored = server.momenta.clone()
        stored[who] = momenta
        new = self.step(server, ctx.spec, who, direction)
        new.momenta, new.centres, new.assignment = stored, centres, assignment
        metrics = {"train_nll": float(replies["loss"].mean())}
        counts = torch.bincount(assignment[who, 0], minlength=self.num_clusters)
        metrics.update({f"size/{j}": int(c) for j, c in enumerate(counts)})
        return new, metrics

    def attack_surface(self, plan, personal, replies, spec) -> AttackSurface:
        """The momenta (no-op: zero)."""
        n = len(replies["loss"])
        return AttackSurface.of_gradients(spec, MOMENTUM, (n,))

    # -- client ---------------------------------------------------------------------------------
    def local_update(self, ops: ClientOps, task: Task) -> dict[str, torch.Tensor]:
        own = read_state(task.personal.tensors, ops.spec, STATE)  # (B,)
        loss, grads = ops.gradient(own, self.batch_size)
        started = task.tensor("started")
        blocks = self._blocks(ops.spec)
        reply = {}
        for name, shape in zip(blocks.names, blocks.shapes):
            previous = task.tensor(MOMENTUM + name)
            mixed = self.alpha * grads[name] + (1 - self.alpha) * previous
            reply[MOMENTUM + name] = torch.where(
                started.reshape(-1, *([1] * len(shape))), mixed, grads[name]
            ).to(torch.float64)
        reply["loss"] = loss.to(torch.float64)
        return reply


@dataclass(frozen=True)
class MyopicClustering(MomentumClustering):
    """Myopic-Clustering (Algorithm 1): k-means on the clients' own gradients each round, every
    client stepping with its cluster's mean gradient. A straw man, kept to show why FC re-checks."""

    alpha: float = 1.0
    clustering: str = "kmeans"
