"""Initialisers: how the k cluster states start, with or without communication rounds of their own."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from fedgp.checks import check_settings
from fedgp.clustering.kmeans import kmeans
from fedgp.errors import InputError
from fedgp.messages import (
    Configurable,
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
from fedgp.models.linear import linear_model
from fedgp.models.spec import GPSpec
from fedgp.models.state import HyperState
from fedgp.rng import generator
from fedgp.strategies.base import ClientOps
from fedgp.strategies.clustered.state import STATE, ClosedForm
from fedgp.strategies.local import LocalTraining

__all__ = [
    "InitDone",
    "Initializer",
    "RandomInit",
    "SpecInit",
    "GivenInit",
    "OneShotInit",
    "kmeans",
]


@dataclass(frozen=True)
class InitDone:
    """An initialiser's result: cluster states ``(R, k)``, optionally fixed labels ``(K,)`` and a log."""

    states: HyperState
    labels: torch.Tensor | None = None
    log: Any = None


class Initializer(Configurable, ABC):
    """How the k cluster states start. Subclasses without communication return :class:`InitDone`
    from :meth:`start`; others return a progress object and run rounds through the other hooks,
    which mirror a strategy's: ``configure`` (server), ``local_update`` (client), ``aggregate``."""

    #: communication rounds the initialiser uses (an upper bound for adaptive ones)
    def rounds(self, k: int) -> int:
        """Communication rounds the initialiser uses (an upper bound for adaptive ones)."""
        return 0

    @abstractmethod
    def start(self, ctx: ServerContext, k: int, restarts: int, rng: np.random.Generator) -> Any:
        """:class:`InitDone`, or a progress object for a multi-round initialiser."""

    def configure(self, progress: Any, ctx: ServerContext, rng: np.random.Generator, rnd: int) -> RoundPlan:
        """Server: the initialisation round's plan."""
        raise NotImplementedError

    def local_update(self, ops: ClientOps, task: Task, form: ClosedForm) -> dict[str, torch.Tensor]:
        """Client: its reply to an initialisation round."""
        raise NotImplementedError

    def aggregate(
        self, progress: Any, plan: RoundPlan, replies: Replies, ctx: ServerContext, rnd: int
    ) -> tuple[Any, dict[str, Any]]:
        """Server: the new progress and the round's history entries."""
        raise NotImplementedError


def _perturbed_states(
    spec: GPSpec, r: int, k: int, kind: str, scale: float, center: str, rng: np.random.Generator
) -> HyperState:
    """IFCA's random initialisation: ``r`` restarts of ``k`` states, each the spec's initial raw
    values perturbed (``kind="normal"``: by ``scale`` standard normals), drawn from ``rng`` in a fixed
    order so that a seed gives the same starts on every engine."""
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
            raise InputError(f"RandomInit kind must be 'normal' or 'bernoulli', got {self.kind!r}")
        if self.center not in ("spec", "zero"):
            raise InputError(f"RandomInit center must be 'spec' or 'zero', got {self.center!r}")
        check_settings(self, scale="nonnegative")

    def start(self, ctx, k, restarts, rng) -> InitDone:
        return InitDone(_perturbed_states(ctx.spec, restarts, k, self.kind, self.scale, self.center, rng))


@dataclass(frozen=True)
class SpecInit(Initializer):
    """Every cluster at the spec's initial state (for k = 1: plain FedAvg/FGPR from the spec)."""

    def start(self, ctx, k, restarts, rng) -> InitDone:
        return InitDone(_perturbed_states(ctx.spec, restarts, k, "spec", 0.0, "spec", rng))


@dataclass(frozen=True)
class GivenInit(Initializer):
    """Given cluster states, batch ``(k,)`` or ``(restarts, k)`` — e.g. the true θ* (the oracle)."""

    states: HyperState = field(repr=False)

    def start(self, ctx, k, restarts, rng) -> InitDone:
        given = self.states
        states = given if len(given.batch_shape) == 2 else given.expand(1)
        if len(given.batch_shape) == 1 and restarts > 1:
            states = given.expand(restarts)
        if tuple(states.batch_shape) != (restarts, k):
            raise InputError(
                f"init has batch {tuple(given.batch_shape)}; expected ({k},) or ({restarts}, {k})"
            )
        missing = set(ctx.spec.names) ^ set(states)
        if missing:
            raise InputError(f"given init states differ from the spec in {sorted(missing)}")
        return InitDone(states.clone())


@dataclass(frozen=True)
class OneShotProgress:
    k: int


@dataclass(frozen=True)
class OneShotInit(Initializer):
    """One-shot clustering (Ghosh et al. 2019; IFCA's Algorithm 1): one round of local fits, then
    k-means on the server; the k-means labels stay fixed when used with :class:`FixedAssigner`.

    ``local="least_squares"`` (linear means): each client's minimum-norm least-squares estimate of
    its mean parameters (``ridge > 0``: ridge regression) — the digest's choice when ``n_i < d``.
    ``local="train"``: each client trains the server's initial state on its own data with
    ``training`` (a local type-II MLE) and sends it; the server standardises the raw trainable
    values before k-means (any GPyTorch kernel). A client that fails this round gets no label.
    """

    local: str = "least_squares"
    ridge: float = 0.0
    training: LocalTraining | None = None
    kmeans_restarts: int = 10

    def __post_init__(self) -> None:
        if self.local not in ("least_squares", "train"):
            raise InputError(f"OneShotInit local must be 'least_squares' or 'train', got {self.local!r}")
        if self.local == "train" and self.training is None:
            raise InputError("OneShotInit(local='train') needs a LocalTraining")

    def rounds(self, k) -> int:
        """One round: every client sends its local estimate once."""
        return 1

    def start(self, ctx, k, restarts, rng) -> OneShotProgress:
        if restarts != 1:
            raise InputError("one-shot initialisation is deterministic given the data: use restarts=1")
        if self.local == "least_squares":
            linear_model(ctx.spec)  # ValueError early if the mean is not linear
        return OneShotProgress(k)

    def configure(self, progress, ctx, rng, rnd) -> RoundPlan:
        """Server: ask every client for its local estimate."""
        everyone, weights = torch.arange(ctx.num_clients), ctx.weights.clone()
        if self.local == "least_squares":
            fields = {"estimate": Field((linear_model(ctx.spec).dim,))}
            return RoundPlan(everyone, weights, replies=fields)
        shared = Record(state_tensors(ctx.spec.initial_state(), "start/"))
        return RoundPlan(everyone, weights, shared=shared, replies=state_fields(ctx.spec, STATE))

    def local_update(self, ops, task, form) -> dict[str, torch.Tensor]:
        """Client: its least-squares estimate, or a state trained from the spec's start."""
        if self.local == "least_squares":
            model = linear_model(ops.spec)
            return {"estimate": torch.stack([model.local_fit(c, self.ridge) for c in ops.clients])}
        start = read_state(task.shared.tensors, ops.spec, "start/")
        result = ops.train(start.expand(len(ops.indices)), self.training)
        return state_tensors(result.states, STATE)

    def aggregate(self, progress, plan, replies, ctx, rnd) -> tuple[InitDone, dict[str, Any]]:
        """Server: k-means over the estimates gives the k starting states."""
        spec = ctx.spec
        rng = generator(ctx.seed, "one-shot k-means")
        base = spec.initial_state()
        count = len(replies.participants)
        if self.local == "least_squares":
            points = replies["estimate"].numpy()
            centres, labels = kmeans(points, progress.k, rng, self.kmeans_restarts)
            model = linear_model(spec)
            states = model.with_vector(base.expand(progress.k).clone(), torch.from_numpy(centres))
        else:
            raw = spec.to_raw(replies.state(spec, STATE))
            names = spec.trainable_names
            flat = torch.cat([raw[n].reshape(count, -1) for n in names], dim=1).numpy()
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
        full[replies.participants] = torch.from_numpy(labels)
        sizes = np.bincount(labels, minlength=progress.k)
        metrics = {f"kmeans_size/{j}": int(s) for j, s in enumerate(sizes)}
        return InitDone(states.expand(1).clone(), full), metrics
