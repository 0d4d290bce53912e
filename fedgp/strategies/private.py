"""DP-FGPR: FGPR's rounds with client-level differential privacy (DP-FedAvg, McMahan et al. 2018,
"Learning Differentially Private Recurrent Language Models", Algorithm 1 with a fixed denominator).

Each round every client joins independently with probability ``rate`` (Poisson sampling). A
participant trains as FGPR's clients do, and replies only its *update* in GPyTorch's raw
(unconstrained) parameters of the standardised model, clipped to L2 norm ``clip`` over all its
trainable parameters, as a *summed* field: the server sees the sum of the clipped updates, never
one client's. The server adds Gaussian noise of standard deviation ``noise * clip`` to every
trainable coordinate of that sum and divides by the expected number of participants,
``rate * K`` (a fixed weight: a client's size never enters, so it neither leaks nor raises the
sensitivity). One client then moves the noisy sum by at most ``clip``: the round is the sampled
Gaussian mechanism of noise multiplier ``noise``, which :mod:`fedgp.run.privacy` accounts for.
The noisy mean update is FGPR's pseudo-gradient: its server optimiser (FedAdam by default) steps
on it, or the server takes it as it is (FedAvg).

Where the noise is added is a choice (``noise_at``). ``"server"`` (central DP): the server draws
it, trusted with the un-noised sum. ``"clients"`` (distributed DP): each participant adds its share,
N(0, (noise·clip)²/``noise_shares``) per trainable coordinate, to its clipped update before it is
summed, so a sum of at least ``noise_shares`` contributions already carries the full noise and
the server — with secure aggregation on Flower, which shows it only that sum — never sees an
un-noised one. A round with fewer contributions m is topped up by the server with the missing
variance (1 − m/``noise_shares``)·(noise·clip)²: what is released always carries the full noise,
and the history's ``noise_topup`` column says in which rounds the server alone saw less.

The noise is drawn from a generator seeded by the operating system's randomness
(``secrets``), so that no one who knows the run's seed can remove it; ``reproducible=True`` seeds
it from the run's seed instead, for tests and benchmarks, and voids the guarantee. Like Opacus
outside its ``secure_mode``, the sampler is torch's floating-point Gaussian, not hardened against
attacks on floating-point noise (Mironov 2012).

Nothing else leaves a participant during training: no loss, no size. A client's personalised
posterior is computed on its own data and never leaves it.

Personal hyper-parameters (``FGPR(personal=...)``) stay with their owners as under FGPR: each
participant trains them with the shared ones from its own kept values and keeps the result
(:mod:`fedgp.strategies.memory`); its reply, clipping and noise cover the *shared* hyper-parameters
only, and the server's personal values (what a new owner starts from) never move. The accounting is
unchanged: what is released is the noised sum of the clipped shared updates, and one client moves it
by at most ``clip`` (the L2 bound on its shared update vector) whatever its personal values, which
shape its update but are never released (like its posterior, they are the owner's own, outside what
the guarantee covers).
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from fedgp.aggregators import WeightedMean
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
from fedgp.models.state import HyperState
from fedgp.rng import generator
from fedgp.strategies.base import ClientOps, Strategy
from fedgp.strategies.fgpr import FGPR, STATE, _keep
from fedgp.strategies.memory import memory_of
from fedgp.strategies.personal import keep, with_kept
from fedgp.strategies.server import ServerState

__all__ = ["DPFGPR", "clip_updates"]

UPDATE = "update/"


def clip_updates(delta: HyperState, clip: float) -> tuple[HyperState, torch.Tensor]:
    """Each client's update (batch ``(B,)``) scaled to L2 norm at most ``clip`` over all its
    parameters, and the norms before clipping."""
    norms = torch.sqrt(sum((v.reshape(v.shape[0], -1) ** 2).sum(dim=1) for v in delta.values()))
    # Within the bound an update is kept exactly (clip / norm can round below 1 when they are equal).
    ratio = clip / torch.clamp(norms, min=torch.finfo(norms.dtype).tiny)
    scale = torch.where(norms <= clip, torch.ones_like(ratio), ratio)
    return delta.map(lambda v, e: v * scale.reshape(-1, *([1] * (v.dim() - 1)))), norms


@dataclass(frozen=True)
class DPFGPR(Strategy):
    """FGPR with client-level differential privacy (module docstring). Built by the run from
    ``fit(spec, fed, fedgp.run.ClientDP(FGPR(), ...))``; use that, not this.

    Args:
        inner: the FGPR whose local training and server optimiser run (its aggregator must be
            the default mean in raw space; its ``clients_per_round`` ``None``: sampling is ``rate``).
        clip: C, the L2 bound on one client's update (raw parameters, standardised model).
        noise: z, the noise multiplier: the sum gets N(0, (z C)²) per trainable coordinate.
        rate: q, each client's probability of joining a round (Poisson sampling); 1 = everyone.
        reproducible: draw the noise from the run's seed (tests, benchmarks; no guarantee).
        noise_at: ``"server"`` (central DP) or ``"clients"`` (distributed DP: each participant adds
            its share; module docstring).
        noise_shares: with ``"clients"``, the number of contributions whose shares make the full
            noise (each adds 1/``noise_shares`` of its variance).
    """

    inner: FGPR
    clip: float
    noise: float
    rate: float = 1.0
    reproducible: bool = False
    noise_at: str = "server"
    noise_shares: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.inner, FGPR):
            raise InputTypeError(f"DPFGPR: inner must be an FGPR, got {type(self.inner).__name__}")
        check_settings(self, clip="positive", noise="nonnegative")
        if not 0.0 < self.rate <= 1.0:
            raise InputError(f"DPFGPR: rate (the sampling probability) must be in (0, 1], got {self.rate}")
        if self.noise_at not in ("server", "clients"):
            raise InputError(f"DPFGPR: noise_at must be 'server' or 'clients', got {self.noise_at!r}")
        if isinstance(self.noise_shares, bool) or not isinstance(self.noise_shares, (int, np.integer)):
            raise InputTypeError(f"DPFGPR: noise_shares must be an int, got {self.noise_shares!r}")
        if self.noise_shares < 1 or (self.noise_at == "server" and self.noise_shares != 1):
            raise InputError(
                f"DPFGPR: noise_shares must be at least 1 (1 with noise_at='server'), got {self.noise_shares}"
            )
        aggregator = self.inner.aggregator
        if self.inner.average_space == "constrained" or (
            aggregator is not None
            and not (isinstance(aggregator, WeightedMean) and aggregator.space == "raw")
        ):
            raise InputError(
                "DPFGPR: the clipped updates are summed in raw space; the FGPR's aggregator must be the "
                f"default mean in raw space, got {self.inner.state_aggregator!r}"
            )
        if self.inner.shrink is not None:
            raise InputError(
                "DPFGPR: FGPR(shrink=...) is not supported under ClientDP yet: the clipped update would "
                "not carry each owner's offset from the shared value (fedgp.strategies.shrinkage)"
            )
        if self.inner.clients_per_round is not None:
            raise InputError(
                "DPFGPR: give the sampling as ClientDP(rate=...), not FGPR(clients_per_round=...): the "
                "accountant must know the sampling"
            )

    @property
    def keeps_client_memory(self) -> bool:
        """Owners keep the inner FGPR's personal hyper-parameters between rounds."""
        return self.inner.keeps_client_memory

    def personal_names(self, spec) -> frozenset[str]:
        """The inner FGPR's personal hyper-parameters: never clipped, noised or replied."""
        return self.inner.personal_names(spec)

    # -- server -----------------------------------------------------------------------------------
    def initialize(self, ctx: ServerContext, rng: np.random.Generator) -> HyperState | ServerState:
        return self.inner.initialize(ctx, rng)

    def configure(self, rnd: int, server, ctx: ServerContext, rng: np.random.Generator) -> RoundPlan:
        k = ctx.num_clients
        chosen = np.arange(k) if self.rate >= 1.0 else np.flatnonzero(rng.random(k) < self.rate)
        participants = torch.from_numpy(chosen).to(torch.long)
        weights = torch.full((len(chosen),), 1.0 / (self.rate * k), dtype=torch.float64)
        shared = Record(state_tensors(self.global_state(server), STATE))
        return RoundPlan(participants, weights, shared=shared, replies=self.reply_fields(ctx))

    def reply_fields(self, ctx: ServerContext) -> dict[str, Field]:
        """Each participant's clipped update of the shared hyper-parameters, summed: the server sees
        only the sum, then noised. Personal ones are in no reply."""
        personal = {UPDATE + name for name in self.personal_names(ctx.spec)}
        return {k: f for k, f in state_fields(ctx.spec, UPDATE, summed=True).items() if k not in personal}

    def aggregate(
        self, rnd: int, server, plan: RoundPlan, replies: Replies, ctx: ServerContext
    ) -> tuple[Any, dict[str, Any]]:
        spec, theta = ctx.spec, self.global_state(server)
        raw, personal = spec.to_raw(theta), self.personal_names(spec)
        noise = self._noise_generator(ctx.seed, rnd)
        expected = self.rate * ctx.num_clients
        # The share of the noise's variance the server adds: all of it, or what the clients' shares lack.
        topup = (
            1.0
            if self.noise_at == "server"
            else max(0.0, 1.0 - len(replies.participants) / self.noise_shares)
        )
        mean = {}
        for p in spec.params:
            if p.name in personal:  # the owners' own: no update, no noise; the server's value stays
                mean[p.name] = raw[p.name]
                continue
            total = replies.sums.get(f"{UPDATE}{p.name}", torch.zeros_like(raw[p.name])).to(raw[p.name])
            if (
                p.trainable and topup > 0
            ):  # a fixed parameter's update is zero by construction: it stays fixed
                total = total + math.sqrt(topup) * self.noise * self.clip * torch.randn(
                    total.shape, generator=noise, dtype=total.dtype
                )
            mean[p.name] = raw[p.name] + total / expected
        average = _keep(spec.from_raw(HyperState(mean, spec.event_shapes)), theta, personal)
        metrics = {"noise_topup": topup} if self.noise_at == "clients" else {}
        if self.inner.server_optimizer is None:
            return average, metrics
        new = self.inner.server_optimizer.step(spec, server, average)
        return (replace(new, theta=_keep(new.theta, theta, personal)) if personal else new), metrics

    def _noise_generator(self, seed: int, rnd: int) -> torch.Generator:
        if self.reproducible:
            return torch.Generator().manual_seed(int(generator(seed, "dp-noise", rnd).integers(2**63)))
        return torch.Generator().manual_seed(secrets.randbits(63))

    def configure_personal(
        self, server, ctx: ServerContext, positions: torch.Tensor
    ) -> tuple[Record, Record]:
        return self.inner.configure_personal(server, ctx, positions)

    def global_state(self, server) -> HyperState:
        return self.inner.global_state(server)

    def client_view(self) -> DPFGPR:
        return replace(self, inner=self.inner.client_view())

    # -- client -----------------------------------------------------------------------------------
    def local_update(self, ops: ClientOps, task: Task) -> dict[str, torch.Tensor]:
        """Train from the broadcast state (with the owner's own personal values, which it keeps);
        reply the clipped update of the shared hyper-parameters, plus a noise share with
        ``noise_at="clients"``."""
        start = read_state(task.shared.tensors, ops.spec, STATE).expand(len(ops.indices))
        personal = self.personal_names(ops.spec)
        if personal:
            memory = memory_of(ops)
            start = with_kept(start, personal, memory)
        trained = ops.train(start, self.inner.local_training(task.round)).states
        if personal:
            keep(trained, personal, memory)
        before, after = ops.spec.to_raw(start), ops.spec.to_raw(trained)
        shared = [k for k in after if k not in personal]
        delta = HyperState(
            {k: after[k] - before[k] for k in shared}, {k: ops.spec.event_shapes[k] for k in shared}
        )
        clipped, _ = clip_updates(delta, self.clip)
        if self.noise_at == "clients" and self.noise > 0:
            clipped = self._noise_share(clipped, ops, task.round)
        return state_tensors(clipped, UPDATE)

    def _noise_share(self, clipped: HyperState, ops: ClientOps, rnd: int) -> HyperState:
        """Each client's share of the noise, N(0, (z C)² / noise_shares) on every trainable
        coordinate, drawn on the client (from its own generator: the OS's, or with ``reproducible``
        one keyed by (seed, round, client), so every engine draws the same)."""
        std = self.noise * self.clip / math.sqrt(self.noise_shares)
        trainable = {p.name for p in ops.spec.params if p.trainable}
        rows = []
        for key in ops.indices.tolist():
            seed = (
                int(generator(ops.seed, "dp-client-noise", rnd, key).integers(2**63))
                if self.reproducible
                else secrets.randbits(63)
            )
            rows.append(torch.Generator().manual_seed(seed))
        out = {}
        for name, value in clipped.items():
            if name not in trainable:
                out[name] = value
                continue
            draws = [torch.randn(value.shape[1:], generator=g, dtype=value.dtype) for g in rows]
            out[name] = value + std * torch.stack(draws).reshape(value.shape)
        return HyperState(out, clipped.event_shapes)

    def personal_state(self, ops: ClientOps, task: Task) -> tuple[HyperState, torch.Tensor]:
        return self.inner.personal_state(ops, task)
