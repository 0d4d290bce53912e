"""One clustered federated GP: k cluster GPs, and the algorithms as ways to initialise, assign and aggregate.

A cluster is a GP component — its own mean, kernel and noise hyper-parameters. Mixed linear
regression is a linear mean with the zero kernel (a noise-only GP); a linear kernel adds
within-cluster variation (Bayesian linear regression per cluster); any GPyTorch kernel gives a
clustered FGPR. A client belongs to the component with the highest marginal likelihood of its own
data. The algorithms of Ghosh et al. (IFCA), Su, Xu & Yang (two-phase) and their baselines differ
only in four pluggable parts:

* **initialiser** — :class:`RandomInit`, :class:`SpecInit`, :class:`GivenInit` (e.g. the true θ*:
  the oracle), :class:`OneShotInit` (k-means on local fits) and
  :class:`~fedgp.strategies.moment_descent.MomentDescentInit` (Phase 1, federated moment descent).
  Initialisers may need communication rounds of their own; they run first, inside ``fit``'s rounds.
* **assigner** — :class:`HardAssigner` (argmin local NLL, or squared error), :class:`SoftAssigner`
  (responsibilities ∝ marginal likelihood), :class:`FixedAssigner` (labels fixed, e.g. by one-shot).
* **local solver** — :class:`GradientDescent` (s full-batch steps: FedAvg), :class:`ProximalSolve`
  (FedProx), :class:`LocalTrainingSolver` (minibatch Adam/SGD as FGPR), :class:`GradientSolver`
  (one gradient, for IFCA's gradient averaging).
* **aggregator** — :class:`GlobalWeighted` (Su–Xu–Yang: ``θ_j ← Σ_i (n_i/N) θ_{ij}`` over *all*
  clients, unchanged blocks included), :class:`ClusterAverage` (IFCA model averaging within each
  estimated cluster), :class:`GradientStep` (IFCA gradient averaging).

Named presets: :func:`fedavg` (k = 1), :func:`ifca`, :func:`oracle`, :func:`one_shot`,
:func:`two_phase`. :class:`~fedgp.strategies.IFCA` is also a configuration of this class.

For the noise-only linear model the assignment and the local solvers have closed forms, evaluated
on the client's own data (``ClientOps.clients``) — exact, and much faster than the generic GPyTorch
path, which they match to rounding error (tests check both). ``closed_form="never"`` forces the
generic path; ``"always"`` refuses a spec without closed forms.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from fedgp.models.spec import GPSpec
from fedgp.models.state import HyperState
from fedgp.rng import generator
from fedgp.strategies.base import (
    ClientOps,
    Reply,
    RoundPlan,
    ServerContext,
    Strategy,
    average_states,
    sample_participants,
)
from fedgp.strategies.linear import LinearMeanModel, linear_model
from fedgp.strategies.local import SGD, Adam, LocalTraining

__all__ = [
    "ClusteredGP",
    "ClusteredState",
    "InitDone",
    "Initializer",
    "RandomInit",
    "SpecInit",
    "GivenInit",
    "OneShotInit",
    "Assigner",
    "HardAssigner",
    "SoftAssigner",
    "FixedAssigner",
    "LocalSolver",
    "GradientDescent",
    "ProximalSolve",
    "LocalTrainingSolver",
    "GradientSolver",
    "Aggregator",
    "GlobalWeighted",
    "ClusterAverage",
    "GradientStep",
    "fedavg",
    "ifca",
    "oracle",
    "one_shot",
    "two_phase",
    "kmeans",
]


# ==================================================================================================
# server state and payloads
# ==================================================================================================


@dataclass
class ClusteredState:
    """Server state.

    ``states``: cluster states per restart ``(R, k)``; ``assignment``: each client's latest hard
    label per restart ``(R, K)`` (-1 before it took part); ``objective``: ``Σ_i n_i min_j F_i(θ_j)
    / Σ_i n_i`` per restart; ``labels``: fixed labels ``(K,)`` when the initialiser set them
    (one-shot); ``init``: the initialiser's progress while it is still running (``None`` after);
    ``phase_round``: rounds completed in the current phase; ``init_log``: what a multi-round
    initialiser left for diagnostics (Phase 1: its anchors and their estimates at every iteration).
    """

    states: HyperState
    assignment: torch.Tensor
    objective: torch.Tensor
    labels: torch.Tensor | None = None
    init: Any = None
    phase_round: int = 0
    init_log: Any = None

    @property
    def best(self) -> int:
        return int(torch.argmin(self.objective))

    @property
    def initialising(self) -> bool:
        return self.init is not None


@dataclass(frozen=True)
class TrainPayload:
    """What clients receive in a clustered round: all cluster states, fixed labels, the model map."""

    states: HyperState
    labels: torch.Tensor | None
    model: LinearMeanModel | None
    closed: bool


@dataclass(frozen=True)
class InitPayload:
    body: Any


# ==================================================================================================
# initialisers
# ==================================================================================================


@dataclass(frozen=True)
class InitDone:
    """An initialiser's result: cluster states ``(R, k)``, optionally fixed labels ``(K,)`` and a log."""

    states: HyperState
    labels: torch.Tensor | None = None
    log: Any = None


class Initializer(ABC):
    """How the k cluster states start. Subclasses without communication return :class:`InitDone`
    from :meth:`start`; others return a progress object and run rounds through the other hooks."""

    #: communication rounds the initialiser uses (an upper bound for adaptive ones)
    def rounds(self, k: int) -> int:
        return 0

    @abstractmethod
    def start(self, ctx: ServerContext, k: int, restarts: int, rng: np.random.Generator) -> Any:
        """:class:`InitDone`, or a progress object for a multi-round initialiser."""

    def configure(
        self, progress: Any, ctx: ServerContext, rng: np.random.Generator, rnd: int
    ) -> tuple[torch.Tensor, torch.Tensor, Any]:
        raise NotImplementedError

    def local_update(self, ops: ClientOps, body: Any) -> Reply:
        raise NotImplementedError

    def aggregate(
        self, progress: Any, plan: RoundPlan, replies: Reply, ctx: ServerContext, rnd: int
    ) -> tuple[Any, dict[str, Any]]:
        raise NotImplementedError


def _perturbed_states(
    spec: GPSpec, r: int, k: int, kind: str, scale: float, center: str, rng: np.random.Generator
) -> HyperState:
    """IFCA's random initialisation, on raw values (the same draws as before the refactor)."""
    raw = spec.to_raw(spec.initial_state()).expand(r, k)
    values = {}
    for p in spec.params:
        v = raw[p.name]
        shape = tuple(v.shape)
        if p.trainable and kind == "normal":
            noise = scale * torch.from_numpy(rng.standard_normal(shape))
            v = noise if center == "zero" else v + noise
        elif p.trainable and kind == "bernoulli":
            v = scale * torch.from_numpy(rng.binomial(1, 0.5, size=shape).astype(np.float64))
        values[p.name] = v.clone()
    return spec.from_raw(HyperState(values, raw.event_shapes))


@dataclass(frozen=True)
class RandomInit(Initializer):
    """Independent random cluster states for every restart (trainable raw values only).

    ``kind="normal"``: ``center + scale · N(0, 1)``, with ``center`` the spec's initial raw values
    (``"spec"``) or zero (``"zero"``: Su–Xu–Yang's ``θ_j ~ (2/√d) N(0, I)`` with ``scale = 2/√d``).
    ``kind="bernoulli"``: ``scale · Bernoulli(½)`` (the IFCA authors' synthetic runs).
    """

    kind: str = "normal"
    scale: float = 1.0
    center: str = "spec"

    def __post_init__(self) -> None:
        if self.kind not in ("normal", "bernoulli"):
            raise ValueError(f"RandomInit kind must be 'normal' or 'bernoulli', got {self.kind!r}")
        if self.center not in ("spec", "zero"):
            raise ValueError(f"RandomInit center must be 'spec' or 'zero', got {self.center!r}")

    def start(self, ctx, k, restarts, rng):
        return InitDone(_perturbed_states(ctx.spec, restarts, k, self.kind, self.scale, self.center, rng))


@dataclass(frozen=True)
class SpecInit(Initializer):
    """Every cluster at the spec's initial state (for k = 1: plain FedAvg/FGPR from the spec)."""

    def start(self, ctx, k, restarts, rng):
        return InitDone(_perturbed_states(ctx.spec, restarts, k, "spec", 0.0, "spec", rng))


@dataclass(frozen=True)
class GivenInit(Initializer):
    """Given cluster states, batch ``(k,)`` or ``(restarts, k)`` — e.g. the true θ* (the oracle)."""

    states: HyperState = field(repr=False)

    def start(self, ctx, k, restarts, rng):
        given = self.states
        states = given if len(given.batch_shape) == 2 else given.expand(1)
        if len(given.batch_shape) == 1 and restarts > 1:
            states = given.expand(restarts)
        if tuple(states.batch_shape) != (restarts, k):
            raise ValueError(
                f"init has batch {tuple(given.batch_shape)}; expected ({k},) or ({restarts}, {k})"
            )
        missing = set(ctx.spec.names) ^ set(states)
        if missing:
            raise ValueError(f"given init states differ from the spec in {sorted(missing)}")
        return InitDone(states.clone())


def kmeans(
    points: np.ndarray, k: int, rng: np.random.Generator, restarts: int = 10, iterations: int = 100
) -> tuple[np.ndarray, np.ndarray]:
    """Lloyd's k-means with k-means++ seeding and restarts; returns (centres (k, p), labels (n,)).

    The restart with the lowest within-cluster sum of squares wins. An empty cluster is reseeded
    at the point farthest from its centre.
    """
    n = len(points)
    if n < k:
        raise ValueError(f"k-means needs at least k = {k} points, got {n}")
    best = None
    for _ in range(restarts):
        centres = [points[rng.integers(n)]]
        for _ in range(1, k):
            d2 = np.min(((points[:, None, :] - np.asarray(centres)[None]) ** 2).sum(-1), axis=1)
            total = d2.sum()
            idx = rng.choice(n, p=d2 / total) if total > 0 else rng.integers(n)
            centres.append(points[idx])
        c = np.asarray(centres, dtype=np.float64)
        labels = np.zeros(n, dtype=np.int64)
        for it in range(iterations):
            d2 = ((points[:, None, :] - c[None]) ** 2).sum(-1)
            new = d2.argmin(1)
            for j in range(k):
                if not (new == j).any():
                    far = int(d2[np.arange(n), new].argmax())
                    new[far] = j
            if it and np.array_equal(new, labels):
                break
            labels = new
            c = np.stack([points[labels == j].mean(0) for j in range(k)])
        inertia = float(((points - c[labels]) ** 2).sum())
        if best is None or inertia < best[0]:
            best = (inertia, c, labels.copy())
    return best[1], best[2]


@dataclass(frozen=True)
class OneShotProgress:
    k: int


@dataclass(frozen=True)
class OneShotBody:
    local: str
    ridge: float
    model: LinearMeanModel | None
    start: HyperState | None
    training: LocalTraining | None


@dataclass(frozen=True)
class OneShotInit(Initializer):
    """One-shot clustering (Ghosh et al. 2019; IFCA's Algorithm 1): one round of local fits, then
    k-means on the server; the k-means labels stay fixed when used with :class:`FixedAssigner`.

    ``local="least_squares"`` (linear means): each client's minimum-norm least-squares estimate of
    its mean parameters (``ridge > 0``: ridge regression) — the digest's choice when ``n_i < d``.
    ``local="train"``: each client trains the spec's initial state on its own data with
    ``training`` (a local type-II MLE) and sends the raw trainable values; the server standardises
    them before k-means (any GPyTorch kernel).
    """

    local: str = "least_squares"
    ridge: float = 0.0
    training: LocalTraining | None = None
    kmeans_restarts: int = 10

    def __post_init__(self) -> None:
        if self.local not in ("least_squares", "train"):
            raise ValueError(f"OneShotInit local must be 'least_squares' or 'train', got {self.local!r}")
        if self.local == "train" and self.training is None:
            raise ValueError("OneShotInit(local='train') needs a LocalTraining")

    def rounds(self, k):
        return 1

    def start(self, ctx, k, restarts, rng):
        if restarts != 1:
            raise ValueError("one-shot initialisation is deterministic given the data: use restarts=1")
        if self.local == "least_squares":
            linear_model(ctx.spec)  # ValueError early if the mean is not linear
        return OneShotProgress(k)

    def configure(self, progress, ctx, rng, rnd):
        model = linear_model(ctx.spec) if self.local == "least_squares" else None
        start = ctx.spec.initial_state() if self.local == "train" else None
        body = OneShotBody(self.local, self.ridge, model, start, self.training)
        return torch.arange(ctx.num_clients), ctx.weights.clone(), body

    def local_update(self, ops, body):
        if body.local == "least_squares":
            est = torch.stack([body.model.local_fit(c, body.ridge) for c in ops.clients])
            return {"estimate": est}
        result = ops.train(body.start.expand(len(ops.indices)), body.training)
        return {"estimate_state": result.states}

    def aggregate(self, progress, plan, replies, ctx, rnd):
        spec = ctx.spec
        rng = generator(ctx.seed, "one-shot k-means")
        base = spec.initial_state()
        if "estimate" in replies:
            points = replies["estimate"].numpy()
            centres, labels = kmeans(points, progress.k, rng, self.kmeans_restarts)
            model = linear_model(spec)
            states = model.with_vector(base.expand(progress.k).clone(), torch.from_numpy(centres))
        else:
            raw = spec.to_raw(replies["estimate_state"])
            names = spec.trainable_names
            flat = torch.cat([raw[n].reshape(len(plan.participants), -1) for n in names], dim=1).numpy()
            mu, sd = flat.mean(0), flat.std(0)
            sd = np.where(sd > 0, sd, 1.0)
            centres_std, labels = kmeans((flat - mu) / sd, progress.k, rng, self.kmeans_restarts)
            centres = torch.from_numpy(centres_std * sd + mu)
            values, start = dict(spec.to_raw(base.expand(progress.k).clone())), 0
            for n in names:
                size = math.prod(spec.param(n).shape)
                values[n] = centres[:, start : start + size].reshape(progress.k, *spec.param(n).shape)
                start += size
            states = spec.from_raw(HyperState(values, spec.event_shapes))
        full = torch.full((ctx.num_clients,), -1, dtype=torch.long)
        full[plan.participants] = torch.from_numpy(labels)
        sizes = np.bincount(labels, minlength=progress.k)
        metrics = {f"kmeans_size/{j}": int(s) for j, s in enumerate(sizes)}
        return InitDone(states.expand(1).clone(), full), metrics


# ==================================================================================================
# assigners
# ==================================================================================================


def _client_nll(ops: ClientOps, states: HyperState, payload: TrainPayload) -> torch.Tensor:
    """Per-point NLL of every client under every state of ``states`` (batch ``(B, *E)``)."""
    if not payload.closed:
        return ops.nll(states)
    model = payload.model
    return model.nll(ops.clients, model.vector(states), model.noise(states))


class Assigner(ABC):
    """Which cluster(s) a client updates. Returns per-point NLLs ``(B, R, k)``, responsibilities
    ``(B, R, k)`` (``None`` for hard assignment) and the hard choice ``(B, R)``."""

    @abstractmethod
    def assign(
        self, ops: ClientOps, candidates: HyperState, payload: TrainPayload
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]: ...


@dataclass(frozen=True)
class HardAssigner(Assigner):
    """The cluster with the lowest per-point NLL of the client's data (highest marginal likelihood);
    ties go to the lowest index. ``criterion="sse"`` uses the squared error ``‖y − Φθ_j‖²`` instead
    (Su–Xu–Yang's rule (8); needs a linear mean) — the same choice for a noise-only GP whose k
    components share σ²."""

    criterion: str = "nll"

    def __post_init__(self) -> None:
        if self.criterion not in ("nll", "sse"):
            raise ValueError(f"criterion must be 'nll' or 'sse', got {self.criterion!r}")

    def assign(self, ops, candidates, payload):
        nll = _client_nll(ops, candidates, payload)
        if self.criterion == "nll":
            return nll, None, nll.argmin(dim=-1)
        model = payload.model
        if model is None:
            raise ValueError("HardAssigner(criterion='sse') needs a mean linear in its parameters")
        sse = model.sse(ops.clients, model.vector(candidates))
        return nll, None, sse.argmin(dim=-1)


@dataclass(frozen=True)
class SoftAssigner(Assigner):
    """Responsibilities ``λ_ij ∝ p(y_i | θ_j)^(1/temperature)`` (uniform prior over clusters).

    Each client then updates every cluster, and the server weighs client i's change of cluster j by
    λ_ij — for one gradient step exactly gradient descent on ``Σ_j λ_ij F_i(θ_j)`` (the soft
    clustering of Li, Lu & Vaikuntanathan's formulation, Su–Xu–Yang's eq. 7 with soft λ).
    """

    temperature: float = 1.0

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError("temperature must be > 0")

    def assign(self, ops, candidates, payload):
        nll = _client_nll(ops, candidates, payload)
        sizes = ops.sizes.to(nll.dtype).reshape(-1, *([1] * (nll.dim() - 1)))
        resp = torch.softmax(-sizes * nll / self.temperature, dim=-1)
        return nll, resp, nll.argmin(dim=-1)


@dataclass(frozen=True)
class FixedAssigner(Assigner):
    """Labels that never change: given ``labels`` (one per client), or those the initialiser set
    (one-shot clustering)."""

    labels: tuple[int, ...] | None = None

    def assign(self, ops, candidates, payload):
        labels = torch.as_tensor(self.labels) if self.labels is not None else payload.labels
        if labels is None:
            raise ValueError("FixedAssigner needs labels, given or set by the initialiser (OneShotInit)")
        if bool((ops.indices < 0).any()):
            raise ValueError("FixedAssigner has no label for a client outside the federation")
        nll = _client_nll(ops, candidates, payload)
        choice = labels[ops.indices].reshape(-1, 1).expand(nll.shape[:-1]).clone()
        if bool((choice < 0).any()):
            bad = ops.indices[(choice < 0).any(dim=1)].tolist()
            raise ValueError(f"FixedAssigner: no label for clients at positions {bad}")
        return nll, None, choice


# ==================================================================================================
# local solvers
# ==================================================================================================


def _step_sizes(lr: float, units: str, model: LinearMeanModel | None, states: HyperState) -> torch.Tensor:
    """The NLL-scale step size per state: ``lr``, or ``lr · σ²`` for squared-loss units."""
    batch = tuple(states.batch_shape)
    if units == "nll":
        return torch.full(batch, float(lr), dtype=torch.float64)
    if model is None:
        raise ValueError("step sizes in squared-loss units need a mean linear in its parameters")
    return lr * model.noise(states)


def _single_lr(lrs: torch.Tensor) -> float:
    if lrs.numel() and not bool((lrs == lrs.reshape(-1)[0]).all()):
        raise ValueError(
            "squared-loss step sizes with the generic (GPyTorch) path need one noise variance for all "
            "states; fix the noise or give the step in NLL units"
        )
    return float(lrs.reshape(-1)[0])


class LocalSolver(ABC):
    """What a client does with the state(s) it updates: batch ``(B, *E)`` in, the same out."""

    returns_gradient = False

    @abstractmethod
    def solve(
        self, ops: ClientOps, states: HyperState, payload: TrainPayload
    ) -> tuple[HyperState, torch.Tensor | None]: ...


def _units_ok(units: str) -> None:
    if units not in ("nll", "squared_loss"):
        raise ValueError(f"units must be 'nll' or 'squared_loss', got {units!r}")


@dataclass(frozen=True)
class GradientDescent(LocalSolver):
    """``steps`` full-batch gradient steps on the client's per-point NLL: FedAvg's local update.

    ``units="squared_loss"`` reads ``lr`` as the step η on the squared loss ``‖y − Φθ‖²/(2n)`` of the
    mixed-regression papers (the NLL step is then ``η σ²``; exact for the noise-only GP). Closed form
    for the noise-only linear model; otherwise ``ClientOps.train`` with constant-step SGD.
    """

    lr: float = 0.05
    steps: int = 1
    units: str = "nll"

    def __post_init__(self) -> None:
        _units_ok(self.units)
        if self.steps < 1:
            raise ValueError("steps must be >= 1")

    def solve(self, ops, states, payload):
        lrs = _step_sizes(self.lr, self.units, payload.model, states)
        if payload.closed:
            model = payload.model
            theta, noise = model.vector(states), model.noise(states)
            out = model.gradient_steps(ops.clients, theta, noise, lrs, self.steps)
            return model.with_vector(states, out), None
        local = LocalTraining(
            steps=self.steps, batch_size=None, optimizer=SGD(lr=_single_lr(lrs), schedule="constant")
        )
        result = ops.train(states, local)
        return result.states, result.loss


@dataclass(frozen=True)
class ProximalSolve(LocalSolver):
    """FedProx: ``argmin_u F_i(u) + ‖u − θ‖² / (2 lr)`` (Su–Xu–Yang's FedProx with μ = 1/η).

    Exact closed form for the noise-only linear model (Lemma 1's ``(I + η XXᵀ/n)⁻¹``). Otherwise
    approximated by ``inner_steps`` full-batch Adam steps (step ``inner_lr``) on the local NLL plus
    the proximal term on the raw parameters — an inexact proximal step, as FedProx allows.
    """

    lr: float = 0.05
    units: str = "nll"
    inner_steps: int = 200
    inner_lr: float = 0.01

    def __post_init__(self) -> None:
        _units_ok(self.units)
        if not self.lr > 0:
            raise ValueError("lr must be > 0")

    def solve(self, ops, states, payload):
        lrs = _step_sizes(self.lr, self.units, payload.model, states)
        if payload.closed:
            model = payload.model
            theta, noise = model.vector(states), model.noise(states)
            out = model.proximal_step(ops.clients, theta, noise, lrs)
            return model.with_vector(states, out), None
        local = LocalTraining(
            steps=self.inner_steps,
            batch_size=None,
            optimizer=Adam(lr=self.inner_lr),
            prox_mu=1.0 / _single_lr(lrs),
        )
        result = ops.train(states, local)
        return result.states, result.loss


@dataclass(frozen=True)
class LocalTrainingSolver(LocalSolver):
    """Any :class:`~fedgp.strategies.local.LocalTraining` (minibatch Adam/SGD, epochs, FedProx μ)
    run by the engine: FGPR's and IFCA model averaging's local update."""

    local: LocalTraining = field(default_factory=LocalTraining)

    def solve(self, ops, states, payload):
        result = ops.train(states, self.local)
        return result.states, result.loss


@dataclass(frozen=True)
class GradientSolver(LocalSolver):
    """One gradient of the per-point NLL w.r.t. the raw trainable parameters (IFCA option I), on all
    local data or a minibatch of ``batch_size``. Pair it with :class:`GradientStep`."""

    batch_size: int | None = None
    returns_gradient = True

    def solve(self, ops, states, payload):
        if payload.closed and self.batch_size is None:
            model = payload.model
            grad = model.gradient(ops.clients, model.vector(states), model.noise(states))
            zeros = states.map(lambda v, e: torch.zeros_like(v))
            return model.with_vector(zeros, grad), None
        _, grads = ops.gradient(states, self.batch_size)
        return grads, None


# ==================================================================================================
# aggregators
# ==================================================================================================


@dataclass(frozen=True)
class Contributions:
    """What one cluster j of one restart receives: its members' states or gradients, their
    responsibilities λ (ones for hard assignment), their sizes, and round-wide totals."""

    values: HyperState | None
    members: torch.Tensor
    lam: torch.Tensor
    sizes: torch.Tensor
    total_size: float
    participants: int
    num_clients: int
    soft: bool


class Aggregator(ABC):
    uses_gradients = False

    @abstractmethod
    def combine(
        self, spec: GPSpec, old: HyperState, c: Contributions, model: LinearMeanModel | None
    ) -> HyperState:
        """The next state of one cluster."""


def _space_ok(space: str) -> None:
    if space not in ("constrained", "raw"):
        raise ValueError(f"average_space must be 'constrained' or 'raw', got {space!r}")


@dataclass(frozen=True)
class ClusterAverage(Aggregator):
    """IFCA model averaging: the mean of the members' states, weighted by size (``weighted``) or
    plain (the paper's formula); an empty cluster keeps its state."""

    weighted: bool = True
    average_space: str = "constrained"

    def __post_init__(self) -> None:
        _space_ok(self.average_space)

    def combine(self, spec, old, c, model):
        if len(c.members) == 0:
            return old
        w = c.sizes if self.weighted else torch.ones(len(c.members), dtype=torch.float64)
        if c.soft:
            w = w * c.lam
        if float(w.sum()) <= 0:
            return old
        return average_states(spec, c.values, w / w.sum(), old, self.average_space)


@dataclass(frozen=True)
class GlobalWeighted(Aggregator):
    """Su–Xu–Yang's aggregation: ``θ_j ← Σ_i (n_i/N) θ_{ij}`` over all participants, where a client
    not in cluster j returns ``θ_j`` unchanged — so cluster j moves by ``N_j/N`` of its members'
    average change (Lemma 1). For k = 1 it is FedAvg."""

    average_space: str = "constrained"

    def __post_init__(self) -> None:
        _space_ok(self.average_space)

    def combine(self, spec, old, c, model):
        if len(c.members) == 0:
            return old
        w = c.sizes / c.total_size
        if c.soft:
            w = w * c.lam
        states = type(old).cat([c.values, old.expand(1)])
        weights = torch.cat([w, (1.0 - w.sum()).reshape(1)])
        return average_states(spec, states, weights, old, self.average_space)


@dataclass(frozen=True)
class GradientStep(Aggregator):
    """IFCA gradient averaging: ``θ_j ← θ_j − (lr/m) Σ_{i∈S_j} g_i`` on raw values; ``m`` is all K
    clients (``"total"``, the paper), the round's participants, or the cluster's size (``"cluster"``).
    ``units="squared_loss"`` multiplies ``lr`` by the cluster's noise variance (see GradientDescent)."""

    lr: float = 0.05
    normalization: str = "total"
    units: str = "nll"
    uses_gradients = True

    def __post_init__(self) -> None:
        _units_ok(self.units)
        if self.normalization not in ("total", "participants", "cluster"):
            raise ValueError(f"unknown gradient_normalization {self.normalization!r}")

    def combine(self, spec, old, c, model):
        if len(c.members) == 0:
            return old
        denom = {
            "total": c.num_clients,
            "participants": c.participants,
            "cluster": float(c.lam.sum()) if c.soft else len(c.members),
        }[self.normalization]
        lr = self.lr if self.units == "nll" else float(_step_sizes(self.lr, self.units, model, old))
        old_raw = spec.to_raw(old)
        grads = c.values
        stepped = {}
        for p in spec.params:
            if not p.trainable:
                stepped[p.name] = old_raw[p.name]
                continue
            g = grads[p.name]
            if c.soft:
                g = g * c.lam.reshape(-1, *([1] * (g.dim() - 1)))
            stepped[p.name] = old_raw[p.name] - (lr / denom) * g.sum(0)
        return spec.from_raw(HyperState(stepped, old_raw.event_shapes))


# ==================================================================================================
# the strategy
# ==================================================================================================


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
        if self.num_clusters < 1 or self.restarts < 1:
            raise ValueError("num_clusters and restarts must be >= 1")
        if self.closed_form not in ("auto", "never", "always"):
            raise ValueError(f"closed_form must be 'auto', 'never' or 'always', got {self.closed_form!r}")
        if self.solver.returns_gradient != self.aggregator.uses_gradients:
            raise ValueError(
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
                raise ValueError(f"closed_form='always' needs a noise-only linear model: {err}") from None
            return None, False
        closed = model.noise_only and self.closed_form != "never"
        if self.closed_form == "auto" and model._kind == "generic":
            closed = False
        if self.closed_form == "always" and not closed:
            raise ValueError(
                "closed_form='always' needs the noise-only linear model: a mean linear in its "
                "parameters, ZeroKernel, a Gaussian likelihood with fixed noise, nothing else trained"
            )
        return model, closed

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
            raise ValueError(f"initial states have batch {tuple(states.batch_shape)}, expected {expected}")
        return states

    def configure(
        self, rnd: int, server: ClusteredState, ctx: ServerContext, rng: np.random.Generator
    ) -> RoundPlan:
        if server.initialising:
            participants, weights, body = self.initializer.configure(server.init, ctx, rng, rnd)
            return RoundPlan(participants, weights, InitPayload(body))
        participants, weights = sample_participants(ctx, self.clients_per_round, "uniform", rng)
        model, closed = self._model(ctx.spec)
        return RoundPlan(participants, weights, TrainPayload(server.states, server.labels, model, closed))

    def aggregate(
        self, rnd: int, server: ClusteredState, plan: RoundPlan, replies: Reply, ctx: ServerContext
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
        return self._aggregate_clusters(server, plan, replies, ctx)

    def _aggregate_clusters(self, server, plan, replies, ctx):
        spec = ctx.spec
        model, _ = self._model(spec)
        choice, best_nll = replies["choice"], replies["nll"]  # (P, R)
        resp = replies.get("resp")  # (P, R, k) for soft assignment
        values = replies["grad"] if self.aggregator.uses_gradients else replies["state"]
        sizes = ctx.sizes[plan.participants].to(torch.float64)
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
                    vals = values.index((members, r)) if len(members) else None
                else:
                    members = torch.nonzero(resp[:, r, j] > 0).flatten()
                    lam = resp[members, r, j]
                    vals = values.index((members, r, j)) if len(members) else None
                c = Contributions(
                    vals,
                    members,
                    lam,
                    sizes[members],
                    total,
                    len(plan.participants),
                    ctx.num_clients,
                    resp is not None,
                )
                row.append(self.aggregator.combine(spec, old, c, model))
            new_states.append(HyperState.stack(row))
        assignment = server.assignment.clone()
        assignment[:, plan.participants] = choice.T
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

    # -- client ---------------------------------------------------------------------------------
    def local_update(self, ops: ClientOps, payload: TrainPayload | InitPayload) -> Reply:
        if isinstance(payload, InitPayload):
            return self.initializer.local_update(ops, payload.body)
        candidates = payload.states.expand(len(ops.indices))  # (B, R, k)
        nll, resp, choice = self.assigner.assign(ops, candidates, payload)
        best = nll.gather(-1, choice.unsqueeze(-1)).squeeze(-1)
        reply: Reply = {"choice": choice, "nll": best}
        if resp is None:
            targets = candidates.gather(choice)  # (B, R)
        else:
            targets, reply["resp"] = candidates, resp
        values, loss = self.solver.solve(ops, targets, payload)
        reply["grad" if self.solver.returns_gradient else "state"] = values
        if loss is not None:
            reply["loss"] = loss
        return reply

    def personal_state(self, server: ClusteredState, ops: ClientOps) -> HyperState:
        """Each client's cluster: its fixed label if it has one, else the best by local NLL (also
        for clients never seen in training)."""
        states = self.global_state(server)
        if server.labels is not None and bool((ops.indices >= 0).all()):
            labels = server.labels[ops.indices]
            if bool((labels >= 0).all()):
                return states.index(labels)
        candidates = states.expand(len(ops.indices))  # (B, k)
        return candidates.gather(ops.nll(candidates).argmin(dim=-1))

    def global_state(self, server: ClusteredState) -> HyperState:
        """The k cluster states of the best restart: batch ``(k,)``."""
        return server.states.index(server.best)


# ==================================================================================================
# presets
# ==================================================================================================


def _phase2(lr, local_steps, units, solver, aggregator):
    solver = solver if solver is not None else GradientDescent(lr=lr, steps=local_steps, units=units)
    aggregator = aggregator if aggregator is not None else GlobalWeighted()
    return solver, aggregator


def fedavg(
    lr: float = 0.05,
    local_steps: int = 5,
    units: str = "squared_loss",
    initializer: Initializer | None = None,
    solver: LocalSolver | None = None,
    aggregator: Aggregator | None = None,
    **options,
) -> ClusteredGP:
    """Vanilla FedAvg: one component (k = 1), s local gradient steps, size-weighted averaging."""
    solver, aggregator = _phase2(lr, local_steps, units, solver, aggregator)
    return ClusteredGP(1, initializer or SpecInit(), HardAssigner(), solver, aggregator, **options)


def ifca(
    num_clusters: int,
    lr: float = 0.05,
    local_steps: int = 5,
    units: str = "squared_loss",
    initializer: Initializer | None = None,
    assigner: Assigner | None = None,
    solver: LocalSolver | None = None,
    aggregator: Aggregator | None = None,
    **options,
) -> ClusteredGP:
    """IFCA as Su–Xu–Yang run it ("the same as Phase 2" from a random start): random init, hard
    assignment by local likelihood, s local steps, global n_i/N weighting. For the original IFCA
    (model or gradient averaging within clusters, restarts) use :class:`~fedgp.strategies.IFCA`."""
    solver, aggregator = _phase2(lr, local_steps, units, solver, aggregator)
    return ClusteredGP(
        num_clusters, initializer or RandomInit(), assigner or HardAssigner(), solver, aggregator, **options
    )


def oracle(states: HyperState, lr: float = 0.05, local_steps: int = 5, units: str = "squared_loss", **kw):
    """Oracle iterative clustering: IFCA started at the true cluster states (infeasible; a reference)."""
    return ifca(states.batch_shape[-1], lr, local_steps, units, initializer=GivenInit(states), **kw)


def one_shot(
    num_clusters: int,
    lr: float = 0.05,
    local_steps: int = 5,
    units: str = "squared_loss",
    initializer: OneShotInit | None = None,
    solver: LocalSolver | None = None,
    aggregator: Aggregator | None = None,
    **options,
) -> ClusteredGP:
    """One-shot clustering: local fits, k-means once, then FedAvg within each (fixed) cluster."""
    solver = solver if solver is not None else GradientDescent(lr=lr, steps=local_steps, units=units)
    return ClusteredGP(
        num_clusters,
        initializer or OneShotInit(),
        FixedAssigner(),
        solver,
        aggregator or ClusterAverage(weighted=True),
        **options,
    )


def two_phase(
    num_clusters: int,
    lr: float = 0.05,
    local_steps: int = 5,
    units: str = "squared_loss",
    phase1=None,
    assigner: Assigner | None = None,
    solver: LocalSolver | None = None,
    aggregator: Aggregator | None = None,
    **options,
) -> ClusteredGP:
    """Su, Xu & Yang's two-phase algorithm: Phase 1 federated moment descent
    (:class:`~fedgp.strategies.moment_descent.MomentDescentInit`), then Phase 2 — hard assignment
    by local loss, FedAvg (s local steps) or FedProx (``solver=ProximalSolve(...)``), and the global
    n_i/N aggregation."""
    from fedgp.strategies.moment_descent import MomentDescentInit

    solver, aggregator = _phase2(lr, local_steps, units, solver, aggregator)
    return ClusteredGP(
        num_clusters,
        phase1 if phase1 is not None else MomentDescentInit(),
        assigner or HardAssigner(),
        solver,
        aggregator,
        **options,
    )
