"""FGPR: federated GP regression (Yue & Kontar), Algorithms 1 and 2.

Each round the server broadcasts θ; every participating client runs E minibatch steps on its own
per-point exact marginal likelihood, starting from θ; the server averages the results
(Σ p_k θ_k, or a simple average over clients sampled ∝ p_k). Prediction conditions the final θ
on each client's own data.

The defaults reach the optimum of FGPR's own objective (Σ_k log p(y_k | X_k, θ)) on owners that
differ: one plain gradient step per round on the client's data (all of it up to 256 points, else
a minibatch of 256), averaged in GPyTorch's raw parameters, the server taking an Adam step on the
averaged update (FedAdam, Reddi et al. 2021). On the convergence benchmark
(``benchmarks/fgpr_heterogeneous.py``) they end within 0.53 nats per owner of the central optimum
on every split of every federation (server momentum, FedAvgM, left two splits 1.2 and 2.4 nats
short, oscillating at the noise's lower bound), where the authors' settings
(:meth:`FGPR.authors`: Adam restarted every round, minibatches of 32, averaging of constrained
values) end 0.3 to 234 nats short: a restarted Adam takes steps of about ``lr`` whatever the
gradient's size, so the average of the clients' updates vanishes where as many clients push up as
down, not where the summed gradient does. The paper reproductions use :meth:`FGPR.authors`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Self

import numpy as np
import torch

from fedgp.aggregators import StateAggregator, WeightedMean
from fedgp.checks import check_settings
from fedgp.errors import InputError, InputTypeError
from fedgp.messages import (
    Field,
    Record,
    Replies,
    RoundPlan,
    ServerContext,
    Task,
    read_state,
    state_fields,
    state_tensors,
)
from fedgp.models.spec import GPSpec
from fedgp.models.state import HyperState
from fedgp.rng import generator
from fedgp.strategies.base import ClientOps, Strategy, sample_participants
from fedgp.strategies.local import SGD, STRATEGY_LOCAL_SETTINGS, Adam, LocalTraining, make_optimizer
from fedgp.strategies.memory import memory_of
from fedgp.strategies.personal import as_names, keep, personal_names, with_kept
from fedgp.strategies.schedules import LRSchedule
from fedgp.strategies.server import FedAdam, ServerOptimizer, ServerState
from fedgp.strategies.shrinkage import OFFSET, Shrinkage, shrink_start, shrink_trained
from fedgp.strategies.surface import AttackSurface

__all__ = ["FGPR"]

STATE = "state/"


#: FedAvg in each averaging space; ``WeightedMean`` is frozen and holds nothing, so one of each serves
#: every round of every run.
_FEDAVG = {space: WeightedMean(space) for space in ("raw", "constrained")}


@dataclass(frozen=True)
class FGPR(Strategy):
    """Federated GP regression.

    Args:
        local_steps: E, minibatch steps per round (or give ``local_epochs``).
        local_epochs: local epochs per round instead (E_k = epochs * N_k // M_k; authors' code).
        batch_size: M (clients with fewer points use all of them); ``None`` = full local data.
        lr: the local learning rate (``"sgd-constant"``, ``"adam"``) or β of η_t = β/t (``"sgd"``).
        optimizer: ``"sgd-constant"`` (plain steps of ``lr``; default), ``"adam"``
            (re-initialised each round: the authors' code), ``"sgd"`` (η_t = β/t on the global
            step counter, the paper's theory), or an ``Adam``/``SGD`` instance.
        minibatch: ``"uniform"`` or ``"nearest"`` (nearest-neighbour minibatches).
        clients_per_round: ``None`` = full participation; else K_c participants per round.
        sampling: ``"weighted"`` (∝ p_k with replacement, simple average; the paper) or
            ``"uniform"`` (without replacement, p_k renormalised).
        average_space: ``"raw"`` (GPyTorch's raw parameters, where the local steps are taken:
            the average of one step each is a step on the summed objective) or
            ``"constrained"`` (the paper and its code): the space of the default aggregator, the
            weighted mean. ``None`` (default): ``"raw"``, or the given aggregator's own space.
        prox_mu: FedProx proximal weight (0 = plain FGPR).
        aggregator: how the server combines the participants' states
            (:mod:`fedgp.aggregators`; default ``WeightedMean(average_space)``, FedAvg; a robust rule
            for Byzantine clients). Randomised rules get a generator of (seed, round).
        server_optimizer: a :mod:`fedgp.strategies.server` rule (``FedAdam()``, default;
            ``FedAvgM``, ``FedYogi``) stepping from the global state towards the aggregate, FedOpt
            style, or ``None``: the server takes the aggregate (FedAvg).
        lr_schedule: ``None`` (a constant local step) or a :mod:`fedgp.strategies.schedules`
            rule: round ``r``'s local learning rate is ``lr * lr_schedule(r)``.
        personal: hyper-parameters each owner keeps and trains for itself
            (:mod:`fedgp.strategies.personal`: state or raw names, or the aliases ``"noise"``,
            ``"outputscale"``, ``"lengthscale"``, ``"mean"``). They are in no reply: only the shared
            ones are averaged. An owner starts from the spec's initial values, conditions on its own
            values (``result.predict(X, client=k)``), and a new client on the initial ones, which
            the global state (``result.state``) keeps for them. Needs an engine that keeps its
            clients' memory (``sequential``, ``batched``, ``ray``, Flower's).
        shrink: ``None`` or a :class:`~fedgp.strategies.shrinkage.Shrinkage`: each owner's raw value
            of a personal hyper-parameter is the server's shared value plus its own offset, kept and
            shrunk towards 0 by a prior of the given width (``0``: shared; ``None``: unshrunk).
    """

    local_steps: int | None = 1
    local_epochs: int | None = None
    batch_size: int | None = 256
    lr: float = 0.3
    optimizer: str | Adam | SGD = "sgd-constant"
    minibatch: str = "uniform"
    clients_per_round: int | None = None
    sampling: str = "weighted"
    average_space: str | None = None
    prox_mu: float = 0.0
    aggregator: StateAggregator | None = None
    server_optimizer: ServerOptimizer | None = FedAdam()
    lr_schedule: LRSchedule | None = None
    personal: tuple[str, ...] = ()
    shrink: Shrinkage | None = None
    local: LocalTraining = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_settings(self, **STRATEGY_LOCAL_SETTINGS, prox_mu="nonnegative")
        object.__setattr__(self, "personal", as_names(self.personal, "FGPR"))
        steps = None if self.local_epochs is not None else self.local_steps
        object.__setattr__(
            self,
            "local",
            LocalTraining(
                steps=steps,
                epochs=self.local_epochs,
                batch_size=self.batch_size,
                optimizer=make_optimizer(self.optimizer, self.lr),
                minibatch=self.minibatch,
                prox_mu=self.prox_mu,
            ),
        )
        if self.average_space not in (None, "constrained", "raw"):
            raise InputError(
                f"average_space must be 'raw', 'constrained' or None, got {self.average_space!r}"
            )
        if self.aggregator is not None and self.average_space is not None:
            raise InputError(
                "give the averaging space to the aggregator, not average_space, when you pass one"
            )
        if self.sampling not in ("weighted", "uniform"):
            raise InputError(f"sampling must be 'weighted' or 'uniform', got {self.sampling!r}")
        for name, kind in (
            ("server_optimizer", ServerOptimizer),
            ("lr_schedule", LRSchedule),
            ("shrink", Shrinkage),
        ):
            value = getattr(self, name)
            if value is not None and not isinstance(value, kind):
                raise InputTypeError(f"FGPR: {name} must be a fedgp {kind.__name__} or None, got {value!r}")
        if self.shrink is not None and not self.personal:  # else it would be ignored: the shared fit
            raise InputError(
                "FGPR: shrink= shrinks personal hyper-parameters, but personal= names none; name them "
                "(e.g. personal=('noise',), shrink=Shrinkage(0.5)) or leave shrink out"
            )

    @classmethod
    def authors(
        cls, local_steps: int | None = 5, batch_size: int | None = 32, lr: float = 0.05, **options
    ) -> Self:
        """FGPR as the authors' code runs it, the settings of the paper reproductions: Adam
        re-initialised every round, E = 5 minibatch steps of M = 32 at lr 0.05, the averaging of
        constrained values, no server optimiser (``options`` override or add to these)."""
        settings = dict(optimizer="adam", server_optimizer=None)
        if options.get("aggregator") is None:
            settings["average_space"] = "constrained"
        return cls(local_steps=local_steps, batch_size=batch_size, lr=lr, **{**settings, **options})

    @property
    def state_aggregator(self) -> StateAggregator:
        """The aggregator in use: ``aggregator`` if given, else FedAvg (``WeightedMean``) in
        ``average_space`` (``"raw"`` when ``None``)."""
        if self.aggregator is not None:
            return self.aggregator
        return _FEDAVG[self.average_space or "raw"]

    @property
    def keeps_client_memory(self) -> bool:
        """Owners keep their personal hyper-parameters between rounds."""
        return bool(self.personal)

    def personal_names(self, spec: GPSpec) -> frozenset[str]:
        """The state names of ``spec`` each owner keeps for itself (``personal``, resolved; a name
        ``shrink`` gives a width is shared, with the owner's offset kept apart)."""
        names = personal_names(spec, self.personal, "FGPR") if self.personal else frozenset()
        if self.shrink is None or not names:
            return names
        return frozenset(k for k, w in self.shrink.resolve(spec, names).items() if w is None)

    def kept_names(self, spec: GPSpec) -> frozenset[str]:
        """What an owner keeps: its personal hyper-parameters and, under ``shrink``, its offset from
        each shrunk one's shared value (``"offset/<name>"``)."""
        return self.personal_names(spec) | {OFFSET + name for name in self.shrunk_names(spec)}

    def shrunk_names(self, spec: GPSpec) -> dict[str, float]:
        """The personal names with a finite positive width (state name -> width): shared ``c``, kept
        offset ``δ_k`` (:mod:`fedgp.strategies.shrinkage`)."""
        if self.shrink is None or not self.personal:
            return {}
        widths = self.shrink.resolve(spec, personal_names(spec, self.personal, "FGPR"))
        return {k: w for k, w in widths.items() if w is not None and w > 0}

    # -- server -----------------------------------------------------------------------------------
    def initialize(self, ctx: ServerContext, rng: np.random.Generator) -> HyperState | ServerState:
        self.personal_names(ctx.spec)  # an unknown name is refused before any round
        start = ctx.spec.initial_state()
        return start if self.server_optimizer is None else self.server_optimizer.start(start)

    def configure(
        self, rnd: int, server: HyperState | ServerState, ctx: ServerContext, rng: np.random.Generator
    ) -> RoundPlan:
        participants, weights = sample_participants(ctx, self.clients_per_round, self.sampling, rng)
        shared = Record(state_tensors(self.global_state(server), STATE))
        return RoundPlan(participants, weights, shared=shared, replies=self.reply_fields(ctx))

    def reply_fields(self, ctx: ServerContext) -> dict[str, Field]:
        """Each participant's trained shared hyper-parameters and its mean minibatch loss, both
        individual; its personal ones are not replied."""
        personal = {STATE + name for name in self.personal_names(ctx.spec)}
        fields = {k: f for k, f in state_fields(ctx.spec, STATE).items() if k not in personal}
        return {**fields, "loss": Field()}

    def aggregate(
        self,
        rnd: int,
        server: HyperState | ServerState,
        plan: RoundPlan,
        replies: Replies,
        ctx: ServerContext,
    ) -> tuple[HyperState | ServerState, dict[str, float]]:
        rng = generator(ctx.seed, "aggregate", rnd)
        theta = self.global_state(server)
        personal = self.personal_names(ctx.spec)
        # The personal hyper-parameters are in no reply: each participant's row holds the server's
        # own value (what a new client starts from), which therefore stays as it is.
        n = len(replies["loss"])
        given = {STATE + k: theta[k].expand(n, *theta[k].shape) for k in personal}
        states = read_state({**replies.individual, **given}, ctx.spec, STATE)
        new = _keep(self.state_aggregator(ctx.spec, states, replies.weights, theta, rng), theta, personal)
        if self.server_optimizer is not None:
            new = self.server_optimizer.step(ctx.spec, server, new)
            if personal:
                new = replace(new, theta=_keep(new.theta, theta, personal))
        return new, {"train_nll": float(replies["loss"].mean())}

    def attack_surface(self, plan, personal, replies, spec) -> AttackSurface:
        """The trained shared states; a client that did nothing would send back the broadcast state."""
        n = len(replies["loss"])
        start = read_state(plan.shared.tensors, spec, STATE)
        return AttackSurface.of_states(spec, STATE, start.expand(n), exclude=self.personal_names(spec))

    def configure_personal(
        self, server: HyperState | ServerState, ctx: ServerContext, positions: torch.Tensor
    ) -> tuple[Record, Record]:
        return Record(state_tensors(self.global_state(server), STATE)), Record()

    def global_state(self, server: HyperState | ServerState) -> HyperState:
        return server.theta if isinstance(server, ServerState) else server

    # -- client -----------------------------------------------------------------------------------
    def local_training(self, rnd: int) -> LocalTraining:
        """Round ``rnd``'s local training: ``local`` with its learning rate scaled by ``lr_schedule``."""
        if self.lr_schedule is None:
            return self.local
        optimizer = self.local.optimizer
        return replace(self.local, optimizer=replace(optimizer, lr=optimizer.lr * self.lr_schedule(rnd)))

    def local_update(self, ops: ClientOps, task: Task) -> dict[str, torch.Tensor]:
        """Train from the broadcast state (with each owner's own personal values, which it keeps);
        reply the shared hyper-parameters only."""
        start = read_state(task.shared.tensors, ops.spec, STATE).expand(len(ops.indices))
        if not self.personal:  # nothing kept: every hyper-parameter is shared and replied
            result = ops.train(start, self.local_training(task.round))
            return {**state_tensors(result.states, STATE), "loss": result.loss}
        personal, memory, shrunk = self.personal_names(ops.spec), memory_of(ops), self.shrunk_names(ops.spec)
        local = self.local_training(task.round)
        begin = shrink_start(ops.spec, with_kept(start, personal, memory), shrunk, memory)
        result = ops.train(begin, local)
        keep(result.states, personal, memory)
        trained = result.states
        if shrunk:  # the prior's step on the kept offsets; the shared centre's step is replied
            step = local.optimizer.lr * local.num_steps(ops.sizes)
            trained = shrink_trained(ops.spec, start, trained, shrunk, memory, ops.sizes, step)
        shared = {k: v for k, v in state_tensors(trained, STATE).items() if k[len(STATE) :] not in personal}
        return {**shared, "loss": result.loss}

    def personal_state(self, ops: ClientOps, task: Task) -> tuple[HyperState, torch.Tensor]:
        """The global state, with each owner's own personal values where it keeps them."""
        state = read_state(task.shared.tensors, ops.spec, STATE).expand(len(ops.indices))
        if self.personal:
            memory = memory_of(ops)
            state = with_kept(state, self.personal_names(ops.spec), memory)
            state = shrink_start(ops.spec, state, self.shrunk_names(ops.spec), memory)
        return state, torch.zeros(len(ops.indices), dtype=torch.long)


def _keep(state: HyperState, theta: HyperState, personal: frozenset[str]) -> HyperState:
    """``state`` with ``theta``'s values of the ``personal`` hyper-parameters, exactly."""
    if not personal:
        return state
    return HyperState({k: theta[k] if k in personal else v for k, v in state.items()}, state.event_shapes)
