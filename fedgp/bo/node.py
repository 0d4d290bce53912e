"""A federated-BO owner on a Flower node: its objective, its evaluations and its proposals stay there.

A SuperNode is an owner when its node config names ``bo-objective="package.module:function"`` (the
black box, imported on the node: a function never crosses a process boundary) and ``bo-bounds``
(its search box as JSON, ``[[lower, ...], [upper, ...]]``). Optional keys:

* ``bo-owner`` — its name in the history (default ``node-<node id>``);
* ``bo-report`` — what leaves the node after each evaluation besides its number of evaluations,
  comma-separated of ``best_observed`` (its best value so far), ``y`` (the value just observed) and
  ``regret``; default ``best_observed``; ``none`` for nothing;
* ``bo-optimum``, ``bo-truth`` (``module:function``) — a benchmark's regret reference (:class:`Owner`).

The node keeps its evaluations in its ``context.state`` (:data:`STATE`) and answers the server's
``query.bo`` messages (:func:`handle_bo`): ``hello`` (its name, width and partition), ``start`` (its
starting points, drawn as :class:`~fedgp.bo.BOLoop` draws them, evaluated) and ``propose`` (the
strategy's ``personal`` task with the broadcast shared state: the node conditions that state on its
own rows, maximises the acquisition on that posterior, evaluates its objective at the maximiser and
keeps the row). A reply holds the owner's name, its number of evaluations and the ``bo-report``
fields: never a point, never a value it did not declare.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from typing import Any

import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict

from fedgp.bo.acquisition import Acquisition, acquisition_seed
from fedgp.bo.loop import uniform_points
from fedgp.bo.owner import DTYPE, Owner
from fedgp.data.client import ClientData
from fedgp.errors import EngineError, InputError, InputTypeError
from fedgp.export.botorch_model import botorch_model
from fedgp.flower.client import Loader, run_on_node
from fedgp.flower.records import HEADER, task_from_content
from fedgp.messages import read_state

__all__ = ["STATE", "REPLY", "REPORTS", "is_bo_node", "node_owner", "node_clients", "handle_bo"]

#: The node's evaluations in its ``context.state``; the BO fields of a message and of its reply.
STATE = REPLY = "fedgp.bo"
#: What a node may declare in ``bo-report``.
REPORTS = ("best_observed", "y", "regret")


def is_bo_node(context: Context) -> bool:
    """Whether this node is a BO owner (its node config names ``bo-objective``)."""
    return "bo-objective" in context.node_config


def _imported(path: Any, key: str) -> Callable[..., Any]:
    """The function ``module:name`` names (node config ``key``), imported on this node."""
    module, _, name = str(path).partition(":")
    if not module or not name:
        raise InputError(f"node config {key!r} must be 'package.module:function', got {path!r}")
    try:
        found = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        raise InputError(f"node config {key!r}: cannot import {path!r} on this node ({err})") from None
    if not callable(found):
        raise InputTypeError(f"node config {key!r}: {path!r} is a {type(found).__name__}, not a function")
    return found


def reports(context: Context) -> tuple[str, ...]:
    """The fields this node declared in ``bo-report`` (checked)."""
    text = str(context.node_config.get("bo-report", "best_observed")).strip()
    names = () if text == "none" else tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = sorted(set(names) - set(REPORTS))
    if unknown:
        raise InputError(f"node config 'bo-report': {unknown} unknown; it lists some of {REPORTS} (or none)")
    return names


def node_owner(context: Context) -> Owner:
    """This node's :class:`Owner` from its node config, holding the evaluations kept in its state."""
    config = context.node_config
    if not is_bo_node(context):
        raise InputError("this node is no BO owner: its node config names no 'bo-objective'")
    if "bo-bounds" not in config:
        raise InputError(
            "node config 'bo-bounds' is missing: the search box as JSON, [[lower, ...], [upper, ...]]"
        )
    try:
        bounds = json.loads(str(config["bo-bounds"]))
    except json.JSONDecodeError as err:
        raise InputError(f"node config 'bo-bounds' is not JSON ({err})") from None
    optimum = config.get("bo-optimum")
    truth = config.get("bo-truth")
    owner = Owner(
        str(config.get("bo-owner", f"node-{context.node_id}")),
        _imported(config["bo-objective"], "bo-objective"),
        bounds, truth=_imported(truth, "bo-truth") if truth else None,
        optimum=None if optimum in (None, "") else float(optimum),
    )  # fmt: skip
    held = context.state.config_records.get(STATE)
    if held is not None:
        y = torch.frombuffer(bytearray(bytes(held["y"])), dtype=DTYPE) if len(bytes(held["y"])) else None
        if y is not None:
            X = torch.frombuffer(bytearray(bytes(held["X"])), dtype=DTYPE).reshape(len(y), owner.dim)
            owner.X, owner.y = X, y
    return owner


def _keep(context: Context, owner: Owner) -> None:
    """The owner's evaluations into the node's state (they never leave it)."""
    context.state.config_records[STATE] = ConfigRecord(
        {"X": owner.X.contiguous().numpy().tobytes(), "y": owner.y.contiguous().numpy().tobytes()}
    )


def node_clients(context: Context) -> list[ClientData]:
    """The node's one client for the federation's rounds: its evaluations so far."""
    owner = node_owner(context)
    if not len(owner.y):
        raise EngineError(f"BO owner {owner.id!r} has no evaluation yet (no 'start' received)")
    return [ClientData(owner.X.clone(), owner.y.clone(), id=owner.id)]


def _report(owner: Owner, declared: tuple[str, ...]) -> ConfigRecord:
    values = {"best_observed": owner.best_observed, "y": lambda: float(owner.y[-1]), "regret": owner.regret}
    out: dict[str, Any] = {"owner": str(owner.id), "evaluations": len(owner.y)}
    out.update({name: float(values[name]()) for name in declared})
    return ConfigRecord(out)


def _propose(message: Message, context: Context, load: Loader, engine: Any, owner: Owner, bo: dict) -> None:
    """Condition the broadcast state on the node's rows, maximise the acquisition, evaluate there."""
    task, head = task_from_content(message.content)
    if task.kind != "personal":
        raise InputError(f"a BO proposal carries the strategy's personal task, not a {task.kind!r} task")
    _, outcome, _, _ = run_on_node(task, head, context, load, engine)
    if outcome.failures:
        raise EngineError(
            f"BO owner {owner.id!r}: no personal state: {next(iter(outcome.failures.values()))}"
        )
    spec, _ = load(context)
    state = read_state(outcome.individual, spec, "state/").index(0)
    model = botorch_model(spec, state, owner.X.to(spec.dtype), owner.y.to(spec.dtype))
    settings = dict(bo["acquisition"])
    acquisition = Acquisition(str(settings.pop("kind")), **settings)
    seed = acquisition_seed(int(bo["seed"]), int(bo["position"]), int(bo["iteration"]))
    X, _ = acquisition.propose(model, owner.y, owner.bounds, seed)
    owner.evaluate(X)


def handle_bo(message: Message, context: Context, load: Loader, engine: Any) -> Message:
    """A node's answer to a ``query.bo`` message (module docstring): ``hello``, ``start`` or
    ``propose``; ``load`` and ``engine`` are the node's ClientApp's (the rounds' own)."""
    bo = json.loads(str(message.content.config_records[HEADER]["bo"]))
    owner = node_owner(context)
    declared = reports(context)
    if bo["op"] == "hello":
        partition = context.node_config.get("partition-id")
        reply = ConfigRecord({"owner": str(owner.id), "d": owner.dim, "partition": json.dumps(partition)})
    elif bo["op"] == "start":  # a new loop: the starting points, as BOLoop draws them
        owner.X, owner.y = torch.empty(0, owner.dim, dtype=DTYPE), torch.empty(0, dtype=DTYPE)
        owner.evaluate(uniform_points(owner.bounds, int(bo["initial"]), int(bo["seed"]), "bo initial",
                                      int(bo["position"])))  # fmt: skip
        _keep(context, owner)
        reply = _report(owner, declared)
    elif bo["op"] == "propose":
        _propose(message, context, load, engine, owner, bo)
        _keep(context, owner)
        reply = _report(owner, declared)
    else:
        raise InputError(f"unknown BO step {bo['op']!r}")
    content = RecordDict()
    content[REPLY] = reply
    return Message(content, reply_to=message)
