"""Federated BO on a Flower grid: every owner a node, its objective and its evaluations on it.

::

    loop = FlowerBO(grid, FederatedBO(spec, FGPR(), rounds=5, engine="sequential"), iterations=20,
                    seed=0, secure=SecureAggregation())
    result = loop.run()      # result.history: BOLoop's columns; result.failures: nodes dropped, why

The same iteration as :class:`~fedgp.bo.BOLoop` with :class:`~fedgp.bo.FederatedBO`, with the
owners' side on their nodes (:mod:`fedgp.bo.node`): the server asks each node for its name and
orders the nodes as its :class:`~fedgp.flower.GridEngine` does (so an owner's position, which seeds
its starting points and its acquisition, is its in-process position), has each evaluate its
starting points, and trains ``initial_rounds`` rounds; then each iteration sends every node the
strategy's ``personal`` task with the shared state (the node proposes on its personalised posterior
and evaluates its objective there) and trains ``rounds`` more rounds, warm-started
(:meth:`FederatedBO.fit_rounds`), on the grid's engine: secure aggregation and ClientDP as any
Flower run has them.

**What leaves a node**: the rounds' declared replies (as in any fedgp run; summed fields masked
under secure aggregation, clipped and noised under ClientDP), its name and number of evaluations,
and what its node config declares in ``bo-report`` (by default its best value so far). Its points,
its values and its proposals stay on it. The history has a column as a node reports it (NaN where a
node declares it not).

A node whose BO reply is an error, missing or malformed (another owner's name, a count that is not
its evaluations plus one, a value that is not a finite number, a field it may not send) is dropped
with the reason (``result.failures``): it takes no further part, and the loop goes on without it.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import pandas as pd
import torch
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from fedgp.bo.budget import LoopBudget
from fedgp.bo.callbacks import BOCallback, Budget, as_bo_callback
from fedgp.bo.federated import FederatedBO
from fedgp.bo.loop import BOResult, _Driven
from fedgp.bo.node import REPLY, REPORTS
from fedgp.errors import InputError, InputTypeError
from fedgp.flower.grid_engine import GridEngine, node_rank
from fedgp.flower.records import HEADER, task_to_content
from fedgp.flower.secagg import SecureAggregation
from fedgp.messages.remote import fields_to_json
from fedgp.run.exchange import personal_task

__all__ = ["FlowerBO"]

MESSAGE_TYPE = "query.bo"


def _checked_method(method: Any) -> FederatedBO:
    """``method``, if the nodes can run it."""
    if not isinstance(method, FederatedBO):
        raise InputTypeError(f"FlowerBO runs a fedgp.bo.FederatedBO, got {type(method).__name__}")
    if method.transforms is not None or method.batch_proposals:
        raise InputError(
            "FlowerBO: the nodes propose on the state in the objectives' units, one node each: give "
            "FederatedBO(transforms=None, batch_proposals=False)"
        )
    if not isinstance(method.acquisition.kind, str):
        raise InputError(
            "FlowerBO: an acquisition factory is a function, and functions do not cross to the nodes; "
            "name a built-in one ('qlogei', 'qucb', 'ts')"
        )
    return method


class FlowerBO(_Driven):
    """``method`` (a :class:`~fedgp.bo.FederatedBO`, or a function of the owners' input width that
    returns one: the model built for the nodes' width) on the owners of ``grid`` for ``iterations``
    iterations after ``initial`` starting points each (module docstring); ``timeout``: seconds to
    wait for a step's replies; ``secure``: secure aggregation of the rounds' summed fields;
    ``callbacks``: as :class:`~fedgp.bo.BOLoop`'s (the owners are on their nodes, so
    ``Budget(evaluations=...)``, which reads them, is refused; ``Budget(seconds=...)`` works)."""

    def __init__(
        self,
        grid: Grid,
        method: FederatedBO | Callable[[int], FederatedBO],
        iterations: int,
        *,
        initial: int = 3,
        seed: int = 0,
        timeout: float | None = None,
        secure: SecureAggregation | None = None,
        callbacks: Iterable[BOCallback | Callable[[Any], Any]] = (),
    ):
        for name, value in (("iterations", iterations), ("initial", initial)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(f"FlowerBO: {name} must be an int >= 1, got {value!r}")
        self.callbacks = [as_bo_callback(c) for c in callbacks]
        if any(isinstance(c, Budget) and c.evaluations is not None for c in self.callbacks):
            raise InputError(
                "FlowerBO: Budget(evaluations=...) reads the owners' rows, which stay on their nodes"
            )
        self.method = _checked_method(method) if isinstance(method, FederatedBO) else method
        self.iterations, self.initial, self.seed = iterations, initial, int(seed)
        self.grid, self.timeout, self.secure = grid, timeout, secure
        self.engine = GridEngine(grid, getattr(method, "spec", None), timeout, secure)
        self.owners: dict[int, str] = {}  # node -> owner name, in position order
        self.positions: dict[int, int] = {}  # node -> its position at the start (seeds its draws)
        self.counts: dict[int, int] = {}  # node -> evaluations it reported
        self.iteration, self.history, self.failures = 0, [], []
        self.stop_reason: str | None = None

    # -- messages ------------------------------------------------------------------------------------
    def _send(self, contents: Mapping[int, RecordDict], step: str) -> dict[int, ConfigRecord]:
        """Each node's BO reply, checked; a node without a usable one is dropped, with the reason."""
        messages = [
            Message(c, dst_node_id=n, message_type=MESSAGE_TYPE, group_id=f"bo {self.iteration}")
            for n, c in contents.items()
        ]
        replies, _ = self.engine._exchange(messages)
        out = {}
        for node in contents:
            reason = self.engine._failure(node, replies.get(node))
            if reason is None:
                try:
                    out[node] = self._checked(node, replies[node].content.config_records[REPLY], step)
                    continue
                except (KeyError, ValueError, TypeError) as err:
                    reason = f"Flower node {node}: malformed BO reply: {type(err).__name__}: {err}"
            self._drop(node, reason)
        return out

    def _checked(self, node: int, reply: ConfigRecord, step: str) -> ConfigRecord:
        allowed = {"owner", "evaluations", *REPORTS} | ({"d", "partition"} if step == "hello" else set())
        extra = sorted(set(reply) - allowed)
        if extra:
            raise ValueError(f"fields {extra} are not BO reply fields")
        if step == "hello":
            partition, width = json.loads(str(reply["partition"])), reply["d"]
            if partition is not None and (isinstance(partition, bool) or not isinstance(partition, int)):
                raise ValueError(f"its partition is {partition!r}, not an int")
            if isinstance(width, bool) or not isinstance(width, int) or width < 1 or not str(reply["owner"]):
                raise ValueError(f"it names owner {reply['owner']!r} of width {width!r}")
            return reply
        if str(reply["owner"]) != self.owners[node]:
            raise ValueError(f"it answers as owner {reply['owner']!r}, not {self.owners[node]!r}")
        expected = self.initial if step == "start" else self.counts[node] + 1
        count = reply["evaluations"]
        if isinstance(count, bool) or not isinstance(count, int) or count != expected:
            raise ValueError(f"it reports {count!r} evaluations, not {expected}")
        for name in set(REPORTS) & set(reply):
            value = reply[name]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                if not (name == "regret" and isinstance(value, float) and math.isnan(value)):
                    raise ValueError(f"its {name} is {value!r}, not a finite number")
        self.counts[node] = count
        return reply

    def _drop(self, node: int, reason: str) -> None:
        owner = self.owners.get(node, f"node {node}")
        self.failures.append({"iteration": self.iteration, "owner": owner, "node": node, "reason": reason})
        self.engine.excluded.add(node)
        self.owners.pop(node, None)

    def _content(self, bo: dict, task=None, head: dict | None = None) -> RecordDict:
        if task is None:
            content = RecordDict()
            content[HEADER] = ConfigRecord({"bo": json.dumps(bo)})
            return content
        return task_to_content(task, {**head, "bo": json.dumps(bo), "all_clients": False})

    # -- the loop ------------------------------------------------------------------------------------
    def start(self) -> FlowerBO:
        """Name and order the nodes, evaluate their starting points, train ``initial_rounds`` rounds."""
        nodes = self.engine._registered_nodes()
        hello = self._send({n: self._content({"op": "hello"}) for n in nodes}, "hello")
        ranks = {n: node_rank(json.loads(str(r["partition"])), n) for n, r in hello.items()}
        for position, node in enumerate(sorted(hello, key=ranks.__getitem__)):
            name = str(hello[node]["owner"])
            if name in self.owners.values():
                self._drop(node, f"Flower node {node}: another node already answers as owner {name!r}")
                continue
            self.owners[node], self.positions[node] = name, position
        widths = {int(hello[n]["d"]) for n in self.owners}
        if not widths:
            raise InputError(f"no Flower node answered as a BO owner: {self.failures}")
        if len(widths) != 1:
            raise InputError(
                f"the owners must search the same number of inputs (one shared model), got {widths}"
            )
        if not isinstance(self.method, FederatedBO):
            self.method = _checked_method(self.method(widths.pop()))
        self.engine.spec = self.method.spec
        starts = {n: self._content({"op": "start", "seed": self.seed, "initial": self.initial,
                                    "position": self.positions[n]}) for n in self.owners}  # fmt: skip
        reports = self._send(starts, "start")
        began = time.perf_counter()
        # ClientDP(epsilon=...): the whole loop's budget, planned for these owners and iterations
        self.method.budget = LoopBudget.plan(self.method.strategy, self.method, self)
        extra = self.method.fit_rounds(None, self.engine, self.seed, self.method.initial_rounds)
        self._record(0, reports, extra, 0.0, time.perf_counter() - began)
        return self._started()

    @property
    def done(self) -> bool:
        """Whether the iterations are spent, a callback stopped the loop or no owner is left."""
        return self.iteration >= self.iterations or self.stop_reason is not None or not self.owners

    def step(self) -> list[dict[str, Any]]:
        """One iteration: every node proposes and evaluates; then the federation's rounds."""
        it = self.iteration + 1
        began = time.perf_counter()
        result = self.method.result
        positions = {owner: p for p, owner in enumerate(result.roster.ids)}
        task, fields = personal_task(result, "personal", torch.arange(len(positions)))
        contents, self.iteration = {}, it
        for node, owner in list(self.owners.items()):
            if owner not in positions:  # its node did not register for the last rounds
                self._drop(node, f"Flower node {node}: owner {owner!r} took no part in the last rounds")
                continue
            row = positions[owner]
            bo = {"op": "propose", "seed": self.seed, "iteration": it, "position": self.positions[node],
                  "acquisition": self._acquisition()}  # fmt: skip
            head = {"fields": fields_to_json(fields), "first_key": row, "clients": [row]}
            contents[node] = self._content(bo, task.rows(torch.tensor([row])).as_part(), head)
        reports = self._send(contents, "propose")
        proposed = time.perf_counter()
        extra = self.method.fit_rounds(None, self.engine, self.seed, self.method.rounds)
        rows = self._record(it, reports, extra, proposed - began, time.perf_counter() - proposed)
        self._ask_method()
        for callback in self.callbacks:
            callback.on_iteration(self, rows)
        return rows

    def _acquisition(self) -> dict[str, Any]:
        a = self.method.acquisition
        return {
            "kind": a.kind,
            "beta": float(a.beta),
            "num_restarts": a.num_restarts,
            "raw_samples": a.raw_samples,
        }

    def _record(self, it: int, reports: dict, extra: dict, propose: float, update: float) -> list[dict]:
        rows = []
        for node, reply in reports.items():
            if node not in self.owners:
                continue
            row = {"iteration": it, "owner": self.owners[node], "method": self.method.name,
                   "evaluations": int(reply["evaluations"])}  # fmt: skip
            row.update(
                {name: float(reply.get(name, float("nan"))) for name in ("y", "best_observed", "regret")}
            )
            rows.append({**row, "seconds_propose": propose, "seconds_update": update, **extra})
        self.history.extend(rows)
        return rows

    def _result(self) -> BOResult:
        """The result: no owner's rows (they are on the nodes), the nodes dropped and why."""
        failures = pd.DataFrame(self.failures, columns=["iteration", "owner", "node", "reason"])
        return BOResult(pd.DataFrame(self.history), [], self.method, self.stop_reason, failures)
