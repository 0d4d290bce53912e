"""``ClusteredGP``: k GP components federated with pluggable initialiser, assigner, solver, aggregator."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from fedgp.checks import check_settings
from fedgp.errors import InputError
from fedgp.messages import Field, Record, Task, read_state, state_fields, state_tensors
from fedgp.models.linear import LinearMeanModel, linear_model
from fedgp.models.spec import GPSpec
from fedgp.models.state import HyperState
from fedgp.strategies.base import (
    COLD_START,
    ClientOps,
    Replies,
    RoundPlan,
    ServerContext,
    Strategy,
    given_or_best_state,
    sample_participants,
)
from fedgp.strategies.clustered.aggregate import Aggregator, ClusterAverage, Contributions
from fedgp.strategies.clustered.assign import Assigner, FixedAssigner, HardAssigner, SoftAssigner, client_nll
from fedgp.strategies.clustered.init import InitDone, Initializer, RandomInit
from fedgp.strategies.clustered.solve import LocalSolver, LocalTrainingSolver
from fedgp.strategies.clustered.state import CANDIDATES, GRAD, STATE, TARGET, ClosedForm, ClusteredState
from fedgp.strategies.surface import AttackSurface

__all__ = ["ClusteredGP"]


def _scatter(values: HyperState, weights: torch.Tensor) -> HyperState:
    """Per-cluster contributions ``(B, R, k, *event)``: ``values`` (``(B, R)`` or ``(B, R, k)``)
    times ``weights`` ``(B, R, k)`` — one-hot for a hard choice, λ for soft assignment."""

    def one(v: torch.Tensor, e: int) -> torch.Tensor:
        w = weights.reshape(*weights.shape, *([1] * e))
        return (v.unsqueeze(2) if v.dim() - e == 2 else v) * w

    return values.map(one)


@dataclass(frozen=True)
class ClusteredGP(Strategy):
    """A federated mixture of k GP components with pluggable initialiser, assigner, solver, aggregator.

    Args:
        num_clusters: k.
        initializer: how the k states start (may use communication rounds: they come first).
        assigner: hard (argmin local NLL or squared error), soft, or fixed labels.
        solver: the clients' local update.
        aggregator: how the server combines the replies (must take gradients iff the solver
            returns them).
        restarts: independent initialisations run side by side; the one with the lowest training
            objective ``Σ_i n_i min_j F_i(θ_j) / Σ_i n_i`` is reported and used for prediction.
        clients_per_round: ``None`` = everyone each round; else that many, uniformly, without
            replacement (initialisation rounds use their own participants).
        closed_form: ``"auto"`` (closed forms for the noise-only linear model), ``"never"`` (always
            the engine's GPyTorch path), ``"always"`` (``ValueError`` if the spec has none).

    Messages: with a choosing assigner every participant receives the k candidate states of every
    restart; with fixed labels, only its own cluster's state and label. Gradients come back as
    *summed* fields scattered over the clusters, so the server learns each cluster's gradient sum
    but no client's gradient.
    """

    num_clusters: int = 2
    initializer: Initializer = field(default_factory=RandomInit)
    assigner: Assigner = field(default_factory=HardAssigner)
    solver: LocalSolver = field(default_factory=LocalTrainingSolver)
    aggregator: Aggregator = field(default_factory=ClusterAverage)
    restarts: int = 1
    clients_per_round: int | None = None
    closed_form: str = "auto"

    def __post_init__(self) -> None:
        check_settings(self, num_clusters="count", restarts="count", clients_per_round="count_or_none")
        if self.closed_form not in ("auto", "never", "always"):
            raise InputError(f"closed_form must be 'auto', 'never' or 'always', got {self.closed_form!r}")
        if self.solver.returns_gradient != self.aggregator.uses_gradients:
            raise InputError(
                f"{type(self.solver).__name__} and {type(self.aggregator).__name__} do not fit: a "
                "GradientSolver needs a GradientStep aggregator and vice versa"
            )

    @property
    def init_rounds(self) -> int:
        """Communication rounds the initialiser uses before clustered training starts (at most)."""
        return self.initializer.rounds(self.num_clusters)

    def _model(self, spec: GPSpec) -> tuple[LinearMeanModel | None, bool]:
        try:
            model = linear_model(spec)
        except ValueError as err:
            if self.closed_form == "always":
                raise InputError(f"closed_form='always' needs a noise-only linear model: {err}") from None
            return None, False
        closed = model.noise_only and self.closed_form != "never"
        if self.closed_form == "auto" and model._kind == "generic":
            closed = False
        if self.closed_form == "always" and not closed:
            raise InputError(
                "closed_form='always' needs the noise-only linear model: a mean linear in its "
                "parameters, ZeroKernel, a Gaussian likelihood with fixed noise, nothing else trained"
            )
        return model, closed

    def _form(self, spec: GPSpec) -> ClosedForm:
        return ClosedForm(*self._model(spec))

    @property
    def _fixed(self) -> bool:
        return isinstance(self.assigner, FixedAssigner)

    def _labels(self, server: ClusteredState, ctx: ServerContext) -> torch.Tensor | None:
        """Fixed labels ``(K,)``: the initialiser's (one-shot), else the FixedAssigner's given ones."""
        if server.labels is not None:
            return server.labels
        if self._fixed and self.assigner.labels is not None:
            labels = torch.as_tensor(self.assigner.labels, dtype=torch.long)
            if labels.shape != (ctx.num_clients,):
                raise InputError(f"FixedAssigner has {labels.numel()} labels for {ctx.num_clients} clients")
            return labels
        return None

    def client_view(self) -> ClusteredGP:
        """Clients never receive the given labels of other clients: each gets its own in the payload."""
        if self._fixed and self.assigner.labels is not None:
            return replace(self, assigner=FixedAssigner())
        return self

    # -- server ---------------------------------------------------------------------------------
    def initialize(self, ctx: ServerContext, rng: np.random.Generator) -> ClusteredState:
        self._model(ctx.spec)  # errors early
        r, k, n = self.restarts, self.num_clusters, ctx.num_clients
        out = self.initializer.start(ctx, k, r, rng)
        assignment = torch.full((r, n), -1, dtype=torch.long)
        objective = torch.full((r,), float("inf"), dtype=torch.float64)
        if isinstance(out, InitDone):
            return ClusteredState(self._check(out.states), assignment, objective, out.labels)
        placeholder = ctx.spec.initial_state().expand(r, k).clone()
        return ClusteredState(placeholder, assignment, objective, None, init=out)

    def _check(self, states: HyperState) -> HyperState:
        expected = (self.restarts, self.num_clusters)
        if tuple(states.batch_shape) != expected:
            raise InputError(f"initial states have batch {tuple(states.batch_shape)}, expected {expected}")
        return states

    def configure(
        self, rnd: int, server: ClusteredState, ctx: ServerContext, rng: np.random.Generator
    ) -> RoundPlan:
        if server.initialising:
            plan = self.initializer.configure(server.init, ctx, rng, rnd)
            shared = Record(plan.shared.tensors, {**plan.shared.settings, "phase": "init"})
            return replace(plan, shared=shared)
        participants, weights = sample_participants(ctx, self.clients_per_round, "uniform", rng)
        r, k = server.states.batch_shape
        shared, personal = {}, {}
        if self._fixed:
            labels = self._labels(server, ctx)
            if labels is None:
                raise InputError("FixedAssigner needs labels, given or set by the initialiser (OneShotInit)")
            mine = labels[participants]
            keep = mine >= 0  # a client without a label (it missed the one-shot round) cannot take part
            if not bool(keep.any()):
                raise InputError(f"FixedAssigner: no label for any participant of round {rnd + 1}")
            participants, weights, mine = participants[keep], weights[keep], mine[keep]
            own = server.states.map(lambda v, e: v[:, mine].movedim(1, 0))  # (P, R)
            personal = {**state_tensors(own, TARGET), "label": mine}
        else:
            shared = state_tensors(server.states, CANDIDATES)
        fields = self._train_fields(ctx.spec, r, k)
        return RoundPlan(participants, weights, Record(shared, {"phase": "train"}), Record(personal), fields)

    def reply_fields(self, ctx: ServerContext) -> dict[str, Field]:
        """A clustered training round's reply (after any initialisation rounds): each participant's
        choice of cluster and its NLLs (individual), with soft assignment its responsibilities, and
        its trained states (individual) or its gradients scattered over the clusters (summed)."""
        return self._train_fields(ctx.spec, self.restarts, self.num_clusters)

    def _train_fields(self, spec: GPSpec, r: int, k: int) -> dict[str, Field]:
        fields = {"choice": Field((r,), torch.long, bounds=(0, k - 1)), "nll": Field((r,))}
        soft = not self._fixed and self._soft
        extra = (r, k) if soft else (r,)
        if soft:
            fields["resp"] = Field((r, k))
        if self.solver.returns_gradient:
            fields.update(state_fields(spec, GRAD, (r, k), summed=True))
            fields["members"] = Field((r, k), summed=True)
        else:
            fields.update(state_fields(spec, STATE, extra))
        if self.solver.has_loss(self._model(spec)[1]):
            fields["loss"] = Field(extra)
        return fields

    @property
    def _soft(self) -> bool:
        return isinstance(self.assigner, SoftAssigner)

    def aggregate(
        self, rnd: int, server: ClusteredState, plan: RoundPlan, replies: Replies, ctx: ServerContext
    ) -> tuple[ClusteredState, dict[str, Any]]:
        if server.initialising:
            out, metrics = self.initializer.aggregate(server.init, plan, replies, ctx, rnd)
            metrics = {"phase": "init", **metrics}
            if isinstance(out, InitDone):
                labels = out.labels if out.labels is not None else server.labels
                states = self._check(out.states)
                return ClusteredState(
                    states, server.assignment, server.objective, labels, init_log=out.log
                ), metrics
            return ClusteredState(
                server.states, server.assignment, server.objective, server.labels, out, server.phase_round + 1
            ), metrics
        return self._aggregate_clusters(server, replies, ctx)

    def _aggregate_clusters(self, server: ClusteredState, replies: Replies, ctx: ServerContext):
        spec = ctx.spec
        model, _ = self._model(spec)
        choice, best_nll = replies["choice"], replies["nll"]  # (P, R)
        resp = replies.get("resp")  # (P, R, k) for soft assignment
        gradient = self.aggregator.uses_gradients
        values = None if gradient else replies.state(spec, STATE)
        grad_sums = replies.summed_state(spec, GRAD) if gradient else None
        sizes = ctx.sizes[replies.participants].to(torch.float64)
        total = float(sizes.sum())
        r_count, k = server.states.batch_shape
        new_states = []
        for r in range(r_count):
            row = []
            for j in range(k):
                old = server.states.index((r, j))
                if resp is None:
                    members = torch.nonzero(choice[:, r] == j).flatten()
                    lam = torch.ones(len(members), dtype=torch.float64)
                    vals = values.index((members, r)) if values is not None and len(members) else None
                else:
                    members = torch.nonzero(resp[:, r, j] > 0).flatten()
                    lam = resp[members, r, j]
                    vals = values.index((members, r, j)) if values is not None and len(members) else None
                c = Contributions(
                    vals,
                    members,
                    lam,
                    sizes[members],
                    total,
                    len(replies.participants),
                    ctx.num_clients,
                    resp is not None,
                    grad_sums.index((r, j)) if gradient else None,
                    float(replies.sums["members"][r, j]) if gradient else 0.0,
                )
                row.append(self.aggregator.combine(spec, old, c, model))
            new_states.append(HyperState.stack(row))
        assignment = server.assignment.clone()
        assignment[:, replies.participants] = choice.T
        objective = (sizes[:, None] * best_nll).sum(0) / sizes.sum()
        new = ClusteredState(
            HyperState.stack(new_states),
            assignment,
            objective,
            server.labels,
            None,
            server.phase_round + 1,
            server.init_log,
        )
        best = new.best
        metrics: dict[str, Any] = {"objective": float(objective[best]), "restart": best}
        counts = torch.bincount(choice[:, best], minlength=k)
        metrics.update({f"size/{j}": int(c) for j, c in enumerate(counts)})
        if "loss" in replies:
            metrics["train_nll"] = float(replies["loss"][:, best].mean())
        else:
            metrics["train_nll"] = float(best_nll[:, best].mean())
        metrics["phase"] = "train"
        metrics["phase_round"] = new.phase_round
        return new, metrics

    def attack_surface(self, plan, personal, replies, spec) -> AttackSurface | None:
        """Model averaging: the states sent back; a client's no-op is the state it trained from (its
        chosen candidate, its label's state, or every candidate for soft assignment). Initialisation
        rounds are not forged (``None``). Gradient averaging is refused: its gradients are summed
        fields, which the server never sees one client at a time, so they cannot be forged here."""
        if plan.shared.settings.get("phase") == "init":
            return None
        if self.solver.returns_gradient:
            raise InputError(
                f"{type(self.solver).__name__}: the gradients are summed fields (the server sees only their "
                "sum), so a reply attack cannot forge them; use a data attack (fedgp.attacks.LabelFlip)"
            )
        n = len(replies["choice"])
        if self._fixed:
            reference = read_state(personal.tensors, spec, TARGET)
        else:
            candidates = read_state(plan.shared.tensors, spec, CANDIDATES).expand(n)
            reference = candidates if self._soft else candidates.gather(replies["choice"])
        return AttackSurface.of_states(spec, STATE, reference, slot_dims=2 if self._soft else 1)

    def configure_personal(
        self, server: ClusteredState, ctx: ServerContext, positions: torch.Tensor
    ) -> tuple[Record, Record]:
        """A client with a fixed label gets its cluster's state; others get the k states to choose
        from, and a client with no data (a cold start) the largest cluster: the one holding the
        most training points (labels, else the best restart's latest assignment; ties: lowest index)."""
        states = self.global_state(server)
        labels = self._labels(server, ctx) if not server.initialising else None
        mine = torch.full(positions.shape, -1, dtype=torch.long)
        if labels is not None:
            known = positions >= 0
            mine[known] = labels[positions[known]]
        if bool((mine >= 0).all()):
            own = {**state_tensors(states.index(mine), STATE), "cluster": mine}
            return Record({}, {"personal": "label"}), Record(own)
        members = labels if labels is not None else server.assignment[server.best]
        seen = members >= 0
        points = torch.zeros(states.batch_shape[0], dtype=torch.float64)
        points.index_add_(0, members[seen], ctx.sizes[seen].to(torch.float64))
        shared = {**state_tensors(states, CANDIDATES), COLD_START: points.argmax()}
        return Record(shared, {"personal": "choose"}), Record({"cluster": mine})

    def global_state(self, server: ClusteredState) -> HyperState:
        """The k cluster states of the best restart: batch ``(k,)``."""
        return server.states.index(server.best)

    # -- client ---------------------------------------------------------------------------------
    def local_update(self, ops: ClientOps, task: Task) -> dict[str, torch.Tensor]:
        form = self._form(ops.spec)
        if task.setting("phase") == "init":
            return self.initializer.local_update(ops, task, form)
        B = len(ops.indices)
        if self._fixed:
            targets = read_state(task.personal.tensors, ops.spec, TARGET)  # (B, R)
            best = client_nll(ops, targets, form)
            choice = task.tensor("label").reshape(B, 1).expand(best.shape).clone()
            resp = None
        else:
            candidates = read_state(task.shared.tensors, ops.spec, CANDIDATES).expand(B)  # (B, R, k)
            nll, resp, choice = self.assigner.assign(ops, candidates, form)
            best = nll.gather(-1, choice.unsqueeze(-1)).squeeze(-1)
            targets = candidates.gather(choice) if resp is None else candidates
        reply = {"choice": choice, "nll": best}
        if resp is not None:
            reply["resp"] = resp
        values, loss = self.solver.solve(ops, targets, form)
        if self.solver.returns_gradient:
            k = self.num_clusters
            weights = resp if resp is not None else torch.nn.functional.one_hot(choice, k).to(torch.float64)
            reply.update(state_tensors(_scatter(values, weights), GRAD))
            reply["members"] = weights
        else:
            reply.update(state_tensors(values, STATE))
        if loss is not None:
            reply["loss"] = loss
        return reply

    def personal_state(self, ops: ClientOps, task: Task) -> tuple[HyperState, torch.Tensor]:
        """Its fixed label's state if it has one, else the candidate with the lowest local NLL (also
        for clients never seen in training)."""
        return given_or_best_state(ops, task, "label", STATE, CANDIDATES)
