"""The Flower ``ClientApp`` of fedgp: a node that hosts one or more data owners and keeps their data.

A node loads its clients' data itself (``load(context)``: from ``node_config``, a folder or a
partition id; see :func:`npz_loader`) and never sends them. For every message it rebuilds its
in-process engine — the clients' strategy comes from the run's JSON config, which the server sent
in the ``hello`` query and the node keeps in its context state — runs the task on the clients the
message names, and replies with their outcome: individual fields, the node's sum of the summed
fields (masked, under secure aggregation: :mod:`fedgp.flower.secagg`), failures. Only records
cross, both ways.

What the node's clients keep between tasks (:mod:`fedgp.strategies.memory`: personal
hyper-parameters) lives in its context state too, as a record's bytes: loaded into each message's
engine, which commits what a task staged only for the clients whose reply is as declared, and written
back once the reply is ready (a task that fails on the node keeps what it had). It is never in a reply;
a ``hello`` (a new run) empties it. A node restarted mid-run has lost its context state, the kept
values with it, and refuses the run's later tasks (no ``hello`` received): its clients fail, the other
nodes go on. A ``personal`` task (``FitResult.client_state``) would reply an owner's own values: a
node answers it only where it answers predictions (``allow_predict``), which give the noise away too.
The node cannot tell whether the server counted its reply, so a reply the server drops later (too
late, or its node dropped by secure aggregation) has still moved its clients' values on.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from flwr.app import ConfigRecord, Context, Message
from flwr.clientapp import ClientApp

from fedgp.data.client import ClientData
from fedgp.engines.base import Engine
from fedgp.engines.config import Batched, Sequential
from fedgp.errors import EngineError, InputError, MissingFileError
from fedgp.flower.records import KIND_OF, outcome_to_content, task_from_content
from fedgp.flower.secagg import RECORD, handle_stage, mask_reply
from fedgp.messages import Outcome, Task, from_config, task_from_bytes, task_to_bytes
from fedgp.messages.records import Record, record_from_bytes, record_to_bytes
from fedgp.messages.remote import fields_from_json
from fedgp.models.spec import GPSpec
from fedgp.transforms import DataTransform

__all__ = [
    "client_app",
    "kept_memory",
    "node_engine",
    "npz_loader",
    "read_npz_clients",
    "run_on_node",
    "save_npz_clients",
]

Loader = Callable[[Context], tuple[GPSpec, Sequence[ClientData]]]
_STATE = "fedgp.run"
_TRANSFORM = "fedgp.transform"
_MEMORY = "fedgp.memory"


def kept_memory(context: Context) -> dict[int, dict[str, torch.Tensor]]:
    """What the node's clients keep between tasks, by client key (empty before any is kept)."""
    held = context.state.config_records.get(_MEMORY)
    if held is None:
        return {}
    store: dict[int, dict[str, torch.Tensor]] = {}
    for name, value in record_from_bytes(bytes(held["record"])).tensors.items():
        key, _, kept = name.partition("/")
        store.setdefault(int(key), {})[kept] = value
    return store


def _keep_memory(context: Context, store: dict[int, dict[str, torch.Tensor]]) -> None:
    tensors = {f"{key}/{name}": value for key, kept in store.items() for name, value in kept.items()}
    context.state.config_records[_MEMORY] = ConfigRecord({"record": record_to_bytes(Record(tensors))})


def node_engine(engine: str | Sequential | Batched) -> Sequential | Batched:
    """How a node runs its clients: a :class:`~fedgp.engines.Sequential` or
    :class:`~fedgp.engines.Batched` config, or its name."""
    if isinstance(engine, (Sequential, Batched)):
        return engine
    if engine == "sequential":
        return Sequential()
    if engine == "batched":
        return Batched(check=False)
    raise InputError(
        f"a node's engine must be 'sequential', 'batched' or one of their configs, got {engine!r}"
    )


def _handle(
    message: Message,
    context: Context,
    load: Loader,
    engine: Sequential | Batched,
    predict: Callable[[Context], bool],
) -> Message:
    task, head = task_from_content(message.content)
    if KIND_OF.get(message.metadata.message_type) != task.kind:
        raise InputError(f"message type {message.metadata.message_type!r} does not carry a {task.kind} task")
    if task.kind == "predict" and not predict(context):
        # A posterior at points the server chooses gives a small client's rows back.
        raise InputError(
            "this node answers no prediction at server-chosen points (node config: allow-predict=true)"
        )
    if task.kind == "hello":
        context.state.config_records[_STATE] = ConfigRecord(
            {"strategy": str(head["strategy"]), "seed": int(head["seed"])}
        )
        context.state.config_records.pop(_TRANSFORM, None)  # a new run: the data as they are
        context.state.config_records.pop(_MEMORY, None)  # and nothing kept by its clients
    elif task.kind == "transform":  # the run's units, held for every later message of the run
        context.state.config_records[_TRANSFORM] = ConfigRecord({"task": task_to_bytes(task)})
    engine, outcome, fields, clients = run_on_node(task, head, context, load, engine, predict)
    secure = message.content.config_records.get(RECORD)
    masked = None if secure is None else mask_reply(context, secure, outcome.sums, fields)
    if masked is not None:  # the node's own sums leave only masked
        outcome.sums = {}
    content = outcome_to_content(outcome, engine.keys)
    if masked is not None:
        content[RECORD] = ConfigRecord({"masked": masked})
    if task.kind == "hello":  # who this node hosts, and where it stands among the nodes
        partition = context.node_config.get("partition-id")
        columns = load.columns(context) if hasattr(load, "columns") else None  # names, not data
        content["node"] = ConfigRecord(
            {"ids": json.dumps([c.id for c in clients]), "partition": json.dumps(partition),
             "columns": json.dumps(columns)}
        )  # fmt: skip
    if engine.client_strategy.keeps_client_memory and task.kind != "hello":
        _keep_memory(context, engine.memory)  # the reply is ready: the node keeps what the task committed
    return Message(content, reply_to=message)


def run_on_node(
    task: Task,
    head: ConfigRecord,
    context: Context,
    load: Loader,
    engine: Sequential | Batched,
    reveal: Callable[[Context], bool] | None = None,
) -> tuple[Engine, Outcome, dict, list[ClientData]]:
    """``task`` on the node's clients that ``head`` names, by the node's engine built for this
    message (the run's strategy and seed from its ``hello``, the run's units, what its clients
    keep): ``(engine, outcome, declared fields, the node's clients)``. ``reveal``: whether an
    owner's personal state may be answered (a reply that leaves the node); ``None`` where the
    answer stays on the node (its own use, e.g. a BO proposal). The caller keeps what the task
    committed to the clients' memory (:func:`_keep_memory`) once its reply is ready."""
    if _STATE not in context.state.config_records:
        raise EngineError("this node has not been registered for the run (no hello received)")
    run = context.state.config_records[_STATE]
    spec, clients = load(context)
    clients = list(clients)
    engine = engine.build(spec, clients, keys=int(head["first_key"]) + torch.arange(len(clients)))
    engine.prepare(from_config(json.loads(str(run["strategy"]))), int(run["seed"]))
    keeps = engine.client_strategy.keeps_client_memory
    if keeps and task.kind == "personal" and reveal is not None and not reveal(context):
        # Its answer is an owner's own state; a prediction would give the same away (its noise).
        raise InputError(
            "this node does not reveal its owners' personal hyper-parameters (a personal task); "
            "node config: allow-predict=true"
        )
    if keeps:  # the engine is built per message; what its clients keep is the node's
        engine.memory.update(kept_memory(context))
    held = context.state.config_records.get(_TRANSFORM)
    if held is not None:  # the engine is built per message; the units are the run's
        units = task_from_bytes(bytes(held["task"]))
        engine.use_transform(DataTransform.from_parts(units.shared.tensors, units.shared.settings))
    if bool(head["all_clients"]):
        rows = torch.arange(len(clients))
    else:
        rows = engine.positions([int(k) for k in head["clients"]])
    fields = fields_from_json(str(head["fields"]))
    return engine, engine.run(task, rows, fields), fields, clients


def client_app(
    load: Loader,
    engine: str | Sequential | Batched = "sequential",
    mods: Sequence = (),
    allow_predict: bool | Callable[[Context], bool] = True,
) -> ClientApp:
    """A ``ClientApp`` hosting the clients ``load(context)`` returns (with the node's ``GPSpec``).

    ``engine``: how the node runs its clients (``"sequential"``, or ``"batched"`` for a silo with
    many, or a config of either); ``mods``: Flower mods wrapped around every message;
    ``allow_predict``: whether the node answers ``predict`` tasks (a posterior at points the server
    chooses) and, for a strategy with personal hyper-parameters, ``personal`` tasks (an owner's own
    values), or a function of the node's context deciding it (fedgp's app: ``allow-predict`` in the
    node config, off by default).
    """
    app = ClientApp(mods=list(mods))
    config = node_engine(engine)
    predict = allow_predict if callable(allow_predict) else (lambda context: bool(allow_predict))

    def handle(message: Message, context: Context) -> Message:
        return _handle(message, context, load, config, predict)

    app.train()(handle)
    app.evaluate()(handle)
    for action in ("hello", "summarise", "transform", "predict", "personal"):
        app.query(action)(handle)
    app.query("secagg")(handle_stage)  # the secure-aggregation steps around a task with summed fields
    return app


def save_npz_clients(folder: str | Path, clients: Sequence[ClientData]) -> None:
    """Write clients as ``<folder>/<i>.npz`` (``X``, ``y``, optional ``X_test``/``y_test``, ``id``),
    the format :func:`npz_loader` reads."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for i, c in enumerate(clients):
        arrays = {"X": c.X.numpy(), "y": c.y.numpy(), "id": np.array(json.dumps(c.id))}
        if c.X_test is not None:
            arrays.update(X_test=c.X_test.numpy(), y_test=c.y_test.numpy())
        np.savez(folder / f"{i:05d}.npz", **arrays)


def read_npz_clients(folder: str | Path) -> list[ClientData]:
    """Every ``*.npz`` client in ``folder`` (:func:`save_npz_clients`' format), in name order. Files
    are read with ``allow_pickle=False``: a data file can never run code."""
    clients = []
    for path in sorted(Path(folder).glob("*.npz")):
        with np.load(path, allow_pickle=False) as f:
            test = {k: f[k] for k in ("X_test", "y_test") if k in f}
            clients.append(ClientData(f["X"], f["y"], id=json.loads(str(f["id"])), **test))
    if not clients:
        raise MissingFileError(f"no client files (*.npz) in {folder}")
    return clients


def npz_loader(spec: Callable[[], GPSpec], key: str = "data-path") -> Loader:
    """A loader of the clients in the folder ``node_config[key]`` (:func:`read_npz_clients`)."""
    cache: dict = {}

    def load(context: Context):
        folder = Path(str(context.node_config[key]))
        if folder not in cache:
            cache[folder] = (spec(), read_npz_clients(folder))
        return cache[folder]

    return load
