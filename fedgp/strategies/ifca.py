"""IFCA: the Iterative Federated Clustering Algorithm (Ghosh, Chung, Yin & Ramchandran 2020).

The server holds k states (cluster models). Each round every participating client evaluates all k
on its own data and joins the one with the lowest per-point NLL — for a GP, the highest marginal
likelihood — then either sends the gradient at that state (option I, gradient averaging) or
trains it locally and sends the result (option II, model averaging). The server updates each
cluster from its members only; an empty cluster keeps its state (the authors' code).

Random restarts are run side by side as an extra batch dimension; the restart with the lowest
training objective ``sum_i n_i min_j F_i(θ_j) / sum_i n_i`` (measured at the start of the latest
round) is the one reported and used for prediction.

With a linear mean, the zero kernel and a fixed noise σ², the per-point NLL is
``MSE / (2σ²) + const``, so gradient-averaging IFCA with step ``γ = 2σ² γ_MSE`` is exactly the
paper's linear-regression IFCA (digest §6.2); a test checks this iterate for iterate.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from fedgp.models.state import HyperState
from fedgp.strategies.base import (
    ClientOps,
    Reply,
    RoundPlan,
    ServerContext,
    Strategy,
    average_states,
    sample_participants,
)
from fedgp.strategies.local import SGD, Adam, LocalTraining, make_optimizer

__all__ = ["IFCA", "IFCAState"]


@dataclass
class IFCAState:
    """Server state: cluster states per restart ``(R, k)``, assignments ``(R, K)``, objectives ``(R,)``."""

    states: HyperState
    assignment: torch.Tensor
    objective: torch.Tensor

    @property
    def best(self) -> int:
        return int(torch.argmin(self.objective))


@dataclass(frozen=True)
class IFCA(Strategy):
    """Iterative federated clustering with GP cluster models.

    Args:
        num_clusters: k.
        aggregation: ``"gradient"`` (option I: one gradient per client per round, server step
            ``θ_j -= lr/m Σ_{i∈S_j} g_i``) or ``"model"`` (option II: local training, averaging
            within each cluster).
        lr: γ for gradient averaging; the local optimiser's learning rate for model averaging.
        gradient_batch_size: minibatch for option I gradients (``None`` = all local data).
        gradient_normalization: divide option I sums by ``"total"`` (all K clients; the authors'
            code), ``"participants"`` (the round's participants) or ``"cluster"`` (cluster size).
        local_steps, local_epochs, batch_size, optimizer, minibatch: local training (option II).
        weighted: option II averages weighted by client size (FEMNIST code) instead of the
            paper's plain mean.
        average_space: average constrained (default, as FGPR) or raw values.
        restarts: independent random initialisations run together; the best by objective wins.
        init: ``"normal"`` (raw trainable values + ``init_scale`` · N(0, 1)), ``"bernoulli"``
            (trainable raw values ~ ``init_scale`` · Bernoulli(½), the authors' synthetic runs),
            ``"spec"`` (every cluster at the spec's initial state), or a ``HyperState`` with batch
            ``(k,)`` or ``(restarts, k)``.
        clients_per_round: ``None`` = all clients; else this many, uniformly without replacement.
    """

    num_clusters: int = 2
    aggregation: str = "model"
    lr: float = 0.05
    gradient_batch_size: int | None = None
    gradient_normalization: str = "total"
    local_steps: int | None = 5
    local_epochs: int | None = None
    batch_size: int | None = 32
    optimizer: str | Adam | SGD = "adam"
    minibatch: str = "uniform"
    weighted: bool = True
    average_space: str = "constrained"
    restarts: int = 1
    init: str | HyperState = "normal"
    init_scale: float = 1.0
    clients_per_round: int | None = None
    local: LocalTraining = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.num_clusters < 1 or self.restarts < 1:
            raise ValueError("num_clusters and restarts must be >= 1")
        if self.aggregation not in ("gradient", "model"):
            raise ValueError(f"aggregation must be 'gradient' or 'model', got {self.aggregation!r}")
        if self.gradient_normalization not in ("total", "participants", "cluster"):
            raise ValueError(f"unknown gradient_normalization {self.gradient_normalization!r}")
        steps = None if self.local_epochs is not None else self.local_steps
        local = LocalTraining(
            steps=steps,
            epochs=self.local_epochs,
            batch_size=self.batch_size,
            optimizer=make_optimizer(self.optimizer, self.lr),
            minibatch=self.minibatch,
        )
        object.__setattr__(self, "local", local)

    # -- server ---------------------------------------------------------------------------------
    def initialize(self, ctx: ServerContext, rng: np.random.Generator) -> IFCAState:
        spec, r, k = ctx.spec, self.restarts, self.num_clusters
        if isinstance(self.init, HyperState):
            states = self.init if len(self.init.batch_shape) == 2 else self.init.expand(1)
            if tuple(states.batch_shape) != (r, k):
                raise ValueError(
                    f"init has batch {tuple(self.init.batch_shape)}; expected ({k},) or ({r}, {k})"
                )
        else:
            raw = spec.to_raw(spec.initial_state()).expand(r, k)
            values = {}
            for p in spec.params:
                v = raw[p.name]
                shape = tuple(v.shape)
                if p.trainable and self.init == "normal":
                    v = v + self.init_scale * torch.from_numpy(rng.standard_normal(shape))
                elif p.trainable and self.init == "bernoulli":
                    v = self.init_scale * torch.from_numpy(
                        rng.binomial(1, 0.5, size=shape).astype(np.float64)
                    )
                elif self.init not in ("normal", "bernoulli", "spec"):
                    raise ValueError(
                        f"init must be 'normal', 'bernoulli', 'spec' or a HyperState, got {self.init!r}"
                    )
                values[p.name] = v.clone()
            states = spec.from_raw(HyperState(values, raw.event_shapes))
        return IFCAState(
            states.clone(),
            torch.full((r, ctx.num_clients), -1, dtype=torch.long),
            torch.full((r,), float("inf"), dtype=torch.float64),
        )

    def configure(
        self, rnd: int, server: IFCAState, ctx: ServerContext, rng: np.random.Generator
    ) -> RoundPlan:
        participants, weights = sample_participants(ctx, self.clients_per_round, "uniform", rng)
        return RoundPlan(participants, weights, payload=server.states)

    def aggregate(
        self, rnd: int, server: IFCAState, plan: RoundPlan, replies: Reply, ctx: ServerContext
    ) -> tuple[IFCAState, dict[str, float]]:
        spec = ctx.spec
        choice, best_nll = replies["choice"], replies["nll"]  # (P, R)
        sizes = ctx.sizes[plan.participants].to(torch.float64)
        r_count, k = server.states.batch_shape
        raw = spec.to_raw(server.states)
        new_states = []
        for r in range(r_count):
            row = []
            for j in range(k):
                members = torch.nonzero(choice[:, r] == j).flatten()
                old = server.states.index((r, j))
                if len(members) == 0:
                    row.append(old)
                elif self.aggregation == "gradient":
                    grads = replies["grad"].index((members, r))
                    denom = {
                        "total": ctx.num_clients,
                        "participants": len(plan.participants),
                        "cluster": len(members),
                    }[self.gradient_normalization]
                    old_raw = raw.index((r, j))
                    stepped = {
                        p.name: old_raw[p.name] - (self.lr / denom) * grads[p.name].sum(0)
                        if p.trainable
                        else old_raw[p.name]
                        for p in spec.params
                    }
                    row.append(spec.from_raw(HyperState(stepped, raw.event_shapes)))
                else:
                    w = sizes[members] if self.weighted else torch.ones(len(members), dtype=torch.float64)
                    states = replies["state"].index((members, r))
                    row.append(average_states(spec, states, w / w.sum(), old, self.average_space))
            new_states.append(HyperState.stack(row))
        assignment = server.assignment.clone()
        assignment[:, plan.participants] = choice.T
        objective = (sizes[:, None] * best_nll).sum(0) / sizes.sum()
        new = IFCAState(HyperState.stack(new_states), assignment, objective)
        best = new.best
        metrics = {"objective": float(objective[best]), "restart": best}
        counts = torch.bincount(choice[:, best], minlength=k)
        metrics.update({f"size/{j}": int(c) for j, c in enumerate(counts)})
        if "loss" in replies:
            metrics["train_nll"] = float(replies["loss"][:, best].mean())
        return new, metrics

    # -- client ---------------------------------------------------------------------------------
    def local_update(self, ops: ClientOps, payload: HyperState) -> Reply:
        candidates = payload.expand(len(ops.indices))  # (B, R, k)
        nll = ops.nll(candidates)
        choice = nll.argmin(dim=-1)  # ties go to the lowest index
        best = nll.gather(-1, choice.unsqueeze(-1)).squeeze(-1)
        chosen = candidates.gather(choice)  # (B, R)
        reply: Reply = {"choice": choice, "nll": best}
        if self.aggregation == "gradient":
            _, reply["grad"] = ops.gradient(chosen, self.gradient_batch_size)
        else:
            result = ops.train(chosen, self.local)
            reply["state"], reply["loss"] = result.states, result.loss
        return reply

    def personal_state(self, server: IFCAState, ops: ClientOps) -> HyperState:
        """Each client's best cluster by local NLL (also for clients never seen in training)."""
        candidates = self.global_state(server).expand(len(ops.indices))  # (B, k)
        return candidates.gather(ops.nll(candidates).argmin(dim=-1))

    def global_state(self, server: IFCAState) -> HyperState:
        """The k cluster states of the best restart: batch ``(k,)``."""
        return server.states.index(server.best)
