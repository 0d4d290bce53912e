"""``engine="ray"``: shards of the federation on Ray actors, each running the batched engine.

For simulations beyond one core or one machine. The federation is split into ``num_workers``
contiguous shards; each shard's data go to a Ray actor once (as records) and stay there. Every
round each actor receives one message — the task for its clients, as bytes — runs them with
:class:`~fedgp.engines.batched.BatchedEngine` (keyed by the clients' global positions, so every
random draw is the one the sequential engine makes), and returns its clients' outcome as bytes:
individual fields per client, the shard's sum of the summed fields, failures. The driver merges
them. An actor that dies fails its clients for that round; it is replaced, its shard reloaded,
and the run goes on.

The model specification (GPyTorch modules: code, not data) reaches each actor once, through Ray's
own serialiser, like the actor class itself. Actors are pooled per process, so engines built one
after another (tests, notebooks) reuse the started workers; each engine's shard is held under
its own key and dropped by :meth:`RayEngine.close`.

Ray's lifetime: an engine that finds Ray running (``ray.init`` called before, by you or by another
engine) uses it and never stops it. An engine that has to start Ray stops it when it is closed —
:func:`fedgp.fit` closes the engines it builds from a name or a config, at the end of the run and on
an error — unless it was built with ``keep_alive=True`` (then :func:`shutdown` stops Ray and the
pooled actors). A closed engine still answers the tasks a :class:`~fedgp.run.FitResult` sends after
the run (predict, evaluate, a client's state): it runs them in this process, with the shards'
batched engine on the driver's copy of the data and every client keyed as on the actors, so the
numbers are the actors' (to rounding). Started again (another run), it reloads its shards, starting
Ray if it has to.

Personal hyper-parameters (``FGPR(personal=...)``): each actor keeps its clients'
:class:`~fedgp.strategies.memory.ClientMemory` between tasks, as the batched engine does in one
process; it never travels to the driver during the run (replies hold the shared values only). At
:meth:`RayEngine.close` each actor hands its shard's memory to the driver, whose in-process engine
then answers predict and a client's state with every owner's own values (in a simulation the driver
plays every owner already: it holds their data). An actor that dies (or misses its deadline) is
replaced, and what its clients kept is lost with it: they start again from the server's values, as
new owners do, with a :class:`~fedgp.errors.FedGPWarning` naming them. The alternative, failing them
for the rest of the run, would drop their data from the shared fit for a loss that concerns only
their own values, and leave them without a model at the end; a copy on the driver would move the
owners' values off their host during the run.
"""

from __future__ import annotations

import itertools
import json
import os
import warnings
import weakref
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from fedgp.data.client import ClientData
from fedgp.engines.base import Engine
from fedgp.engines.batched import check_against_gpytorch
from fedgp.errors import FedGPWarning, InputError, UnknownClientError, import_extra
from fedgp.messages import (
    Field,
    Outcome,
    Record,
    Roster,
    Task,
    config_json,
    from_config,
    merge_outcomes,
    record_from_bytes,
    record_to_bytes,
    task_from_bytes,
    task_to_bytes,
    withhold_small_sums,
)
from fedgp.messages.remote import (
    client_from_record,
    client_to_record,
    fields_from_json,
    fields_to_json,
    outcome_from_record,
    outcome_to_record,
    roster_from_record,
    roster_to_record,
)
from fedgp.models.spec import GPSpec
from fedgp.strategies.base import Strategy

if TYPE_CHECKING:
    from fedgp.engines.batched import BatchedEngine

__all__ = ["RayEngine", "shutdown"]

_POOL: list = []
_KEYS = itertools.count()


def _ray() -> ModuleType:
    return import_extra("ray", "engine 'ray'")


def _session() -> str:
    """The node of this process's Ray session (a new one for each local Ray started)."""
    return _ray().get_runtime_context().get_node_id()


class _Host:
    """A Ray actor holding shards of clients (one per engine) and running their tasks."""

    def __init__(self, threads: int = 1) -> None:
        # The compiled step's threads follow torch's (fedgp.engines.compiled.run_tiles); numba's own
        # pool is not used, and setting its size would start it.
        torch.set_num_threads(threads)
        self.engines: dict = {}

    def load(self, key: int, spec: GPSpec, shard: list[bytes], keys: list[int], options: dict) -> int:
        from fedgp.engines.batched import BatchedEngine

        clients = [client_from_record(record_from_bytes(b)) for b in shard]
        options = {**options, "check": False}  # the driver checked the spec once
        self.engines[key] = BatchedEngine(spec, clients, keys=torch.tensor(keys), **options)
        return os.getpid()

    def start(self, key: int, strategy_config: str, seed: int, modules: list[str]) -> bytes:
        import importlib
        import json

        for module in modules:  # the driver's own code defining the strategy's classes
            importlib.import_module(module)
        engine = self.engines[key]
        roster = engine.start(from_config(json.loads(strategy_config)), seed)
        return record_to_bytes(roster_to_record(roster))

    def run(self, key: int, task: bytes, rows: list[int], fields: str) -> bytes:
        engine = self.engines[key]
        out = engine.run(
            task_from_bytes(task), torch.tensor(rows, dtype=torch.long), fields_from_json(fields)
        )
        return record_to_bytes(outcome_to_record(out, engine.keys))

    def memory(self, key: int) -> bytes:
        """What the shard's clients keep (:mod:`fedgp.strategies.memory`), as a record of
        ``"<client key>/<name>"`` tensors: asked once, when the engine closes."""
        kept = self.engines[key].memory
        return record_to_bytes(
            Record({f"{k}/{n}": v for k, values in kept.items() for n, v in values.items()})
        )

    def keep(self, key: int, memory: bytes) -> None:
        """Replace what the shard's clients keep by ``memory`` (a record as :meth:`memory` gives it):
        a resumed run's clients continue from the values a checkpoint holds."""
        kept: dict[int, dict[str, torch.Tensor]] = {}
        for name, value in record_from_bytes(memory).tensors.items():
            client, _, hyper = name.partition("/")
            kept.setdefault(int(client), {})[hyper] = value
        engine = self.engines[key]
        engine.memory.clear()
        engine.memory.update(kept)

    def drop(self, key: int) -> None:
        self.engines.pop(key, None)


def _modules(config) -> list[str]:
    """The modules defining the settings classes of a strategy config, for the actors to import
    (a class defined in ``__main__``, e.g. a notebook cell, cannot be rebuilt on an actor)."""
    found: list[str] = []

    def walk(value):
        if isinstance(value, dict):
            if "type" in value and "params" in value:
                module = value["type"].partition(":")[0]
                if module == "__main__":
                    raise InputError(
                        f"{value['type']!r} is defined in __main__; engine='ray' rebuilds the strategy on "
                        "its actors, so define it in an importable module"
                    )
                if module not in found:
                    found.append(module)
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    walk(config)
    return found


def _actor(slot: int, threads: int) -> Any:
    ray = _ray()
    while len(_POOL) <= slot:
        _POOL.append(None)
    if _POOL[slot] is None:
        _POOL[slot] = ray.remote(num_cpus=1)(_Host).remote(threads)
    return _POOL[slot]


def _drop(key: int, loaded: list) -> None:
    """Free an engine's shards on the actors that hold them (when the engine is closed or collected)."""
    try:
        import ray

        if ray.is_initialized():
            for actor in loaded:
                if actor is not None:
                    actor.drop.remote(key)
    except Exception:  # noqa: BLE001 - best effort at interpreter shutdown
        pass
    loaded[:] = [None] * len(loaded)


def shutdown() -> None:
    """Stop the pooled actors and Ray itself, whoever started it: for a Ray kept by
    ``Ray(keep_alive=True)``, or at the end of tests and notebooks."""
    ray = _ray()
    _POOL.clear()
    if ray.is_initialized():
        ray.shutdown()


class RayEngine(Engine):
    """Shards of clients on Ray actors; each runs the batched engine on its shard.

    Args:
        spec, clients: the model and the federation (the driver keeps the data to reload a shard).
        address: an existing Ray cluster (``ray.init(address=...)``); default a local one.
        num_workers: actors (shards); default one per CPU of the cluster (local: of this machine).
        threads: torch threads per actor (1: one core each).
        timeout: seconds to wait for a shard's reply; a later shard fails its clients that round.
        shard: the keyword arguments of each actor's
            :class:`~fedgp.engines.batched.BatchedEngine` (``chunk_size``, ``compiled``,
            ``minibatch_dtype`` ...): the options of the :class:`~fedgp.engines.Ray` config's
            ``shard``, plain values that travel to the actors.
        keep_alive: when this engine starts Ray (it was not running), leave it and the pooled
            actors running when the engine is closed, for the next engine to reuse (stop them with
            :func:`shutdown`); by default :meth:`close` stops the Ray it started. A Ray that was
            already running is never stopped by an engine.
    """

    name = "ray"
    keeps_client_memory = True  # on the actors (module docstring)

    def __init__(
        self,
        spec: GPSpec,
        clients: Sequence[ClientData],
        seed: int = 0,
        *,
        address: str | None = None,
        num_workers: int | None = None,
        threads: int = 1,
        timeout: float | None = None,
        shard: Mapping[str, Any] | None = None,
        keep_alive: bool = False,
    ) -> None:
        ray = _ray()
        spec = spec.for_data(clients)  # GPSpec()'s named modules, at the data's width
        options = dict(shard or {})
        if not spec.variational:  # (a variational spec runs client by client: nothing to check)
            check_against_gpytorch(spec, compiled=options.get("compiled"))  # once, before Ray; actors skip it
        self.keep_alive = keep_alive
        local_cpus = None if address else (num_workers or os.cpu_count())
        self._init = dict(address=address, num_cpus=local_cpus, include_dashboard=False, log_to_driver=False)
        self._started: str | None = None  # the Ray session this engine started: stopped by close
        self._closed, self._local = False, None
        self.key = next(_KEYS)
        self._loaded: list = []  # each shard's actor, once loaded (None: not loaded)
        self._finalizer = weakref.finalize(self, _drop, self.key, self._loaded)
        self._connect()
        try:
            workers = num_workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
            if workers < 1:
                raise InputError("num_workers must be >= 1")
            cores = os.cpu_count() or 1
            if address is None and workers > cores:
                warnings.warn(
                    f"Ray(num_workers={workers}) on a machine with {cores} CPUs: the {workers} actors "
                    f"share {cores} cores, which is slower than {cores} workers (each actor runs a whole "
                    "shard); leave num_workers out for one per CPU",
                    FedGPWarning,
                    stacklevel=2,
                )
            self.spec, self.clients, self.seed = spec, list(clients), seed
            self.ids = [c.id for c in self.clients]
            # The shard's settings travel as plain values (Ray serialises them); the actors build the config.
            self.timeout, self.threads, self.options = timeout, threads, options
            pieces = np.array_split(np.arange(len(self.clients)), min(workers, len(self.clients)))
            self.shards = [torch.from_numpy(p).to(torch.long) for p in pieces]
            self._shard_of = torch.empty(len(self.clients), dtype=torch.long)
            self._row_of = torch.empty(len(self.clients), dtype=torch.long)
            for i, members in enumerate(self.shards):
                self._shard_of[members] = i
                self._row_of[members] = torch.arange(len(members))
            self._records = [
                [record_to_bytes(client_to_record(self.clients[p])) for p in s.tolist()] for s in self.shards
            ]
            self._loaded.extend([None] * len(self.shards))
            self._strategy: str | None = None
            self._keeps_memory = False  # the run's strategy keeps client memory (on the actors)
            self._memory: dict[int, dict[str, torch.Tensor]] = {}  # the actors' memory, after close
            self._transform: Task | None = None
            self._modules: list[str] = []
            for i in range(len(self.shards)):
                self._load(i)
        except BaseException:  # a Ray started for this engine does not outlive its failed construction
            self._finalizer()
            self._stop_ray()
            raise

    # -- Ray ------------------------------------------------------------------------------------------
    def _connect(self) -> None:
        """Use the running Ray, or start it with this engine's settings and remember that it did."""
        ray = _ray()
        if ray.is_initialized():
            return
        _POOL.clear()  # actors of an earlier session, gone with it
        ray.init(**self._init)
        self._started = _session()

    def _stop_ray(self) -> None:
        """Stop Ray if this engine started it (that same session) and was not told to keep it."""
        started, self._started = self._started, None
        if started is None or self.keep_alive:
            return
        ray = _ray()
        if ray.is_initialized() and _session() == started:
            shutdown()

    def _in_process(self) -> BatchedEngine:
        """After :meth:`close`: the shards' batched engine over all clients, in this process (each
        keyed by its position, as on the actors), for the tasks a result sends after the run."""
        if self._local is None:
            from fedgp.engines.batched import BatchedEngine

            local = BatchedEngine(self.spec, self.clients, self.seed, **{**self.options, "check": False})
            if self._strategy is not None:  # else its run says start must come first
                local.prepare(from_config(json.loads(self._strategy)), self.seed)
                local.memory.update(self._memory)  # what the actors' clients kept, brought back at close
            if self._transform is not None:  # the run's units, as the actors held them
                local.run(self._transform, torch.arange(len(self.clients)), {})
            self._local = local
        return self._local

    # -- shards -----------------------------------------------------------------------------------
    def _load(self, i: int) -> Any:
        ray = _ray()
        self._connect()
        actor = _actor(i, self.threads)
        keys = self.shards[i].tolist()
        ray.get(actor.load.remote(self.key, self.spec, self._records[i], keys, self.options))
        if self._strategy is not None:
            ray.get(actor.start.remote(self.key, self._strategy, self.seed, self._modules))
        if self._transform is not None:  # a reloaded shard holds its data in the run's units again
            rows = list(range(len(keys)))
            ray.get(actor.run.remote(self.key, task_to_bytes(self._transform), rows, fields_to_json({})))
        self._loaded[i] = actor
        return actor

    def _host(self, i: int) -> Any:
        actor = _POOL[i] if i < len(_POOL) else None
        if actor is not None and actor is self._loaded[i]:
            return actor
        if self._loaded[i] is not None:  # replaced under this run (another engine's restart)
            self._forget(i)
        return self._load(i)

    def restart(self, i: int) -> None:
        """Replace shard ``i``'s actor by a new one and reload its shard (its clients' memory is lost)."""
        ray = _ray()
        if i < len(_POOL) and _POOL[i] is not None:
            ray.kill(_POOL[i], no_restart=True)
            _POOL[i] = None
        self._forget(i)
        self._load(i)

    def _forget(self, i: int, why: str = "was replaced") -> None:
        """Say that shard ``i``'s clients lost what they kept (module docstring: they restart from
        the server's values)."""
        if not self._keeps_memory:
            return
        lost = [self.ids[p] for p in self.shards[i].tolist()]
        shown = ", ".join(map(repr, lost[:5])) + (f" and {len(lost) - 5} more" if len(lost) > 5 else "")
        warnings.warn(
            f"Ray worker {i} {why}: the personal values its {len(lost)} clients kept are lost ({shown}); "
            "they start again from the server's values, as new owners do",
            FedGPWarning,
            stacklevel=3,
        )

    def _gather_memory(self) -> None:
        """Bring every shard's client memory to the driver (at close: the run is over)."""
        ray = _ray()
        self._memory = {}
        if not self._keeps_memory:
            return
        for i, actor in enumerate(self._loaded):
            if not ray.is_initialized():  # stopped under the engine (shutdown()): the actors are gone
                self._forget(i, "was stopped before the engine closed")
                continue
            try:
                record = record_from_bytes(ray.get(actor.memory.remote(self.key), timeout=self.timeout))
            except (ray.exceptions.RayError, TimeoutError, AttributeError):
                self._forget(i, "was lost before the engine closed")
                if i < len(_POOL) and _POOL[i] is actor:  # the next engine starts a new one
                    _POOL[i] = None
                continue
            for name, value in record.tensors.items():
                key, _, hyper = name.partition("/")
                self._memory.setdefault(int(key), {})[hyper] = value

    def read_client_memory(self) -> dict[Any, dict[str, torch.Tensor]]:
        """Each client's kept values by id: asked of the actors during a run (a checkpoint), from
        the driver's copy after :meth:`close` (a saved result)."""
        if self._closed:
            return self._in_process().read_client_memory()
        if not self._keeps_memory:
            return {}
        ray, kept = _ray(), {}
        for i in range(len(self.shards)):
            record = record_from_bytes(ray.get(self._host(i).memory.remote(self.key), timeout=self.timeout))
            for name, value in record.tensors.items():
                key, _, hyper = name.partition("/")
                kept.setdefault(self.ids[int(key)], {})[hyper] = value.detach().to(torch.float64).clone()
        return kept

    def write_client_memory(self, kept: Mapping[Any, Mapping[str, torch.Tensor]]) -> None:
        """Give each actor its shard's clients' kept values (a resumed run), replacing theirs."""
        if self._closed:
            self._in_process().write_client_memory(kept)
            return
        positions = {cid: p for p, cid in enumerate(self.ids)}
        unknown = [cid for cid in kept if cid not in positions]
        if unknown:
            raise UnknownClientError(f"no client with id {unknown[0]!r} here to keep its values")
        ray, refs = _ray(), []
        for i, members in enumerate(self.shards):
            mine = set(members.tolist())
            record = Record(
                {
                    f"{positions[cid]}/{name}": value.detach().to(torch.float64).clone()
                    for cid, values in kept.items()
                    if positions[cid] in mine
                    for name, value in values.items()
                }
            )
            refs.append(self._host(i).keep.remote(self.key, record_to_bytes(record)))
        ray.get(refs, timeout=self.timeout)

    def kill(self, i: int) -> None:
        """Kill shard ``i``'s actor, as a crash would (for tests of failure handling)."""
        _ray().kill(_POOL[i], no_restart=True)

    # -- the contract -----------------------------------------------------------------------------
    def start(self, strategy: Strategy, seed: int) -> Roster:
        ray = _ray()
        if self._closed:  # a new run on the actors: the shards reload as they are needed
            self._closed, self._local = False, None
            self._finalizer = weakref.finalize(self, _drop, self.key, self._loaded)
        self.seed, self._transform = seed, None  # registration resets the actors' units
        # and their clients' memory: nothing kept yet, so an actor replaced since the last run loses nothing
        self._keeps_memory, self._memory = False, {}
        self._strategy = config_json(strategy.client_view())
        self._modules = _modules(json.loads(self._strategy))
        refs = [
            self._host(i).start.remote(self.key, self._strategy, seed, self._modules)
            for i in range(len(self.shards))
        ]
        parts = [roster_from_record(record_from_bytes(r)) for r in ray.get(refs)]
        self._keeps_memory = strategy.keeps_client_memory
        return Roster(
            [cid for p in parts for cid in p.ids],
            torch.cat([p.sizes for p in parts]),
            torch.cat([p.n_test for p in parts]),
            torch.cat([p.dims for p in parts]),
        )

    def run(self, task: Task, clients: torch.Tensor, fields: Mapping[str, Field]) -> Outcome:
        if self._closed:
            return self._in_process().run(task, clients, fields)
        ray = _ray()
        if task.kind == "transform":  # held by the actors; re-sent to a shard that reloads
            self._transform = task
        clients = torch.as_tensor(clients, dtype=torch.long)
        text = fields_to_json(fields)
        sent = []
        for i in range(len(self.shards)):
            rows = torch.nonzero(self._shard_of[clients] == i).flatten()
            if not len(rows):
                continue
            message = task_to_bytes(task.rows(rows).as_part())  # a shard's sum is a part of ours
            local = self._row_of[clients[rows]].tolist()
            sent.append((i, clients[rows], self._host(i).run.remote(self.key, message, local, text)))
        parts = []
        for i, members, ref in sent:
            try:
                parts.append(outcome_from_record(record_from_bytes(ray.get(ref, timeout=self.timeout))))
            except (ray.exceptions.RayError, TimeoutError) as err:
                reason = f"worker {i} lost: {type(err).__name__}: {str(err).splitlines()[0][:200]}"
                parts.append(Outcome.empty(fields, dict.fromkeys(members.tolist(), reason)))
                self.restart(i)
        return withhold_small_sums(merge_outcomes(parts, fields), fields, task.min_contributors)

    def close(self) -> None:
        """Free this engine's shards on the actors (also done when the engine is garbage collected)
        and stop Ray if this engine started it, unless ``keep_alive``. The engine still answers
        tasks afterwards, in this process (what a :class:`~fedgp.run.FitResult` asks after the
        run), with what the clients kept brought back from the actors; :meth:`start` brings the
        shards back."""
        if not self._closed:
            self._gather_memory()
        self._closed = True
        self._finalizer()
        self._stop_ray()
