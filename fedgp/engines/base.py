"""The engine contract: engines own dispatch.

``fit`` never runs client code. Each round it hands an engine a :class:`~fedgp.messages.Task`
(the shared record and one personal row per client), the clients to send it to, and the declared
reply fields; the engine delivers the messages wherever the data live, runs the client side
(:func:`fedgp.engines.client.handle`), checks every reply against the declaration, and returns an
:class:`Outcome`: the individual fields of the clients that replied, the summed fields *only as
sums*, the failures with their reasons, and the bytes that crossed. A client that raises, or whose
reply is malformed or not finite, is a failure of that round, never an exception of the run. A sum
of fewer replies than ``task.min_contributors`` never leaves the engine: it withholds the summed
fields (:func:`~fedgp.messages.withhold_small_sums`) and fails their contributors with the reason.

:class:`InProcessEngine` implements this for engines that host the clients in this process
(``sequential``, ``batched``): chunks of clients, failure isolation within a chunk, and an optional
*loopback* that sends every message and reply through bytes (:mod:`fedgp.messages.records`) — proof
that nothing but records crosses the boundary.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch

from fedgp.attacks.labels import OPTION as LABEL_FLIP
from fedgp.attacks.labels import flipped_ops
from fedgp.data.client import ClientData
from fedgp.engines.deadline import Abandoned, run_within
from fedgp.engines.tasks import handle, reply_fields
from fedgp.errors import (
    ClientFailure,
    EngineError,
    FactorizationError,
    InputError,
    SimulatedFailure,
    UnknownClientError,
)
from fedgp.messages import (
    Field,
    Outcome,
    Record,
    Roster,
    Task,
    check_reply,
    config_json,
    from_config,
    record_from_bytes,
    record_size,
    record_to_bytes,
    reply_size,
    reply_structure,
    split_size,
    task_from_bytes,
    task_size,
    task_to_bytes,
    withhold_small_sums,
)
from fedgp.models.spec import GPSpec
from fedgp.rng import client_uniform
from fedgp.strategies.base import ClientOps, Strategy
from fedgp.strategies.memory import ClientMemory
from fedgp.transforms import DataTransform

__all__ = ["Engine", "InProcessEngine", "faulted_ops"]


class Engine(ABC):
    """Who runs the clients' side of the rounds. See the module docstring for the contract."""

    name: str = "engine"
    #: Whether the engine keeps each client's :class:`~fedgp.strategies.memory.ClientMemory`
    #: between tasks, as personal hyper-parameters need (``fit`` refuses them on an engine that
    #: does not).
    keeps_client_memory: bool = False
    #: The transform this engine's clients last received (a ``transform`` task), as the server
    #: recorded it (:func:`fedgp.run.exchange.send_transform`); registration resets the clients.
    transform_sent = None

    @abstractmethod
    def start(self, strategy: Strategy, seed: int) -> Roster:
        """Prepare the clients to run ``strategy`` with master ``seed``; register them (``hello``) and
        return the :class:`~fedgp.messages.Roster` of what they reported."""

    @abstractmethod
    def run(self, task: Task, clients: torch.Tensor, fields: Mapping[str, Field]) -> Outcome:
        """Deliver ``task`` to ``clients`` (ascending positions; personal rows aligned with them) and
        collect their replies, checked against ``fields``; withhold sums of fewer replies than
        ``task.min_contributors``."""

    def thread_setting(self) -> contextlib.AbstractContextManager:
        """The thread setting this engine's tasks run under, and ``fit`` its whole loop
        (:mod:`fedgp.engines.cpus`); none of its own by default."""
        return contextlib.nullcontext()

    def read_client_memory(self) -> dict[Any, dict[str, torch.Tensor]]:
        """What each client keeps between tasks (:mod:`fedgp.strategies.memory`: its personal
        hyper-parameters), by client id: ``{id: {state name: float64 tensor of its event shape}}``,
        copies, for the clients that keep anything. A saved result and a checkpoint hold it. An engine
        whose clients keep nothing gives ``{}``; one whose clients keep values where this process
        cannot read them (a deployment's nodes) raises :class:`~fedgp.errors.EngineError` saying so."""
        if not self.keeps_client_memory:
            return {}
        raise EngineError(
            f"the {self.name!r} engine's clients keep their own values (personal hyper-parameters) "
            "where this process cannot read them: each keeps its own"
        )

    def write_client_memory(self, kept: Mapping[Any, Mapping[str, torch.Tensor]]) -> None:
        """Set what the clients keep to ``kept`` (as :meth:`read_client_memory` gives it), replacing
        what they kept: a resumed run's clients continue from the values they had."""
        if kept:
            raise EngineError(
                f"the {self.name!r} engine cannot give its clients the values they kept (personal "
                "hyper-parameters)"
            )

    def close(self) -> None:  # noqa: B027 - optional hook: in-process engines hold nothing to release
        """Release workers, processes or connections (nothing for in-process engines). ``fit`` closes
        the engines it builds when the run ends; their :class:`~fedgp.run.FitResult` may still send
        tasks (predict, evaluate) afterwards, which a closed engine answers."""


class _Malformed(Exception):
    """A batch's reply does not match the declaration as a whole: find the client by halving."""


def _reason(err: BaseException) -> str:
    text = str(err).splitlines()[0] if str(err) else ""
    return f"{type(err).__name__}: {text}"[:500]


class InProcessEngine(Engine):
    """Clients hosted in this process, run a chunk at a time.

    Args:
        spec: the clients' model (each client rebuilds everything else from it and the strategy).
        clients: the clients' data, in registry order.
        seed: master seed for direct use of :meth:`chunks`; :meth:`start` sets it for a run.
        loopback: send every message and every reply through bytes and back (bit-exact; slower).
        timeout: seconds a client may take: a task runs on a worker thread and is cut off at the
            timeout while it runs (:mod:`fedgp.engines.deadline`; the engine's first-call compiling
            does not count). A chunk cut off is halved and re-run until each piece fits or is one
            client, so one slow or hung client fails alone. Ray and Flower have their own deadlines.
        keys: the clients' keys, the integers their random streams are keyed by (default their
            positions here; an engine hosting a shard of a larger federation passes the global ones).
    """

    chunk_size: int = 1
    keeps_client_memory = True

    def __init__(
        self,
        spec: GPSpec,
        clients: Sequence[ClientData],
        seed: int = 0,
        *,
        loopback: bool = False,
        timeout: float | None = None,
        keys: torch.Tensor | None = None,
    ):
        if timeout is not None and not timeout > 0:
            raise InputError("timeout must be > 0 seconds")
        spec = spec.for_data(clients)  # GPSpec()'s named modules, at the data's width
        self.spec, self.clients, self.seed = spec, clients, seed
        # The clients' own data; ``clients`` is what the current task's transform made of them.
        self.raw_clients = clients
        self.transform = DataTransform()
        self._transform_key = self.transform.key()
        self.outcome_offset = torch.zeros(len(clients), dtype=torch.float64)
        self.outcome_scale = torch.ones(len(clients), dtype=torch.float64)
        self.ids = [c.id for c in clients]
        self._by_id: dict[Any, int] | None = None  # id -> position, built when first asked (10⁶ clients)
        self.keys = torch.arange(len(clients)) if keys is None else torch.as_tensor(keys, dtype=torch.long)
        if self.keys.shape != (len(clients),):
            raise InputError(f"{len(self.keys)} keys for {len(clients)} clients")
        self._by_key: dict[int, int] | None = None  # key -> position, built when first asked
        self.loopback, self.timeout = loopback, timeout
        for width in {c.n_features for c in clients}:
            first = next(c for c in clients if c.n_features == width)
            spec.check_input_dim(width, first.id)
        if spec.fixed_noise:
            for client in clients:
                spec.client_noise(client)
        self.client_strategy: Strategy | None = None
        self._keeps_memory = False
        # What each client keeps between tasks, by its key (fedgp.strategies.memory): one process
        # plays every owner here, so one dict holds every owner's own values.
        self.memory: dict[int, dict[str, torch.Tensor]] = {}

    @property
    def _positions(self) -> dict[Any, int]:
        """Each client's position by id: built on first use, not for every engine of 10⁶ clients."""
        if self._by_id is None:
            self._by_id = {cid: i for i, cid in enumerate(self.ids)}
        return self._by_id

    @property
    def _position_of_key(self) -> dict[int, int]:
        """Each client's position by key (built on first use)."""
        if self._by_key is None:
            self._by_key = {int(k): i for i, k in enumerate(self.keys.tolist())}
        return self._by_key

    def positions(self, keys) -> torch.Tensor:
        """This engine's positions of the clients with the given keys."""
        try:
            return torch.tensor([self._position_of_key[int(k)] for k in keys], dtype=torch.long)
        except KeyError as err:
            raise UnknownClientError(f"no client with key {err.args[0]} here") from None

    # -- what subclasses provide ------------------------------------------------------------------
    @abstractmethod
    def ops(self, clients: torch.Tensor, rnd: int) -> ClientOps:
        """Client operations on the data of ``clients`` (positions) for round ``rnd``."""

    def read_client_memory(self) -> dict[Any, dict[str, torch.Tensor]]:
        ids = self.ids
        return {
            ids[self._position_of_key[key]]: {name: value.clone() for name, value in values.items()}
            for key, values in self.memory.items()
            if values
        }

    def write_client_memory(self, kept: Mapping[Any, Mapping[str, torch.Tensor]]) -> None:
        memory = {}
        for cid, values in kept.items():
            if cid not in self._positions:
                raise UnknownClientError(f"no client with id {cid!r} here to keep its values")
            key = int(self.keys[self._positions[cid]])
            memory[key] = {name: value.detach().to(torch.float64).clone() for name, value in values.items()}
        self.memory.clear()
        self.memory.update(memory)

    def data_changed(self) -> None:  # noqa: B027 - optional hook
        """``clients`` were re-transformed: an engine holding copies of the data refreshes them."""

    def use_transform(self, transform: DataTransform) -> None:
        """Hold the clients' data in the units of ``transform`` (a no-op when already so): what a
        client does with a ``transform`` task, once per run (:mod:`fedgp.transforms`)."""
        key = transform.key()
        if key == self._transform_key:
            return
        self.clients, self.outcome_offset, self.outcome_scale = self.transformed(transform)
        self.transform, self._transform_key = transform, key
        self.data_changed()

    def transformed(
        self, transform: DataTransform
    ) -> tuple[Sequence[ClientData], torch.Tensor, torch.Tensor]:
        """The clients' own data in the units of ``transform``, with their outcome offsets and scales
        (every client's made now: :meth:`DataTransform.apply_all`, which refuses a value the data
        checks would, naming the client)."""
        return transform.apply_all(self.raw_clients)

    def client_ops(self, clients: torch.Tensor, task: Task) -> ClientOps:
        """The operations ``task`` runs on: :meth:`ops`, and for training the faults a run injects —
        a simulated failure raises, a label flip's clients see −y (:mod:`fedgp.attacks.labels`) — so
        the task kinds answer as honest clients do. The clients' own :attr:`memory` comes with
        them (``ops.memory``, staged until their replies are accepted) where the strategy keeps
        one; a strategy that keeps nothing gets ``None``, and its tasks never touch the memory."""
        ops = faulted_ops(self.ops(clients, task.round), task)
        ops.memory = ClientMemory(self.memory, ops.indices) if self._keeps_memory else None
        return ops

    def chunks(self, clients: torch.Tensor, rnd: int) -> Iterator[ClientOps]:
        """The round's clients as :class:`~fedgp.strategies.ClientOps`, ``chunk_size`` at a time."""
        for start in range(0, len(clients), self.chunk_size):
            yield self.ops(clients[start : start + self.chunk_size], rnd)

    # -- the contract -----------------------------------------------------------------------------
    def prepare(self, strategy: Strategy, seed: int) -> None:
        """Set the run's seed and the clients' strategy, rebuilt from its JSON config as a remote
        client would (a host that already registered its clients needs no second ``hello``)."""
        self.seed = seed
        self.client_strategy = from_config(strategy.client_view().to_config())
        # asked once, not per task; a spec whose owners keep a part of their own model keeps it too
        self._keeps_memory = self.client_strategy.keeps_client_memory or self.spec.keeps_client_memory
        self.use_transform(DataTransform())  # a new run starts from the data as they are
        self.memory.clear()  # and from nothing kept by its clients

    def start(self, strategy: Strategy, seed: int) -> Roster:
        self.prepare(strategy, seed)
        everyone = torch.arange(len(self.clients))
        fields = reply_fields("hello", self.spec, 1)
        out = self.run(Task("hello"), everyone, fields)
        if out.failures:
            bad = ", ".join(f"{self.ids[p]!r}: {r}" for p, r in list(out.failures.items())[:5])
            raise EngineError(f"clients failed to register: {bad}")
        return Roster(list(self.ids), out.individual["n"], out.individual["n_test"], out.individual["d"])

    def run(self, task: Task, clients: torch.Tensor, fields: Mapping[str, Field]) -> Outcome:
        with self.thread_setting():
            return self._run(task, clients, fields)

    def _run(self, task: Task, clients: torch.Tensor, fields: Mapping[str, Field]) -> Outcome:
        if self.client_strategy is None:
            raise EngineError(f"{type(self).__name__}.start(strategy, seed) must come first")
        clients = torch.as_tensor(clients, dtype=torch.long)
        if task.kind == "transform":
            return self._hold_transform(task, clients, fields)
        summed = {k for k, f in fields.items() if f.summed}
        out = Outcome.empty(fields)
        replied, rows = [], {k: [] for k in fields if k not in summed}
        sums: dict[str, torch.Tensor] = {}
        down = None if self.loopback else task_size(task, rows=1)  # every participant's is this size
        up = None  # a valid reply's size, from the declared fields (asked once)
        for start in range(0, len(clients), self.chunk_size):
            chunk = clients[start : start + self.chunk_size]
            # a task with no personal rows is the same message for every chunk: nothing to slice
            part = task.rows(slice(start, start + self.chunk_size)) if task.personal.tensors else task
            if self.loopback:
                part, sent = _through_bytes(part, len(chunk))
                out.bytes_down += sent
            else:
                out.bytes_down += down * len(chunk)
            for ok, reply, memory in self._isolated(part, chunk, out.failures, fields):
                if self.loopback:
                    reply, received = _reply_through_bytes(reply, len(ok))
                    out.bytes_up += received
                reasons = check_reply(reply, fields, len(ok))
                good = torch.tensor([r is None for r in reasons], dtype=torch.bool)
                if memory is not None:  # a client keeps what it trained when its reply counts
                    memory.commit(good.tolist())
                for pos, reason in zip(ok.tolist(), reasons):
                    if reason is not None:
                        out.failures[pos] = f"invalid reply: {reason}"
                if self.loopback:
                    pass  # counted as it crossed
                elif bool(good.all()):  # every reply as declared: each the declaration's size
                    up = reply_size(fields) if up is None else up
                    out.bytes_up += up * len(ok)
                else:  # computed from the shapes that came, as the bytes would be: nothing serialised
                    out.bytes_up += split_size(reply, len(ok))
                if not bool(good.any()):
                    continue
                replied.append(ok[good])
                for name, value in reply.tensors.items():
                    if name in summed:
                        part_sum = value[good].sum(0)
                        sums[name] = part_sum if name not in sums else sums[name] + part_sum
                    else:
                        rows[name].append(value[good])
        if replied:
            order = torch.argsort(torch.cat(replied))
            out.clients = torch.cat(replied)[order]
            out.individual = {k: torch.cat(v)[order] for k, v in rows.items()}
            out.sums = sums
        return withhold_small_sums(out, fields, task.min_contributors)  # formed here, withheld here

    def _hold_transform(self, task: Task, clients: torch.Tensor, fields: Mapping[str, Field]) -> Outcome:
        """A ``transform`` task: this host's clients hold their data in its units from now on. One
        message per client and an empty reply each, counted as the wire would carry them."""
        self.use_transform(DataTransform.from_parts(task.shared.tensors, task.shared.settings))
        out = Outcome.empty(fields)
        out.clients = torch.sort(clients).values
        out.bytes_down = task_size(task) * len(clients)
        out.bytes_up = record_size(Record()) * len(clients)
        return out

    # -- running a chunk, isolating the clients that fail ----------------------------------------------
    def _isolated(self, task: Task, clients: torch.Tensor, failures: dict[int, str], fields):
        """Run ``task`` on ``clients``; yield ``(clients that replied, their reply, their staged
        memory)`` pieces and record the others in ``failures``. A failure that names its clients
        drops just them; one that does not (or a malformed reply of the whole batch) is narrowed
        down by halving the chunk."""
        try:
            reply, memory = self._reply(task, clients)
            if len(clients) > 1 and reply_structure(reply, fields, len(clients)) is not None:
                raise _Malformed()
        except Abandoned:
            if len(clients) == 1:
                failures[int(clients[0])] = f"timeout: no reply within {self.timeout:g} s; cut off"
                return
            yield from self._halves(task, clients, failures, fields)  # the slow as the failing
            return
        except Exception as err:  # noqa: BLE001 - any client-side exception is that client's failure
            culprits = self._culprits(err, clients)
            if len(clients) == 1:
                failures[int(clients[0])] = _reason(err)
                return
            if culprits is not None:
                bad = torch.isin(clients, culprits)
                for pos in clients[bad].tolist():
                    failures[pos] = _reason(err)
                rest = torch.nonzero(~bad).flatten()
                if len(rest):
                    yield from self._isolated(task.rows(rest), clients[rest], failures, fields)
                return
            yield from self._halves(task, clients, failures, fields)
            return
        yield clients, reply, memory

    def _halves(self, task: Task, clients: torch.Tensor, failures: dict[int, str], fields):
        """:meth:`_isolated` on each half of ``clients``: a client's update is a pure function of
        (seed, round, client), so the halves reply as they would have in the whole."""
        half = len(clients) // 2
        for piece in (torch.arange(half), torch.arange(half, len(clients))):
            yield from self._isolated(task.rows(piece), clients[piece], failures, fields)

    def _reply(self, task: Task, clients: torch.Tensor) -> tuple[Record, ClientMemory | None]:
        """The clients' reply and what they staged to keep; with a timeout, computed on a worker
        thread that is cut off (and the engine's shared state rebuilt) once the timeout passes
        (:mod:`fedgp.engines.deadline`): what the cut-off work stages is never kept."""
        units = (self.outcome_offset[clients], self.outcome_scale[clients])

        def work() -> tuple[Record, ClientMemory | None]:
            ops = self.client_ops(clients, task)
            return Record(handle(self.client_strategy, ops, task, units, self.transform)), ops.memory

        if self.timeout is None:
            return work()
        try:
            return run_within(work, self.timeout)
        except Abandoned:
            self.abandoned()
            raise

    def abandoned(self) -> None:  # noqa: B027 - optional hook
        """A task was cut off and may still be running: rebuild whatever mutable state (GPyTorch
        models and modules) tasks share, so that the abandoned work writes only into the old."""

    def _culprits(self, err: BaseException, clients: torch.Tensor) -> torch.Tensor | None:
        """The positions an exception names (a proper subset of ``clients``), else ``None``."""
        if isinstance(err, ClientFailure) and err.clients:
            found = [self._position_of_key.get(k) for k in err.clients]
        elif isinstance(err, FactorizationError) and err.clients:
            found = [self._positions.get(c) for c in err.clients]
        else:
            return None
        named = torch.tensor([p for p in found if p is not None], dtype=torch.long)
        named = named[torch.isin(named, clients)]
        return named if 0 < len(named) < len(clients) else None

    @property
    def config(self) -> str:
        """The client-side strategy as JSON (what a remote client would have received)."""
        return config_json(self.client_strategy)


def faulted_ops(ops: ClientOps, task: Task) -> ClientOps:
    """``ops`` with the faults a run injects into training, where an engine builds its clients'
    operations (before :func:`fedgp.engines.tasks.handle`): ``Faults(simulate_failures=p)`` — the
    clients whose draw falls below ``p`` raise :class:`~fedgp.errors.SimulatedFailure` — and a
    label flip's attacked clients see −y (:mod:`fedgp.attacks.labels`). Other kinds run as they are."""
    if task.kind != "train":
        return ops
    p = float(task.options.get("simulate_failures", 0.0))
    if p > 0:
        # A function of (seed, round, client key) only: the same clients fail whatever the engine.
        u = client_uniform(ops.seed, "simulated failure", task.round, ops.indices, ())
        failing = ops.indices[u < p]
        if len(failing):
            raise SimulatedFailure(f"simulated failure (p = {p:g})", failing.tolist())
    return flipped_ops(ops, task) if LABEL_FLIP in task.options else ops


# -- bytes ---------------------------------------------------------------------------------------------


def _through_bytes(task: Task, count: int) -> tuple[Task, int]:
    """Each participant's message to bytes and back; the chunk's task rebuilt from what arrived."""
    if not task.personal.tensors:
        data = task_to_bytes(task)
        return task_from_bytes(data), len(data) * count
    parts = [task_to_bytes(task.rows(slice(i, i + 1))) for i in range(count)]
    received = [task_from_bytes(p) for p in parts]
    personal = Record.cat([t.personal for t in received])
    first = received[0]
    return Task(first.kind, first.round, first.shared, personal, first.options), sum(map(len, parts))


def _reply_through_bytes(reply: Record, count: int) -> tuple[Record, int]:
    parts = [record_to_bytes(reply.rows(slice(i, i + 1))) for i in range(count)]
    return Record.cat([record_from_bytes(p) for p in parts]), sum(map(len, parts))
