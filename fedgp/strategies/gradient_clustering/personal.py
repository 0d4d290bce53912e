"""What the three gradient-clustering strategies share: a personal state per client, stepped by
the server with an optional momentum, and prediction from each client's own state.

There is no global model: the server keeps client i's state x_i (in a deployment the client would
keep it; fedgp's clients are stateless between rounds, so the server holds it and sends it back).
Each round client i's state moves by ``x_i ← x_i − η · buf_i`` in raw units, where ``buf_i`` is
the direction the algorithm gives it (a TC output or a cluster centre) passed through the momentum:

* ``momentum = 0`` (the default): ``buf = d``. Exact-GP gradients on full local data are
  deterministic (σ = 0 in the paper's A6), so the variance reduction momentum exists for buys
  nothing (digest §6.3).
* ``momentum_kind = "ema"`` (the default kind, the authors' synthetic code):
  ``buf ← (1 − β) d + β buf``. It keeps the long-run step at η, so switching it on does not
  change which η is stable.
* ``momentum_kind = "heavy_ball"`` (the authors' ``mnist_byz``: SGD momentum on the TC output):
  ``buf ← β buf + d``; the long-run step grows to η/(1 − β).

Both start with ``buf = d`` at a client's first step, as both codes do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from fedgp.clustering import QuantileRadius, Radius
from fedgp.errors import InputError
from fedgp.messages import Record, ServerContext, Task, state_tensors
from fedgp.models.spec import GPSpec
from fedgp.models.state import HyperState
from fedgp.strategies.base import COLD_START, ClientOps, Strategy, given_or_best_state
from fedgp.strategies.gradient_clustering.blocks import Blocks, check_blocks, resolve_blocks
from fedgp.strategies.gradient_clustering.state import CANDIDATES, STATE, PersonalState

__all__ = ["PersonalStrategy"]


@dataclass(frozen=True)
class PersonalStrategy(Strategy):
    """Base of the gradient-clustering strategies (settings shared by all three).

    Args:
        lr: η, the step on each client's raw parameters (η ≤ 1/L for the theory; the digest
            suggests 0.9 / the largest per-client curvature).
        momentum: β of the step's momentum (0: none).
        momentum_kind: ``"ema"`` or ``"heavy_ball"`` (see the module docstring).
        blocks: which trained hyper-parameters are clustered together
            (:mod:`~fedgp.strategies.gradient_clustering.blocks`).
        iterations: M, Threshold-Clustering's inner rounds.
        radius: TC's radius rule (default: 0.99 × the 0.2-quantile of the distances).
        batch_size: gradients on minibatches of this size (``None``: all local data, deterministic).
        init: every client's starting state (batch ``(N,)``, constrained); default the spec's.
    """

    lr: float = 0.1
    momentum: float = 0.0
    momentum_kind: str = "ema"
    blocks: str | tuple = "separate"
    iterations: int = 10
    radius: Radius = field(default_factory=QuantileRadius)
    batch_size: int | None = None
    init: HyperState | None = None

    def __post_init__(self) -> None:
        name = type(self).__name__
        if not (isinstance(self.lr, (int, float)) and self.lr > 0 and math.isfinite(self.lr)):
            raise InputError(f"{name}: lr must be a finite number > 0, got {self.lr!r}")
        if not 0.0 <= self.momentum < 1.0:
            raise InputError(f"{name}: momentum must be in [0, 1), got {self.momentum}")
        if self.momentum_kind not in ("ema", "heavy_ball"):
            raise InputError(
                f"{name}: momentum_kind must be 'ema' or 'heavy_ball', got {self.momentum_kind!r}"
            )
        check_blocks(self.blocks)
        if not isinstance(self.blocks, str):
            object.__setattr__(self, "blocks", tuple(tuple(b) for b in self.blocks))
        if isinstance(self.iterations, bool) or not isinstance(self.iterations, int) or self.iterations < 1:
            raise InputError(f"{name}: iterations must be an int >= 1, got {self.iterations!r}")
        if not isinstance(self.radius, Radius):
            raise InputError(f"{name}: radius must be a fedgp.clustering radius rule, got {self.radius!r}")
        if self.batch_size is not None and self.batch_size < 2:
            raise InputError(f"{name}: batch_size must be >= 2 or None, got {self.batch_size}")

    # -- server ---------------------------------------------------------------------------------
    def _blocks(self, spec: GPSpec) -> Blocks:
        return resolve_blocks(spec, self.blocks)

    def initialize(self, ctx: ServerContext, rng: np.random.Generator) -> PersonalState:
        n = ctx.num_clients
        blocks = self._blocks(ctx.spec)
        if self.init is None:
            states = ctx.spec.initial_state().expand(n).clone()
        else:
            if tuple(self.init.batch_shape) != (n,) or set(self.init) != set(ctx.spec.names):
                raise InputError(
                    f"{type(self).__name__}: init must hold one state per client, batch ({n},), with the "
                    f"spec's names; got batch {tuple(self.init.batch_shape)}"
                )
            states = self.init.clone()
        width = blocks.width
        return PersonalState(
            states,
            torch.zeros(n, width, dtype=torch.float64),
            torch.zeros(n, dtype=torch.bool),
            torch.full((n, len(blocks.columns)), -1, dtype=torch.long),
        )

    def step(
        self, server: PersonalState, spec: GPSpec, who: torch.Tensor, direction: torch.Tensor
    ) -> PersonalState:
        """``x_i ← x_i − η buf_i`` for the clients ``who`` with directions ``(len(who), D)``.

        A step that would leave the GP undefined (a value non-finite or on its constraint's bound,
        e.g. a lengthscale whose softplus underflows to 0) is not taken: the client keeps its state
        and buffer. Otherwise one Byzantine client's state could make every client that evaluates
        it fail."""
        blocks = self._blocks(spec)
        beta = self.momentum
        old = server.buffer[who]
        if self.momentum_kind == "ema":
            moved = (1 - beta) * direction + beta * old
        else:
            moved = beta * old + direction
        buf = torch.where(server.started[who].unsqueeze(1), moved, direction)
        raw = spec.to_raw(server.states.index(who))
        flat = blocks.flatten(raw, (len(who),)) - self.lr * buf
        stepped = spec.from_raw(HyperState({**dict(raw), **blocks.unflatten(flat)}, raw.event_shapes))
        ok = _defined(spec, stepped)
        who, buf = who[ok], buf[ok]
        values = {}
        for name, value in server.states.items():
            value = value.clone()
            if name in blocks.names:
                value[who] = stepped[name][ok]
            values[name] = value
        buffer, started = server.buffer.clone(), server.started.clone()
        buffer[who], started[who] = buf, True
        states = HyperState(values, server.states.event_shapes)
        return replace(server, states=states, buffer=buffer, started=started)

    def configure_personal(
        self, server: PersonalState, ctx: ServerContext, positions: torch.Tensor
    ) -> tuple[Record, Record]:
        """A known client gets its own state; a new one every client's, to pick the best fit, and
        a new client with no data (a cold start) the state of the client with the most training
        points (ties: the first)."""
        if bool((positions >= 0).all()):
            own = {**state_tensors(server.states.index(positions), STATE), "cluster": positions.clone()}
            return Record({}, {"personal": "own"}), Record(own)
        cluster = torch.where(positions >= 0, positions, torch.full_like(positions, -1))
        shared = {**state_tensors(server.states, CANDIDATES), COLD_START: ctx.sizes.argmax()}
        return Record(shared, {"personal": "choose"}), Record({"cluster": cluster})

    def global_state(self, server: PersonalState) -> HyperState:
        """Every client's personal state, batch ``(N,)`` (there is no global model)."""
        return server.states

    def describe(self, server: PersonalState) -> dict[str, float]:
        return {}  # N personal states would be N × |θ| columns; read them from result.state

    # -- client ---------------------------------------------------------------------------------
    def personal_state(self, ops: ClientOps, task: Task) -> tuple[HyperState, torch.Tensor]:
        """Its own state (the cluster index is its position); a client the server never saw picks
        the personal state with the lowest NLL on its own data."""
        return given_or_best_state(ops, task, "own", STATE, CANDIDATES)


def _defined(spec: GPSpec, states: HyperState) -> torch.Tensor:
    """Per state of a batch ``(B,)``: every value finite and strictly inside its constraint."""
    ok = torch.ones(states.batch_shape, dtype=torch.bool)
    for p in spec.params:
        value = states[p.name].reshape(len(ok), -1)
        good = torch.isfinite(value)
        if p.constraint is not None:
            lower = torch.as_tensor(p.constraint.lower_bound, dtype=value.dtype)
            upper = torch.as_tensor(p.constraint.upper_bound, dtype=value.dtype)
            good &= (value > lower) & (value < upper)
        ok &= good.all(dim=1)
    return ok
