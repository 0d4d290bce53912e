"""Federated-Clustering (Werner et al., Algorithm 2) as a federated GP strategy.

Every client keeps its own state x_i. Each round client j evaluates the gradient of its own
per-point NLL at the states of the clients of its group, ``g_j(x_i)``, and sends them back; for
each client i the server runs Threshold-Clustering with one centre on ``{g_j(x_i)}_j``, starting
from i's own gradient ``g_i(x_i)`` (an honest client trusts itself), and steps ``x_i`` with the
result. Re-checking every client's gradient at every model each round is what lets it undo an
early clustering mistake (Myopic-Clustering cannot, Fig. 1a), and TC's ball is what keeps both
other clusters and Byzantine clients out.

Groups: everyone together (the paper's N² evaluations), random groups of ``group_size`` drawn
each round (the authors' MNIST speed-up: N·s evaluations), or fixed ``groups`` (labels, e.g. the
true clusters: with an infinite radius that is the oracle's within-cluster gradient averaging).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from fedgp.clustering import threshold_clustering
from fedgp.errors import InputError
from fedgp.messages import Field, Record, Replies, RoundPlan, ServerContext, Task, read_state, state_tensors
from fedgp.strategies.base import ClientOps
from fedgp.strategies.gradient_clustering.personal import PersonalStrategy
from fedgp.strategies.gradient_clustering.state import GRAD, MODEL, PersonalState
from fedgp.strategies.surface import AttackSurface

__all__ = ["FederatedClustering"]


@dataclass(frozen=True)
class FederatedClustering(PersonalStrategy):
    """Federated-Clustering (Algorithm 2): per-client TC over everyone's gradients at its model.

    Args (beyond :class:`~fedgp.strategies.gradient_clustering.personal.PersonalStrategy`'s):
        group_size: random groups of this size each round (the last one smaller); ``None``: one
            group of everyone.
        groups: fixed group labels, one per client (server-side knowledge; clients never see it).

    Messages: participant j receives the states of its group's s clients (``model/<θ>``, shape
    ``(s, θ)``) and their registry positions (``peers``, so it can tell its own); it returns the
    raw gradients at each (``grad/<θ>``, individual: the server needs each one for TC) and its NLL
    at its own state (``loss``). Every participant counts once (weights p_k are not used: TC's
    denominator is the number of points, as in the paper).
    """

    group_size: int | None = None
    groups: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.group_size is not None and (isinstance(self.group_size, bool) or self.group_size < 1):
            raise InputError(f"FederatedClustering: group_size must be an int >= 1, got {self.group_size!r}")
        if self.group_size is not None and self.groups is not None:
            raise InputError(
                "FederatedClustering: give group_size (random groups) or groups (fixed), not both"
            )
        if self.groups is not None:
            object.__setattr__(self, "groups", tuple(int(g) for g in self.groups))

    def client_view(self) -> FederatedClustering:
        return replace(self, groups=None) if self.groups is not None else self

    def _groups(self, n: int, rng: np.random.Generator) -> list[torch.Tensor]:
        if self.groups is not None:
            labels = torch.tensor(self.groups)
            if labels.shape != (n,):
                raise InputError(f"FederatedClustering: {len(self.groups)} group labels for {n} clients")
            return [torch.nonzero(labels == g).flatten() for g in torch.unique(labels)]
        if self.group_size is None:
            return [torch.arange(n)]
        order = torch.from_numpy(rng.permutation(n))
        return [torch.sort(order[i : i + self.group_size]).values for i in range(0, n, self.group_size)]

    # -- server ---------------------------------------------------------------------------------
    def configure(
        self, rnd: int, server: PersonalState, ctx: ServerContext, rng: np.random.Generator
    ) -> RoundPlan:
        n = ctx.num_clients
        groups = self._groups(n, rng)
        size = max(len(g) for g in groups)
        peers = torch.full((n, size), -1, dtype=torch.long)
        for g in groups:
            peers[g, : len(g)] = g
        padded = torch.where(peers >= 0, peers, torch.arange(n).unsqueeze(1))  # padding: one's own state
        models = server.states.index(padded)
        blocks = self._blocks(ctx.spec)
        replies = {f"{GRAD}{name}": Field((size, *shape)) for name, shape in zip(blocks.names, blocks.shapes)}
        replies["loss"] = Field()
        personal = Record({**state_tensors(models, MODEL), "peers": peers})
        weights = torch.full((n,), 1.0 / n, dtype=torch.float64)
        return RoundPlan(torch.arange(n), weights, Record(), personal, replies)

    def aggregate(
        self, rnd: int, server: PersonalState, plan: RoundPlan, replies: Replies, ctx: ServerContext
    ) -> tuple[PersonalState, dict[str, float]]:
        blocks = self._blocks(ctx.spec)
        who = replies.participants
        peers = plan.personal.tensors["peers"][replies.slots]  # (n, s)
        grads = blocks.flatten(replies.individual, tuple(peers.shape), GRAD)  # (n, s, D)
        valid = (peers >= 0) & torch.isin(peers, who)  # models whose owner replied (it holds the start)
        rows, slots = torch.nonzero(valid, as_tuple=True)
        owners = peers[rows, slots]
        if not len(owners):
            return server, {"train_nll": float("nan")}
        unique, inverse, counts = torch.unique(owners, return_inverse=True, return_counts=True)
        order = torch.argsort(inverse, stable=True)
        rank = torch.empty_like(order)
        rank[order] = torch.arange(len(order)) - torch.repeat_interleave(
            torch.cumsum(counts, 0) - counts, counts
        )
        points = torch.zeros(len(unique), int(counts.max()), blocks.width, dtype=torch.float64)
        mask = torch.zeros(len(unique), int(counts.max()), dtype=torch.bool)
        points[inverse, rank] = grads[rows, slots]
        mask[inverse, rank] = True
        own = owners == who[rows]  # the owner's gradient at its own model: TC's start
        start = torch.zeros(len(unique), blocks.width, dtype=torch.float64)
        start[inverse[own]] = grads[rows[own], slots[own]]
        direction = torch.empty_like(start)
        inside = []
        for cols in blocks.columns:
            out = threshold_clustering(
                points[..., cols], start[:, cols].unsqueeze(1), self.iterations, self.radius, mask
            )
            direction[:, cols] = out.centres[:, 0]
            inside.append(out.inside[:, 0].sum(-1).to(torch.float64) / counts)
        new = self.step(server, ctx.spec, unique, direction)
        metrics = {"train_nll": float(replies["loss"].mean())}
        metrics.update({f"inside/{b}": float(share.mean()) for b, share in enumerate(inside)})
        return new, metrics

    def attack_surface(self, plan, personal, replies, spec) -> AttackSurface:
        """The gradients at the group's models (no-op: zero); slot k is about peer k's model."""
        peers = personal.tensors["peers"]
        return AttackSurface.of_gradients(spec, GRAD, tuple(peers.shape), 1, owners=peers, groups=peers[:, 0])

    # -- client ---------------------------------------------------------------------------------
    def local_update(self, ops: ClientOps, task: Task) -> dict[str, torch.Tensor]:
        models = read_state(task.personal.tensors, ops.spec, MODEL)  # (B, s)
        peers = task.tensor("peers")
        loss, grads = ops.gradient(models, self.batch_size)
        valid = (peers >= 0).to(torch.float64)
        blocks = self._blocks(ops.spec)
        reply = {
            f"{GRAD}{name}": grads[name] * valid.reshape(*valid.shape, *([1] * len(shape)))
            for name, shape in zip(blocks.names, blocks.shapes)
        }
        own = (peers == ops.indices.unsqueeze(1)).to(loss.dtype)
        reply["loss"] = (loss * own).sum(1).to(torch.float64)
        return reply
