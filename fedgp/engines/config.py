"""Engines as settings: what ``fit(engine=...)`` takes, and how a run gets its engine.

Each engine is configured by a frozen dataclass — :class:`Sequential`, :class:`Batched`,
:class:`Ray`, and :class:`fedgp.flower.Flower` with the Flower extra — holding its options and
nothing else; ``build`` makes the engine for a federation. ``fit`` also takes a name
(``"sequential"``, ``"batched"``, ``"ray"``, ``"flower"``: the config's defaults), ``"auto"``
(:func:`auto_engine`: the batched engine where its tensor path reproduces GPyTorch for the spec,
else the sequential one, decided without building either) or an
:class:`~fedgp.engines.base.Engine` already built.
"""

from __future__ import annotations

import dataclasses
import importlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from fedgp.data.client import ClientData
from fedgp.engines.base import Engine
from fedgp.errors import EXTRAS, InputError, InputTypeError, missing_extra
from fedgp.models.spec import GPSpec

__all__ = [
    "EngineConfig",
    "Sequential",
    "Batched",
    "Ray",
    "ENGINES",
    "engine_config",
    "auto_engine",
    "build_engine",
]


class EngineConfig(ABC):
    """An engine's settings; :meth:`build` makes the engine for a federation."""

    name: ClassVar[str]

    @abstractmethod
    def build(
        self, spec: GPSpec, clients: Sequence[ClientData], seed: int = 0, keys: torch.Tensor | None = None
    ) -> Engine:
        """The engine hosting ``clients`` (``keys``: their global positions, for a shard of a larger
        federation; default their positions here)."""

    def options(self) -> dict[str, Any]:
        """The settings as the engine's keyword arguments."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclass(frozen=True)
class Sequential(EngineConfig):
    """The reference engine: one client at a time, one reusable GPyTorch model.

    ``loopback``: every message and every reply through bytes and back (bit-exact; slower).
    ``timeout``: seconds a client may take; it is cut off at the timeout, while it runs, and fails
    that round (:mod:`fedgp.engines.deadline`).
    """

    loopback: bool = False
    timeout: float | None = None
    name: ClassVar[str] = "sequential"

    def build(self, spec, clients, seed=0, keys=None) -> Engine:
        from fedgp.engines.sequential import SequentialEngine

        return SequentialEngine(spec, clients, seed, keys=keys, **self.options())


@dataclass(frozen=True)
class Batched(EngineConfig):
    """All clients' local steps as one tensor program (:class:`~fedgp.engines.batched.BatchedEngine`,
    which documents each option): ``device`` (e.g. ``"cuda"``), ``chunk_size`` (clients per
    program), ``minibatch_dtype``, ``compiled`` / ``fused`` (the compiled paths: ``None`` where they
    apply), ``memory_mb``, ``check`` (compare with GPyTorch at construction), ``loopback``,
    ``timeout`` (per client: a chunk that exceeds it is halved and re-run until only the slow
    clients fail)."""

    device: str | None = None
    chunk_size: int | None = None
    minibatch_dtype: torch.dtype | None = None
    compiled: bool | None = None
    fused: bool | None = None
    memory_mb: float = 256.0
    check: bool = True
    loopback: bool = False
    timeout: float | None = None
    name: ClassVar[str] = "batched"

    def build(self, spec, clients, seed=0, keys=None) -> Engine:
        from fedgp.engines.batched import BatchedEngine

        return BatchedEngine(spec, clients, seed, keys=keys, **self.options())


@dataclass(frozen=True)
class Ray(EngineConfig):
    """Shards of the federation on Ray actors, each running ``shard`` (a :class:`Batched` config)
    on its clients: ``address`` of an existing cluster (default a local one), ``num_workers``
    actors (default one per CPU), ``threads`` per actor, ``timeout`` per shard's reply. Needs the
    ``ray`` extra.

    ``keep_alive``: a ``fit`` that had to start Ray (``ray.init`` not called before) stops it at
    the end of the run, also on an error; ``keep_alive=True`` leaves it and its actors running for
    the next run (:func:`fedgp.engines.ray.shutdown` stops them). A Ray you started is never
    stopped. The result predicts and evaluates after Ray stops (in this process, the same numbers)."""

    address: str | None = None
    num_workers: int | None = None
    threads: int = 1
    timeout: float | None = None
    shard: Batched = Batched()
    keep_alive: bool = False
    name: ClassVar[str] = "ray"

    def __post_init__(self) -> None:
        if not isinstance(self.shard, Batched):
            raise InputTypeError(f"Ray(shard=...) must be a fedgp.engines.Batched config, got {self.shard!r}")

    def build(self, spec, clients, seed=0, keys=None) -> Engine:
        if keys is not None:
            raise InputError("the Ray engine hosts a whole federation, not a shard of one")
        from fedgp.engines.ray import RayEngine  # imports Ray itself only when the engine starts

        return RayEngine(spec, clients, seed, address=self.address, num_workers=self.num_workers,
                         threads=self.threads, timeout=self.timeout, shard=self.shard.options(),
                         keep_alive=self.keep_alive)  # fmt: skip


#: The engine configs by name, as ``fit(engine="...")`` and the CLI take them. ``"flower"`` (the
#: Flower engine in one process, :class:`fedgp.flower.Flower`) needs the ``flower`` extra and is
#: looked up by name when asked for (:func:`engine_config`).
ENGINES: dict[str, type[EngineConfig]] = {c.name: c for c in (Sequential, Batched, Ray)}
#: Engines that live with the optional dependency they need, as ``module:attribute``.
EXTRA_ENGINES = {"flower": ("fedgp.flower", "Flower", "flower")}


def engine_config(name: str) -> EngineConfig:
    """The default config of the engine called ``name``."""
    if name in ENGINES:
        return ENGINES[name]()
    if name in EXTRA_ENGINES:
        module, attribute, extra = EXTRA_ENGINES[name]
        try:
            return getattr(importlib.import_module(module), attribute)()
        except ModuleNotFoundError as err:
            raise missing_extra(EXTRAS[extra][0], f"engine {name!r}", err.name) from err
    known = ", ".join(["auto", *ENGINES, *EXTRA_ENGINES])
    raise InputError(f"unknown engine {name!r}; available: {known}, or a fedgp.engines config")


def auto_engine(spec: GPSpec, clients: Sequence[ClientData]) -> EngineConfig:
    """``engine="auto"``: :class:`Batched` where its tensor path reproduces GPyTorch for ``spec``
    (checked once here, on a small random case), else :class:`Sequential` — the same numbers, and a
    batched engine would evaluate client by client anyway. An
    :class:`~fedgp.models.own_features.OwnFeaturesSpec` runs on :class:`Sequential`, the one engine
    that completes each owner's model with its own part."""
    from fedgp.engines.batched import batched_path_reason
    from fedgp.models.own_features import OwnFeaturesSpec

    if isinstance(spec, OwnFeaturesSpec):
        return Sequential()
    d = clients[0].n_features if len(clients) else 1
    if batched_path_reason(spec.for_inputs(d), d) is not None:
        return Sequential()
    return Batched(check=False)  # just checked


def build_engine(
    engine: str | EngineConfig | Engine, spec: GPSpec, clients: Sequence[ClientData] | None, seed: int
) -> Engine:
    """The engine a run uses: an :class:`Engine` as it is, a config built, a name's default config
    built, ``"auto"`` decided by :func:`auto_engine`."""
    if isinstance(engine, Engine):
        return engine
    if clients is None:
        raise InputTypeError(
            "federation is None: pass a fedgp.data.Federation, or an Engine instance that hosts the clients"
        )
    spec = spec.for_data(clients)  # GPSpec()'s named modules, at the data's width
    if isinstance(engine, str):
        engine = auto_engine(spec, clients) if engine == "auto" else engine_config(engine)
    if not isinstance(engine, EngineConfig):
        raise InputTypeError(
            f"engine must be a name ('auto', {', '.join(map(repr, [*ENGINES, *EXTRA_ENGINES]))}), a "
            "fedgp.engines config such "
            f"as fedgp.engines.Batched(device='cuda'), or an Engine; got {type(engine).__name__}"
        )
    return engine.build(spec, clients, seed)
