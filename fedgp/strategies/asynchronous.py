"""``Asynchronous``: a buffered asynchronous server (FedBuff, Nguyen et al. 2022) around FGPR.

``fit(spec, fed, Asynchronous(FGPR(), buffer=B, staleness=Polynomial(0.5), speeds=...), rounds=R)``:
the server takes a step as soon as ``B`` replies have arrived, whichever owners sent them; nobody
waits for the slowest owner. Each reply was trained from the state version (server step) its owner
last received, which travels with it (the reply field ``version``); a reply ``τ`` versions stale
counts with weight ``s(τ)`` (:mod:`fedgp.strategies.staleness`). As in FedBuff, a reply's *update*
is what the server applies: the move it made from the state it started from, in GPyTorch's raw
parameters, scaled by ``s(τ)`` and added to the current state — so the buffer's weighted mean is
``θ_t + Σ_i c_i s(τ_i) Δ_i`` — and the inner FGPR's server optimiser (FedAdam by default) steps on
it as on a synchronous round's mean. A fresh reply (``τ = 0``) of weight ``c_i = p_i`` enters
exactly as it came, so with ``B = K`` and equal speeds every step is the synchronous round, bit for
bit.

**Which weights** (``weighting``). FedBuff's (``"buffer"``) are the inner plan's weights ``p_k``
renormalised over the buffer. They are biased: an owner's updates count in proportion to how often
it arrives and to who shares its buffers, so the server converges to another objective than the
synchronous round's (with equal speeds and ``B = K/2`` the buffers alternate between two halves of
the owners, each half's updates counting as if it were the federation). fedgp's default,
``"rate"``, weighs owner ``k``'s reply by ``c_k = p_k / r_k``, ``r_k`` its replies consumed per step
so far (this one included): each owner's updates then add up, over the steps, to ``p_k`` per step,
as in the synchronous round (an importance weight; with ``B = K`` and equal speeds ``r_k = 1`` and
``c_k = p_k``). Its price is variance: an owner that arrives rarely (a 100× straggler) sends
rarely but each of its updates counts many times over. ``benchmarks/asynchronous.py`` measures both.

**Simulation.** An owner's job lasts ``work / speed`` units of simulated time
(:mod:`fedgp.strategies.speeds`); the server consumes arrivals in time order (ties: registration
order), steps at the ``B``-th, and every owner whose reply is in the buffer restarts from the new
version at that moment. An owner that has replied waits for the step its reply is part of: it never
trains twice from the same state (a full-data local step would send the same update again). Which
owners arrive when depends only on the speeds and ``B``, never on the values, so each server step is
one message exchange of the ordinary round loop: the owners that restart from version ``t`` get it
in round ``t``'s task (round number ``t``, so their minibatches and learning-rate schedule are those
of synchronous round ``t``), the server keeps their replies until the schedule says they arrive, and
any engine replays the schedule with no code of its own. A client that fails its task idles until
the next version; while fewer than ``B`` owners are working, the server steps on those that are.
``history`` has, per step, the simulated time (``sim_time``), the replies consumed (``buffered``)
and their staleness (``staleness_mean``, ``staleness_max``); every reply's staleness is in
:meth:`AsyncServer.arrivals` (``result.server_state.arrivals(result.roster.ids)``).

**Not combined with secure aggregation.** Secure aggregation releases the sum of one exchange's
replies; a buffer mixes replies of several exchanges (trained from different versions, arriving
at different times) and needs each one's staleness weight, so an inner strategy with summed reply
fields (``DPFGPR``, ``ClientDP``) is refused. FedBuff keeps secure aggregation by summing in a
trusted enclave per buffer; fedgp does not; and a Flower engine with ``secure`` refuses to dispatch a
measured run (below).

**Measured, on Flower.** ``speeds="measured"`` replays no schedule: on an engine that returns
replies as they arrive (:class:`fedgp.engines.arrivals.Arrivals`: the Flower grid, in a deployment
or ``engine=fedgp.flower.Flower(...)``) each round pushes the current version to the idle owners
and returns as soon as the buffer holds ``B`` replies, whichever versions they answer
(:func:`fedgp.run.exchange.exchange_arrivals`); the others keep working. Each reply's arrival is
its wall-clock time (seconds since the first dispatch), and the step is the simulation's: the ``B``
earliest arrivals, staleness-weighted from their ``version`` field, their owners restarted from the
new version. ``history`` has ``wall_time`` instead of ``sim_time``. A reply that fails, comes late
(the engine's ``timeout``), is malformed or names another version than its owner was sent is
dropped with its reason (``result.failures``) and its owner gets the next version. Given the same
arrival order a measured run is the simulated one (tested with a grid that releases replies in a
simulated schedule's order). On an in-process engine ``"measured"`` is refused: nothing there
arrives late.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd
import torch

from fedgp.errors import EngineError, InputError, InputTypeError
from fedgp.messages import Field, Record, Replies, RoundPlan, ServerContext, Task, read_state, state_tensors
from fedgp.messages.round import ARRIVED
from fedgp.models.state import HyperState
from fedgp.rng import generator
from fedgp.strategies.base import ClientOps, Strategy
from fedgp.strategies.fgpr import FGPR, STATE
from fedgp.strategies.speeds import MEASURED, WORK, SpeedDraw, check_speeds, durations
from fedgp.strategies.staleness import Polynomial, StalenessWeight
from fedgp.strategies.surface import AttackSurface

__all__ = ["Asynchronous", "AsyncServer", "VERSION"]

#: The reply field (and task setting) holding the state version a reply was trained from.
VERSION = "version"
START = "start/"
#: How a buffer's replies are weighted (:class:`Asynchronous`'s ``weighting``).
WEIGHTINGS = ("rate", "buffer")


@dataclass(frozen=True)
class AsyncServer:
    """The asynchronous server's state: the inner strategy's server state (version ``version``),
    the clock ``time`` (simulated, or measured seconds), each owner's job in flight (``started``:
    the version it trains from, -1 when idle; ``arrival``: when it arrives, ``inf`` when idle or, in
    a measured run, not yet arrived), the owners to send the
    current version to (``dispatch``, a mask over the owners: a checkpoint's shapes are checked
    against the first state's), the replies trained but not yet arrived (``pending``, one row
    per owner, with the state each started from under ``start/``) and one record per step of the
    replies it consumed (``log``)."""

    inner: Any
    version: int
    time: float
    started: torch.Tensor
    arrival: torch.Tensor
    dispatch: torch.Tensor
    pending: dict[str, torch.Tensor]
    log: list[dict[str, torch.Tensor]]

    def arrivals(self, ids=None) -> pd.DataFrame:
        """One row per reply the server consumed: ``step`` (the version it helped make, 1-based),
        ``client`` (its id, given the roster's ``ids``, else its position), ``version`` (trained
        from), ``staleness``, ``weight`` (``s(staleness)``), ``applied`` (the weight its update took in
        the step, ``c_k s(τ)``; NaN in a result saved before fedgp recorded it) and ``arrival``
        (simulated time, or measured seconds since the first dispatch)."""
        columns = ["step", "client", "version", "staleness", "weight", "applied", "arrival"]
        if not self.log:
            return pd.DataFrame(columns=columns)
        merged = {
            k: torch.cat(
                [step.get(k, torch.full(step["step"].shape, math.nan)) for step in self.log]
            ).tolist()
            for k in columns
        }
        if ids is not None:
            merged["client"] = [ids[p] for p in merged["client"]]
        return pd.DataFrame(merged, columns=columns)


@dataclass(frozen=True)
class Asynchronous(Strategy):
    """FGPR with a buffered asynchronous server (module docstring).

    Args:
        inner: the FGPR whose local training, aggregator and server optimiser run (default
            ``FGPR()``); with ``clients_per_round=None`` (every owner is always working) and no
            summed reply fields.
        buffer: B, the replies the server waits for before it steps (``1 <= B <= K``; ``B = K`` with
            equal speeds is the synchronous round).
        staleness: ``s(τ)``, a :mod:`fedgp.strategies.staleness` rule (default ``Polynomial(0.5)``,
            ``1/√(1+τ)``).
        speeds: the owners' simulated speeds: ``None`` (all equal), one number > 0 per owner in
            registration order, or a draw from the run's seed (``LogUniform(spread=10)``); or
            ``"measured"``: no simulation, replies timed as they arrive on a Flower grid.
        work: what one job costs: ``"unit"`` (1) or ``"points"`` (the owner's rows over the mean).
        weighting: ``"rate"`` (``p_k`` over the owner's replies per step: unbiased, the default) or
            ``"buffer"`` (FedBuff's ``p_k`` renormalised over the buffer); module docstring.
    """

    inner: FGPR | None = None
    buffer: int = 1
    staleness: StalenessWeight = Polynomial()
    speeds: tuple[float, ...] | SpeedDraw | str | None = None
    work: str = "unit"
    weighting: str = "rate"

    def __post_init__(self) -> None:
        inner = FGPR() if self.inner is None else self.inner
        if not isinstance(inner, FGPR):
            raise InputTypeError(
                f"Asynchronous: inner must be an FGPR (a strategy whose replies are trained states), got "
                f"{type(inner).__name__}"
            )
        if inner.clients_per_round is not None:
            raise InputError(
                "Asynchronous: inner.clients_per_round must be None: every owner is always working, and "
                "the server steps on the first `buffer` replies"
            )
        object.__setattr__(self, "inner", inner)
        if isinstance(self.buffer, bool) or not isinstance(self.buffer, (int, np.integer)) or self.buffer < 1:
            raise InputError(
                "Asynchronous: buffer (B, the replies per server step) must be an int >= 1, "
                f"got {self.buffer!r}"
            )
        object.__setattr__(self, "buffer", int(self.buffer))
        if not isinstance(self.staleness, StalenessWeight):
            raise InputTypeError(
                "Asynchronous: staleness must be a fedgp.strategies staleness rule (Polynomial(a=0.5), "
                f"Hinge(), Constant()), got {self.staleness!r}"
            )
        if self.work not in WORK:
            raise InputError(f"Asynchronous: work must be one of {WORK}, got {self.work!r}")
        if self.weighting not in WEIGHTINGS:
            raise InputError(f"Asynchronous: weighting must be one of {WEIGHTINGS}, got {self.weighting!r}")
        object.__setattr__(self, "speeds", check_speeds(self.speeds))

    # -- server -----------------------------------------------------------------------------------
    @property
    def arrival_driven(self) -> bool:
        """Whether the run consumes replies as they arrive (``speeds="measured"``): the round loop
        then exchanges through :func:`fedgp.run.exchange.exchange_arrivals`."""
        return isinstance(self.speeds, str) and self.speeds == MEASURED

    def awaited(self, server: AsyncServer) -> int:
        """New replies a measured step waits for: ``B`` less those arrived and not yet consumed."""
        return self.buffer - int(torch.isfinite(server.arrival).sum())

    def awaiting(self, server: AsyncServer) -> torch.Tensor:
        """``(K,)`` bool: the owners whose job is out and has not arrived (not those the next round
        sends the current version to)."""
        return (server.started >= 0) & ~torch.isfinite(server.arrival) & ~server.dispatch

    def sent_versions(self, server: AsyncServer) -> torch.Tensor:
        """``(K,)``: the version each owner's job in flight was sent (-1: idle), which its reply's
        ``version`` must say."""
        return server.started.clone()

    @property
    def keeps_client_memory(self) -> bool:
        return self.inner.keeps_client_memory

    def personal_names(self, spec) -> frozenset[str]:
        return self.inner.personal_names(spec)

    def kept_names(self, spec) -> frozenset[str]:
        return self.inner.kept_names(spec)

    def reply_fields(self, ctx: ServerContext) -> dict[str, Field]:
        """The inner FGPR's reply and the version it was trained from (individual)."""
        return {**self.inner.reply_fields(ctx), VERSION: Field()}

    def initialize(self, ctx: ServerContext, rng: np.random.Generator) -> AsyncServer:
        k = ctx.num_clients
        if self.buffer > k:
            raise InputError(
                f"Asynchronous: buffer={self.buffer} is more than the {k} registered clients; a server step "
                f"needs B <= K replies (B = K is the synchronous round)"
            )
        if self.arrival_driven:  # nothing has arrived yet, and nobody knows when it will
            took = torch.full((k,), torch.inf, dtype=torch.float64)
        else:
            took = durations(self.speeds, self.work, ctx)  # refuses speeds of the wrong length
        fields = self.inner.reply_fields(ctx)
        pending = {n: torch.zeros((k, *f.shape), dtype=f.dtype) for n, f in fields.items()}
        pending.update({START + n[len(STATE) :]: pending[n].clone() for n in fields if n.startswith(STATE)})
        return AsyncServer(
            self.inner.initialize(ctx, rng),
            0,
            0.0,
            torch.zeros(k, dtype=torch.long),
            took.clone(),
            torch.ones(k, dtype=torch.bool),
            pending,
            [],
        )

    def configure(
        self, rnd: int, server: AsyncServer, ctx: ServerContext, rng: np.random.Generator
    ) -> RoundPlan:
        """The current version, to the owners that start from it (everyone in round 0)."""
        plan, weights = self._inner_plan(rnd, server, ctx, rng)
        who = torch.nonzero(server.dispatch).flatten()
        shared = Record(plan.shared.tensors, {**plan.shared.settings, VERSION: int(server.version)})
        return RoundPlan(who, weights[who], shared, Record(), {**plan.replies, VERSION: Field()})

    def _inner_plan(
        self, rnd: int, server: AsyncServer, ctx: ServerContext, rng: np.random.Generator
    ) -> tuple[RoundPlan, torch.Tensor]:
        """The inner strategy's plan of round ``rnd`` and each owner's weight in it (``(K,)``): the
        weights a buffer's replies take, renormalised over it (``WeightedFGPR``'s forced ones too)."""
        plan = self.inner.configure(rnd, server.inner, ctx, rng)
        name = type(self.inner).__name__
        if plan.personal.tensors:
            raise InputError(
                f"Asynchronous: {name}'s plan has personal rows {sorted(plan.personal.tensors)}; the "
                "asynchronous server sends every owner the shared state"
            )
        if not torch.equal(plan.participants, torch.arange(ctx.num_clients)):
            raise InputError(f"Asynchronous: {name}'s plan must take every owner once, in registration order")
        return plan, plan.weights

    def aggregate(
        self, rnd: int, server: AsyncServer, plan: RoundPlan, replies: Replies, ctx: ServerContext
    ) -> tuple[AsyncServer, dict[str, Any]]:
        """File the replies just trained, take the ``B`` earliest arrivals, step the inner strategy
        on their staleness-weighted updates, and restart their owners from the new version."""
        spec, theta = ctx.spec, self.inner.global_state(server.inner)
        started, arrival = server.started.clone(), server.arrival.clone()
        pending = {k: v.clone() for k, v in server.pending.items()}
        who = replies.participants
        sent = replies[VERSION]
        expected = started[who] if self.arrival_driven else torch.full_like(who, server.version)
        if not bool((sent == expected).all()):
            raise EngineError(
                f"Asynchronous: replies of round {rnd + 1} say they were trained from versions "
                f"{sorted(set(sent.tolist()))}, but versions {sorted(set(expected.tolist()))} were sent"
            )
        for name, value in state_tensors(theta, START).items():  # what this round's owners start from
            if name in pending:
                pending[name][plan.participants] = value
        for name, rows in replies.individual.items():
            if name in pending:
                pending[name][who] = rows
        if self.arrival_driven:
            arrival[who] = replies[ARRIVED]
            lost = torch.tensor(sorted(replies.failures), dtype=torch.long)
        else:
            lost = plan.participants[~torch.isin(plan.participants, who)]
        started[lost], arrival[lost] = -1, torch.inf  # failed: idle until the next version
        busy = int(torch.isfinite(arrival).sum())  # arrived (measured) or working (simulated)
        if busy == 0:
            raise EngineError("Asynchronous: no owner is working: every job of the last versions failed")
        take = torch.sort(arrival, stable=True).indices[: min(self.buffer, busy)]  # ties: registration order
        now = float(arrival[take[-1]])
        tau = server.version - started[take]
        factor = self.staleness(tau)
        _, base = self._inner_plan(rnd, server, ctx, generator(ctx.seed, "configure", rnd))  # as the run's
        weights = base[take]
        if len(take) < ctx.num_clients:
            weights = weights * (base.sum() / weights.sum())
        scale = factor * self._importance(server, take, base, weights)
        individual = {n: pending[n][take] for n in self.inner.reply_fields(ctx)}
        individual.update(self._rebased(spec, theta, pending, take, tau, scale))
        buffered = Replies(take, weights, individual, {}, dict(replies.failures), torch.arange(len(take)))
        inner_plan = RoundPlan(take, weights, plan.shared, Record(), self.inner.reply_fields(ctx))
        new_inner, metrics = self.inner.aggregate(rnd, server.inner, inner_plan, buffered, ctx)
        version = server.version + 1
        log = {
            "step": torch.full((len(take),), version),
            "client": take.clone(),
            "version": started[take].clone(),
            "staleness": tau,
            "weight": factor,
            "applied": weights * scale,
            "arrival": arrival[take].clone(),
        }
        started[take], arrival[take] = -1, torch.inf
        restart = started < 0
        started[restart] = version
        if not self.arrival_driven:
            arrival[restart] = now + durations(self.speeds, self.work, ctx)[restart]
        state = AsyncServer(new_inner, version, now, started, arrival, restart, pending, [*server.log, log])
        tf = tau.to(torch.float64)
        clock = "wall_time" if self.arrival_driven else "sim_time"
        metrics = {**metrics, clock: now, "buffered": len(take)}
        metrics.update(staleness_mean=float(tf.mean()), staleness_max=int(tau.max()))
        return state, metrics

    def _importance(self, server: AsyncServer, take, base, weights) -> torch.Tensor:
        """What turns the buffer's renormalised ``weights`` into ``c_k`` (``"rate"``: ``p_k / r_k``,
        ``r_k`` the owner's replies consumed per step, this one included); ones for ``"buffer"``."""
        if self.weighting == "buffer":
            return torch.ones(len(take), dtype=torch.float64)
        consumed = torch.cat([*(step["client"] for step in server.log), take])
        rate = torch.bincount(consumed, minlength=len(base))[take].to(torch.float64) / (server.version + 1)
        return base[take].to(torch.float64) / (rate * weights.to(torch.float64))

    def _rebased(self, spec, theta: HyperState, pending, take, tau, scale) -> dict[str, torch.Tensor]:
        """The replies' states as the step applies them: the current state plus ``scale`` (``s(τ)``,
        times the importance of ``"rate"``) times the move each made from the state it started from
        (raw parameters); a fresh reply of scale 1 as it came."""
        stale = (tau > 0) | (scale != 1)
        if not bool(stale.any()):
            return {}
        rows = take[stale]
        current = theta.expand(len(rows))
        base = state_tensors(current, STATE)  # what no reply carries (personal values) stays as it is
        trained = {k: pending[k][rows] for k in pending if k.startswith(STATE)}
        began = {STATE + k[len(START) :]: pending[k][rows] for k in pending if k.startswith(START)}
        trained = read_state({**base, **trained}, spec, STATE)
        start = read_state({**base, **began}, spec, STATE)
        raw_now, raw_trained, raw_start = spec.to_raw(current), spec.to_raw(trained), spec.to_raw(start)
        scale = scale[stale]
        moved = {
            k: raw_now[k] + scale.reshape(-1, *([1] * (v.dim() - 1))) * (raw_trained[k] - raw_start[k])
            for k, v in raw_now.items()
        }
        rebased = state_tensors(spec.from_raw(HyperState(moved, spec.event_shapes)), STATE)
        out = {}
        for name in pending:
            if name.startswith(STATE):
                column = pending[name][take].clone()
                column[stale] = rebased[name]
                out[name] = column
        return out

    def attack_surface(self, plan, personal, replies, spec) -> AttackSurface | None:
        return self.inner.attack_surface(plan, personal, replies, spec)

    def configure_personal(
        self, server: AsyncServer, ctx: ServerContext, positions: torch.Tensor
    ) -> tuple[Record, Record]:
        return self.inner.configure_personal(server.inner, ctx, positions)

    def global_state(self, server: AsyncServer) -> HyperState:
        return self.inner.global_state(server.inner)

    def client_view(self) -> Asynchronous:
        """The inner strategy's client view; the speeds stay with the server."""
        return replace(self, inner=self.inner.client_view(), speeds=None)

    # -- client -----------------------------------------------------------------------------------
    def local_update(self, ops: ClientOps, task: Task) -> dict[str, torch.Tensor]:
        """The inner FGPR's reply, and the version it was trained from."""
        reply = self.inner.local_update(ops, task)
        version = task.setting(VERSION)
        if version is None:
            raise InputError(f"Asynchronous: the train task of round {task.round + 1} carries no {VERSION!r}")
        return {**reply, VERSION: torch.full((len(ops.indices),), float(version), dtype=torch.float64)}

    def personal_state(self, ops: ClientOps, task: Task) -> tuple[HyperState, torch.Tensor]:
        return self.inner.personal_state(ops, task)
