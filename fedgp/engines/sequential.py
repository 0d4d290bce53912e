"""The sequential engine: one client at a time, one GPyTorch ``ExactGP``, written to be read.

This is the reference every other engine is tested against. For each client it loads the state
into a GPyTorch model, swaps in the minibatch with ``set_train_data``, and asks GPyTorch's
``ExactMarginalLogLikelihood`` for the loss; any GPyTorch mean or kernel works.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from fedgp.data.client import ClientData
from fedgp.data.owners import OwnerData
from fedgp.engines.base import InProcessEngine
from fedgp.errors import InputError
from fedgp.models.objective import factorization_guard, minibatch_nll
from fedgp.models.own_features import OwnFeaturesSpec
from fedgp.models.posterior import Prediction, predict_with_model
from fedgp.models.spec import ExactGPModel, GPSpec
from fedgp.models.state import HyperState
from fedgp.rng import draw_minibatches
from fedgp.strategies.base import TrainResult
from fedgp.strategies.local import LocalTraining
from fedgp.strategies.memory import ClientMemory, memory_of
from fedgp.strategies.personal import keep, with_kept

__all__ = ["SequentialEngine", "SequentialOps", "OwnerOps"]


def _each(states: Mapping[str, torch.Tensor], events: Mapping[str, torch.Size]):
    """The states of a batch ``(1, *extra)`` one by one, as plain ``name -> value`` mappings (a
    model loads a mapping: no state is built per local step), and ``extra``."""
    name = next(iter(states))
    batch = states[name].shape[: states[name].dim() - len(events[name])]
    if len(batch) < 1 or batch[0] != 1:
        raise InputError(f"sequential ops expect a batch of one client, got batch {tuple(batch)}")
    extra = batch[1:]
    flat = {k: v.reshape(extra.numel(), *events[k]) for k, v in states.items()}
    return [{k: v[e] for k, v in flat.items()} for e in range(extra.numel())], extra


def _batch(values: Sequence[Mapping[str, torch.Tensor]], extra: torch.Size, events) -> HyperState:
    """The inverse of :func:`_each`: one state of batch ``(1, *extra)``."""
    return HyperState(
        {k: torch.stack([v[k] for v in values]).reshape(1, *extra, *events[k]) for k in events}, events
    )


class SequentialOps:
    """:class:`~fedgp.strategies.base.ClientOps` for a single client."""

    def __init__(
        self,
        spec: GPSpec,
        model: ExactGPModel,
        client: ClientData,
        index: int,
        rnd: int,
        seed: int,
        *,
        known: tuple[torch.Tensor | None, bool, dict[str, torch.Size]] | None = None,
    ):
        self.spec, self.model, self.client = spec, model, client
        # ClientData stores float64; the model computes in the spec's precision.
        self.X, self.y = client.X.to(spec.dtype), client.y.to(spec.dtype)
        # The client's known noise, whether the spec is variational and its event shapes: read here,
        # or ``known`` by an engine that read them once (SequentialEngine.known).
        if known is None:
            known = (spec.client_noise(client), spec.variational, spec.event_shapes)
        self.noise, self.variational, self.events = known
        self.clients = (client,)
        self.indices = torch.tensor([index])
        self.sizes = torch.tensor([len(client.y)])
        self.round = rnd
        self.seed = seed
        self._trainable = [p for p in spec.params if p.trainable]
        self._params = [model.get_parameter(p.raw_name) for p in self._trainable]

    # -- helpers --------------------------------------------------------------------------------
    def _loss_and_grad(self, raw: dict[str, torch.Tensor], idx: torch.Tensor | None, what: str):
        """Loss and raw gradients on the points ``idx`` (all when ``None``)."""
        X, y, noise = (self.X, self.y, self.noise) if idx is None else self._points(idx)
        self.spec.load_raw(self.model, raw)
        with factorization_guard(self.client.id, what):
            loss = self._loss(X, y, noise)
        grads = torch.autograd.grad(loss, self._params) if self._params else ()
        return loss.detach(), {p.name: g for p, g in zip(self._trainable, grads)}

    def _loss(self, X: torch.Tensor, y: torch.Tensor, noise: torch.Tensor | None) -> torch.Tensor:
        """The local per-point loss on ``(X, y)``: the exact NLL, or a variational spec's negative ELBO
        (with the client's q(u) as :meth:`_personalise` fitted it)."""
        if self.variational:
            return self.spec.minibatch_loss(self.model, X, y, self.client.n)
        return minibatch_nll(self.model, X, y, self.spec.prior_weight, noise)

    def _personalise(self, what: str) -> None:
        """A variational spec's client fits its own q(u) to all its rows under the loaded θ."""
        if self.variational:
            with factorization_guard(self.client.id, what):
                self.spec.fit_personal(self.model, self.X, self.y)

    def _raw(self) -> dict[str, torch.Tensor]:
        """The trainable parameters' raw values as the model holds them (detached copies)."""
        return {p.name: q.detach().clone() for p, q in zip(self._trainable, self._params)}

    def _points(self, idx: torch.Tensor):
        return self.X[idx], self.y[idx], None if self.noise is None else self.noise[idx]

    def _minibatches(self, steps: int, batch: int, kind: str, stream: str) -> torch.Tensor:
        X = self.X.unsqueeze(0) if kind == "nearest" else None
        return draw_minibatches(
            self.seed, self.round, self.indices, self.sizes, steps, batch, kind, X, stream
        )[0]

    # -- ClientOps --------------------------------------------------------------------------------
    def nll(self, states: HyperState) -> torch.Tensor:
        """Per-point exact NLL of the client's full data under each state (see
        :class:`~fedgp.strategies.ClientOps`)."""
        each, extra = _each(states, self.events)
        out = torch.empty(len(each), dtype=torch.float64)
        with torch.no_grad():
            for e, values in enumerate(each):
                self.spec.load(self.model, values)
                with torch.enable_grad():
                    self._personalise("local NLL")
                with factorization_guard(self.client.id, "local NLL"):
                    out[e] = self._loss(self.X, self.y, self.noise)
        return out.reshape(1, *extra)

    def gradient(self, states: HyperState, batch_size: int | None = None) -> tuple[torch.Tensor, HyperState]:
        """Per-point NLL and its gradient with respect to the raw trainable parameters (see
        :class:`~fedgp.strategies.ClientOps`)."""
        each, extra = _each(states, self.events)
        idx = None
        if batch_size is not None and batch_size < self.client.n:
            idx = self._minibatches(1, batch_size, "uniform", "gradient")[0]
        losses, grads = [], []
        for values in each:
            self.spec.load(self.model, values)
            self._personalise("gradient")
            loss, g = self._loss_and_grad(self._raw(), idx, "gradient")
            losses.append(loss)
            grads.append({k: g.get(k, torch.zeros_like(v)) for k, v in values.items()})
        stacked = _batch(grads, extra, self.events)
        return torch.stack(losses).reshape(1, *extra).to(torch.float64), stacked

    def train(self, states: HyperState, local: LocalTraining) -> TrainResult:
        """Run the local optimiser from each state on the client's minibatches (see
        :class:`~fedgp.strategies.ClientOps`)."""
        each, extra = _each(states, self.events)
        steps = int(local.num_steps(self.sizes)[0])
        batch = int(local.batch_sizes(self.sizes)[0])
        idx = self._minibatches(steps, batch, local.minibatch, "minibatch")
        trained, losses = [], []
        for values in each:
            self.spec.load(self.model, values)  # fixed parameters stay as loaded
            start = self._raw()
            raw, opt_state, total = dict(start), local.optimizer.init(start), 0.0
            self._personalise("local q(u)")  # held during the steps (see fedgp.models.variational)
            for s in range(steps):
                loss, grads = self._loss_and_grad(raw, idx[s], f"local step {s}")
                if local.prox_mu:
                    grads = {k: g + local.prox_mu * (raw[k] - start[k]) for k, g in grads.items()}
                t = torch.tensor(self.round * steps + s)
                raw = local.optimizer.step(raw, grads, opt_state, t, None)
                total += float(loss)
            self.spec.load_raw(self.model, raw)
            trained.append(self.spec.read(self.model))
            losses.append(total / steps)
        loss = torch.tensor(losses, dtype=torch.float64).reshape(1, *extra)
        return TrainResult(_batch(trained, extra, self.events), loss, torch.tensor([steps]))

    def predict(
        self, states: HyperState, X_new: torch.Tensor | None = None, full_cov: bool = False
    ) -> list[Prediction]:
        """Condition each state (batch (1,)) on the client's training data; predict at ``X_new``
        (default: the client's test inputs)."""
        X_new = self.client.X_test if X_new is None else X_new
        if X_new is None:
            raise InputError(f"client {self.client.id!r} has no test split and no inputs were given")
        self.spec.load(self.model, {k: v[0] for k, v in states.items()})
        X_new = torch.as_tensor(X_new).to(self.spec.dtype)
        if self.variational:
            with torch.enable_grad():
                self._personalise("personal q(u)")
            return [self.spec.predictive(self.model, X_new, full_cov)]
        if self.noise is not None:  # the likelihood holds the training points' known noise
            self.model.likelihood.noise = self.noise
        return [predict_with_model(self.model, self.X, self.y, X_new, self.client.id, full_cov)]


class OwnerOps:
    """:class:`~fedgp.strategies.base.ClientOps` for an owner with own columns
    (:mod:`fedgp.models.own_features`): the strategy sees the shared spec's states only; the owner
    completes them with its own part's values, which it keeps in its memory (``ops.memory``, as a
    personal hyper-parameter is kept), trains them with the shared ones and never replies them."""

    def __init__(self, spec: OwnFeaturesSpec, client: OwnerData, index: int, rnd: int, seed: int):
        self.spec, self.clients, self.round, self.seed = spec, (client,), rnd, seed
        self.owner = spec.for_owner(client.n_own)
        own = client.own.to(spec.dtype)
        # The own columns on the unit cube of the owner's own rows (a constant column as it is).
        self._low, span = own.min(0).values, own.max(0).values - own.min(0).values
        self._span = torch.where(span > 0, span, torch.ones_like(span))
        test = None if client.X_test is None else self._joined(client.X_test, client.own_test)
        whole = ClientData._unchecked(
            X=self._joined(client.X, client.own),
            y=client.y,
            id=client.id,
            X_test=test,
            y_test=client.y_test,
            noise=client.noise,
            metadata=client.metadata,
        )
        self._ops = SequentialOps(self.owner, self.owner.build(), whole, index, rnd, seed)
        self.indices, self.sizes = self._ops.indices, self._ops.sizes
        self.memory: ClientMemory | None = None

    def _joined(self, core: torch.Tensor, own: torch.Tensor) -> torch.Tensor:
        own = (own.to(self.spec.dtype) - self._low) / self._span
        return torch.cat([core.to(self.spec.dtype), own], -1)

    def _full(self, states: HyperState) -> HyperState:
        """The shared ``states`` (one per client) with the owner's own values: kept, or initial."""
        if states.batch_shape != (1,):
            raise InputError(
                f"client {self.clients[0].id!r}: an owner with own features trains one state at a time "
                f"(FGPR), got a batch {tuple(states.batch_shape)}"
            )
        start = self.owner.initial_state()
        own = {k: start[k].unsqueeze(0) for k in self.owner.own_names}
        full = HyperState({**states, **own}, self.owner.event_shapes)
        return with_kept(full, self.owner.own_names, memory_of(self))

    def _shared(self, states: HyperState) -> HyperState:
        return HyperState({k: states[k] for k in self.spec.names}, self.spec.event_shapes)

    def nll(self, states: HyperState) -> torch.Tensor:
        """Per-point NLL under the shared states and the owner's own values."""
        return self._ops.nll(self._full(states))

    def gradient(self, states: HyperState, batch_size: int | None = None) -> tuple[torch.Tensor, HyperState]:
        """Per-point NLL and its gradient in the shared hyper-parameters (the own ones held)."""
        loss, grads = self._ops.gradient(self._full(states), batch_size)
        return loss, self._shared(grads)

    def train(self, states: HyperState, local: LocalTraining) -> TrainResult:
        """Train the shared and the own hyper-parameters together; keep the own ones, return the shared."""
        result = self._ops.train(self._full(states), local)
        keep(result.states, self.owner.own_names, memory_of(self))
        return TrainResult(self._shared(result.states), result.loss, result.steps)

    def predict(
        self, states: HyperState, X_new: torch.Tensor | None = None, full_cov: bool = False
    ) -> list[Prediction]:
        """The owner's posterior at ``X_new`` (core then own columns; default its test rows)."""
        if X_new is not None:
            X_new, width = torch.as_tensor(X_new), len(self.spec.core)
            X_new = self._joined(X_new[:, :width], X_new[:, width:])
        return self._ops.predict(self._full(states), X_new, full_cov)


class SequentialEngine(InProcessEngine):
    """Runs clients one by one with a single reusable GPyTorch model.

    Options (configured by :class:`fedgp.engines.Sequential`): ``loopback`` (every message and reply
    through bytes) and ``timeout`` (seconds a client may take; a later reply is dropped as a failure
    of that round).
    """

    name = "sequential"
    chunk_size = 1

    def __init__(self, spec: GPSpec, clients: Sequence[ClientData], seed: int = 0, **options):
        super().__init__(spec, clients, seed, **options)
        self.model = spec.build()
        self._known: dict[int, tuple] = {}  # by position: what SequentialOps reads of spec and client

    def data_changed(self) -> None:
        """The clients' data (their known noise among them) are in new units: read them again."""
        self._known.clear()

    def known(self, i: int) -> tuple[torch.Tensor | None, bool, dict[str, torch.Size]]:
        """What the ops of client ``i`` read of the spec and of the client, read once per engine (and
        again after the data change units), not once per task."""
        if i not in self._known:
            spec = self.spec
            self._known[i] = (spec.client_noise(self.clients[i]), spec.variational, spec.event_shapes)
        return self._known[i]

    def abandoned(self) -> None:
        """The cut-off task may still write into the shared model: the next clients get a new one."""
        self.model = self.spec.build()

    def ops(self, clients: torch.Tensor, rnd: int) -> SequentialOps:
        if len(clients) != 1:
            raise InputError(f"the sequential engine runs one client at a time, got {len(clients)}")
        i = int(clients[0])
        client, key = self.clients[i], int(self.keys[i])
        if isinstance(self.spec, OwnFeaturesSpec) and isinstance(client, OwnerData):
            ops = OwnerOps(self.spec, client, key, rnd, self.seed)
            ops.memory = ClientMemory(self.memory, ops.indices)  # what it predicts with outside a task
            return ops
        return SequentialOps(self.spec, self.model, client, key, rnd, self.seed, known=self.known(i))
