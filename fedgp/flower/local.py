"""``engine="flower"``: Flower's ServerApp/ClientApp path in one process, over an in-memory grid.

:class:`LocalGrid` is a Flower ``Grid`` that hands each message straight to its node's
``ClientApp`` (with that node's ``Context``), instead of a SuperLink; everything else is the code
a deployment runs: :class:`~fedgp.flower.grid_engine.GridEngine` on the server side, the fedgp
``ClientApp`` (and any Flower mods) on each node, messages as Flower records. No Ray, no
processes, no network: for tests and quick use. A node can be taken down (:meth:`LocalGrid.kill`)
to see how a run copes with a node that stops replying.
"""

from __future__ import annotations

import itertools
import traceback
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import ClassVar
from uuid import uuid4

import numpy as np
import torch
from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.serverapp import Grid
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
from flwr.supercore.inflatable.inflatable_utils import inflate_object_from_contents
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

from fedgp.data.client import ClientData
from fedgp.engines.arrivals import Arrivals
from fedgp.engines.base import Engine
from fedgp.engines.config import Batched, EngineConfig, Sequential
from fedgp.errors import InputError
from fedgp.flower.client import client_app
from fedgp.flower.grid_engine import GridEngine
from fedgp.flower.secagg import SecureAggregation
from fedgp.messages import Field, Outcome, Roster, Task
from fedgp.models.spec import GPSpec
from fedgp.strategies.base import Strategy

__all__ = ["LocalGrid", "FlowerEngine", "Flower"]

_RUNS = itertools.count(1)


def _wire(message: Message) -> tuple[Message, int]:
    """``message`` through Flower's own wire format (its objects deflated to bytes and inflated
    back, as the SuperLink transports them) and the number of bytes."""
    contents = {oid: obj.deflate() for oid, obj in get_all_nested_objects(message).items()}
    size = sum(map(len, contents.values()))
    copy = inflate_object_from_contents(message.object_id, contents)
    copy.metadata.__dict__["_message_id"] = message.metadata.message_id  # not part of the object
    return copy, size


class LocalGrid(Grid):
    """A Flower ``Grid`` whose nodes are ``ClientApp`` objects in this process. Every message and
    reply goes through Flower's wire format; ``bytes_down``/``bytes_up`` count them."""

    def __init__(self, apps: dict[int, tuple[ClientApp, Context]]):
        self.apps = apps
        self.dead: set[int] = set()
        self._run = Run.create_empty(next(_RUNS))
        self._replies: dict[str, Message] = {}
        self.bytes_down = self.bytes_up = 0
        try:
            _ = TaskIdentity.run_id
        except RuntimeError:  # no Flower runtime in this process: act as the SuperLink's ServerApp task
            TaskIdentity.task_id, TaskIdentity.run_id = 1, self._run.run_id
            TaskIdentity.node_id = SUPERLINK_NODE_ID

    def set_run(self, run: Run) -> None:
        self._run = run

    @property
    def run(self) -> Run:
        return self._run

    def create_message(
        self,
        content: RecordDict,
        message_type: str,
        dst_node_id: int,
        group_id: str,
        ttl: float | None = None,
    ) -> Message:
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return [n for n in self.apps if n not in self.dead]

    def kill(self, node: int) -> None:
        """Take ``node`` down: it never replies again."""
        self.dead.add(node)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for message in messages:
            message.metadata.__dict__["_message_id"] = str(uuid4())  # as Flower's InMemoryGrid does
            node = message.metadata.dst_node_id
            if node in self.dead or node not in self.apps:
                continue
            app, context = self.apps[node]
            delivered, size = _wire(message)
            self.bytes_down += size
            try:
                reply = app(delivered, context)
            except Exception as err:  # noqa: BLE001 - a ClientApp error becomes an error reply, as in Flower
                reply = Message(
                    Error(code=0, reason=f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=2)}"),
                    reply_to=message,
                )
            reply, size = _wire(reply)
            self.bytes_up += size
            self._replies[message.metadata.message_id] = reply
            ids.append(message.metadata.message_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self._replies.pop(i) for i in message_ids if i in self._replies]

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        return self.pull_messages(self.push_messages(messages))


class FlowerEngine(Engine, Arrivals):
    """The federation split over ``num_nodes`` in-process Flower nodes (default: one per client).

    Args:
        node_engine: how each node runs its clients (``"sequential"`` or ``"batched"``).
        mods: Flower mods for every node's ``ClientApp``.
    """

    name = "flower"
    keeps_client_memory = True  # each node keeps its clients' values (fedgp.flower.client)

    def __init__(
        self,
        spec: GPSpec,
        clients: Sequence[ClientData],
        seed: int = 0,
        *,
        num_nodes: int | None = None,
        node_engine: str = "sequential",
        mods: Sequence = (),
        timeout: float | None = None,
        secure: SecureAggregation | None = None,
    ):
        self.spec, self.clients = spec, list(clients)
        nodes = min(num_nodes or len(self.clients), len(self.clients))
        shards = [list(p) for p in np.array_split(np.arange(len(self.clients)), nodes)]
        app = client_app(
            lambda ctx: (spec, [self.clients[i] for i in shards[int(ctx.node_config["partition-id"])]]),
            node_engine,
            mods,
        )
        apps = {}
        for i in range(nodes):
            node_id = 1000 + i
            config = {"partition-id": i, "num-partitions": nodes}
            apps[node_id] = (
                app,
                Context(run_id=0, node_id=node_id, node_config=config, state=RecordDict(), run_config={}),
            )
        self.grid = LocalGrid(apps)
        self.inner = GridEngine(self.grid, spec, timeout, secure)

    @property
    def min_nodes_per_sum(self) -> int:
        """The fewest nodes whose sum a round may release (:attr:`GridEngine.min_nodes_per_sum`)."""
        return self.inner.min_nodes_per_sum

    def start(self, strategy: Strategy, seed: int) -> Roster:
        return self.inner.start(strategy, seed)

    def run(self, task: Task, clients, fields: dict[str, Field]) -> Outcome:
        return self.inner.run(task, clients, fields)

    def dispatch(self, task: Task, clients, fields: dict[str, Field]) -> dict[int, str]:
        return self.inner.dispatch(task, clients, fields)

    def in_flight(self) -> torch.Tensor:
        return self.inner.in_flight()

    def arrivals(self, need: int, fields: dict[str, Field]) -> tuple[Outcome, torch.Tensor]:
        return self.inner.arrivals(need, fields)


@dataclass(frozen=True)
class Flower(EngineConfig):
    """Both sides of a Flower run in this process, over an in-memory grid: the federation split
    over ``num_nodes`` nodes (default one per client), each running its clients with
    ``node_engine``; ``mods`` wrap every node's ``ClientApp``; ``timeout`` per round's replies;
    ``secure`` aggregates summed fields securely (:class:`~fedgp.flower.SecureAggregation`).
    ``fit(engine=fedgp.flower.Flower(num_nodes=3))``, or ``engine="flower"`` for the defaults."""

    num_nodes: int | None = None
    node_engine: Sequential | Batched = Sequential()
    mods: tuple = ()
    timeout: float | None = None
    secure: SecureAggregation | None = None
    name: ClassVar[str] = "flower"

    @property
    def min_nodes_per_sum(self) -> int:
        """The fewest nodes whose sum a round may release: ``secure.min_nodes`` (1 without it)."""
        return 1 if self.secure is None else int(self.secure.min_nodes)

    def build(self, spec, clients, seed=0, keys=None) -> Engine:
        if keys is not None:
            raise InputError("the Flower engine hosts a whole federation, not a shard of one")
        return FlowerEngine(spec, clients, seed, num_nodes=self.num_nodes, node_engine=self.node_engine,
                            mods=tuple(self.mods), timeout=self.timeout, secure=self.secure)  # fmt: skip
