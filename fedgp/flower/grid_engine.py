"""A fedgp engine over a Flower ``Grid``: the server side of a Flower run.

It is what ``fit`` talks to inside a ``ServerApp`` (deployment or simulation) and inside
``engine="flower"``. ``start`` sends a ``hello`` query to every node the grid knows, with the
strategy's JSON config and the seed; each node replies with its clients' ids, sizes and its
``partition-id`` (if it has one), and the server orders the nodes by partition id, then node id,
giving each node a contiguous range of client keys. ``run`` sends each node one message with the
task rows of its participating clients and merges the replies. An error reply fails that node's
clients with Flower's reason, and so does a reply that no fedgp node makes (a record missing or
unreadable: "malformed reply"); a node that does not reply within ``timeout`` (dead, disconnected)
fails them with "no reply".

With ``secure`` (:class:`~fedgp.flower.secagg.SecureAggregation`), a task whose reply declares a
summed field runs inside the secure-aggregation protocol: the nodes' summed fields arrive masked
and only their sum over the nodes that completed the round is ever decoded.

For a server that steps on replies as they arrive (``Asynchronous(..., speeds="measured")``) the
engine is also :class:`~fedgp.engines.arrivals.Arrivals`: ``dispatch`` pushes a task's messages and
returns, ``arrivals`` pulls the replies of every message still in flight (whatever task it carried)
until enough clients' replies are in, and times each on the wall clock. A message older than
``timeout`` is given up (its clients fail with "no reply"); an error reply or one no fedgp node
makes fails that node's clients with the reason. Secure aggregation releases one exchange's sum,
which a buffer of replies from several exchanges cannot use: ``dispatch`` refuses it.
"""

from __future__ import annotations

import json
import re
import time
import warnings
from collections.abc import Mapping

import torch
from flwr.app import Message, RecordDict
from flwr.serverapp import Grid

from fedgp.engines.arrivals import Arrivals
from fedgp.engines.base import Engine
from fedgp.engines.tasks import reply_fields
from fedgp.errors import EngineError, FedGPWarning
from fedgp.flower.capture import message_bytes
from fedgp.flower.records import message_type, outcome_from_content, task_to_content
from fedgp.flower.secagg import MESSAGE_TYPE, RECORD, SecAggRound, SecureAggregation
from fedgp.messages import Field, Outcome, Roster, Task, config_json, merge_outcomes, withhold_small_sums
from fedgp.messages.records import Record
from fedgp.messages.remote import fields_to_json
from fedgp.messages.round import check_reply
from fedgp.models.spec import GPSpec
from fedgp.strategies.base import Strategy

__all__ = ["GridEngine", "plain_reason", "by_reason", "node_rank"]

#: Flower's form of a ClientApp's exception in an error reply: ``<class 'pkg.Name'>:<'message'>``.
_FLOWER_REASON = re.compile(r"<class '(?:[\w.]+\.)?(\w+)'>:<'(.*)'>", re.S)


def plain_reason(reason: str) -> str:
    """A node's error reason as one readable line: Flower's ``<class 'fedgp.errors.TableError'>:<'...'>``
    becomes ``TableError: ...``, and a traceback after the message is left out (the node's log has it)."""
    text = str(reason).strip()
    found = _FLOWER_REASON.fullmatch(text)
    if found:
        text = f"{found.group(1)}: {found.group(2)}"
    text = text.split("\nTraceback (most recent call last)")[0]
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())


def by_reason(failures: Mapping[int, str]) -> str:
    """Nodes' failures grouped by reason, one clause per reason: ``node 1, node 2: TableError: ...``."""
    grouped: dict[str, list[int]] = {}
    for node, reason in failures.items():
        grouped.setdefault(plain_reason(reason), []).append(node)
    return "; ".join(
        f"{'node' if len(nodes) == 1 else 'nodes'} {', '.join(map(str, nodes))}: {reason}"
        for reason, nodes in grouped.items()
    )


def node_rank(partition: int | None, node: int) -> tuple[int, int, int]:
    """Where a node stands among a run's nodes: by its ``partition-id``, then (nodes with none) by
    its node id. The clients' training positions follow this order."""
    return (0, int(partition), node) if partition is not None else (1, node, node)


#: What reading a reply that no fedgp node makes may raise (a missing record, a bad layout).
_MALFORMED = (KeyError, ValueError, TypeError, AttributeError, IndexError, RuntimeError)

#: Seconds before the first pull for a round's replies (Flower's own grid waits 3 s); later pulls
#: come at intervals growing by :data:`POLL_GROWTH` up to :data:`POLL_CAP`. Every pull is a request
#: the SuperLink serves (about 10 ms of its time), so the schedule trades load for latency: on the
#: 3-node loopback benchmark 0.05 s x1.1 up to 0.2 s gave 0.99 s per round, 0.1 s x1.25 up to 1 s
#: 1.03-1.07 s (each pull late by up to a quarter of a growing interval).
FIRST_POLL, POLL_GROWTH, POLL_CAP = 0.05, 1.1, 0.2
#: Seconds the grid's node count must stay the same before ``start`` says hello to them (Flower's
#: simulation runtime registers its SuperNodes one by one, after the ServerApp's thread started).
NODE_SETTLE = 0.2
#: Seconds ``start`` waits for a first node when the engine has no ``timeout``.
NODE_WAIT = 300.0


class GridEngine(Engine, Arrivals):
    """fedgp's dispatch over the nodes of a Flower ``Grid``.

    Args:
        grid: the ServerApp's grid (deployment, simulation, or :class:`~fedgp.flower.local.LocalGrid`).
        spec: the model specification, for declaring replies (the nodes have their own).
        timeout: seconds to wait for the replies of a round; missing ones are failures.
        secure: secure aggregation of the summed fields (``None``: each node's sum arrives as it is).
    """

    name = "flower"
    #: Each node keeps its own clients' personal values in its context state (:mod:`fedgp.flower.client`).
    keeps_client_memory = True

    def __init__(
        self, grid: Grid, spec: GPSpec, timeout: float | None = None, secure: SecureAggregation | None = None
    ):
        self.grid, self.spec, self.timeout, self.secure = grid, spec, timeout, secure
        self.nodes: list[int] = []
        self._first: dict[int, int] = {}
        self._node_of = torch.zeros(0, dtype=torch.long)  # each client's node, as an index into nodes
        #: Each registered node's feature columns, as its ``hello`` named them (``None``: not named).
        self.node_columns: dict[int, list[str] | None] = {}
        #: Messages dispatched and not yet answered: id -> (node, its clients, when pushed).
        self._flight: dict[str, tuple[int, torch.Tensor, float]] = {}
        self._clock: float | None = None  # when the first dispatch went out (monotonic seconds)
        #: Nodes the engine no longer says hello to (a caller dropped them, e.g. a BO loop whose node
        #: sent a malformed reply).
        self.excluded: set[int] = set()

    @property
    def feature_names(self) -> tuple[str, ...] | None:
        """The feature columns every registered node named in its ``hello``, in order (``None``
        when a node named none, or the nodes disagree): what the fit result records."""
        named = {tuple(c) if c is not None else None for c in self.node_columns.values()}
        return named.pop() if len(named) == 1 else None

    def _exchange(self, messages: list[Message]) -> tuple[dict[int, Message], int]:
        replies = self._send_and_receive(messages)
        return {m.metadata.src_node_id: m for m in replies}, len(replies)

    def _send_and_receive(self, messages: list[Message]) -> list[Message]:
        """Flower's ``send_and_receive`` with a short first poll: a deployment's grid pulls every
        3 s, a fixed cost per exchange of a round; here the first pull comes after
        :data:`FIRST_POLL` seconds, then at intervals growing by :data:`POLL_GROWTH` up to
        :data:`POLL_CAP`."""
        pending = set(self.grid.push_messages(messages))
        end = None if self.timeout is None else time.monotonic() + self.timeout
        replies, wait = [], FIRST_POLL
        while pending:
            got = list(self.grid.pull_messages(pending))
            replies += got
            pending -= {m.metadata.reply_to_message_id for m in got}
            left = None if end is None else end - time.monotonic()
            if not pending or (left is not None and left <= 0):
                break
            time.sleep(wait if left is None else min(wait, left))
            wait = min(wait * POLL_GROWTH, POLL_CAP)
        return replies

    def _grid_nodes(self) -> list[int]:
        """The grid's node ids, less :attr:`excluded`, in order."""
        return sorted(int(n) for n in self.grid.get_node_ids() if int(n) not in self.excluded)

    def _registered_nodes(self) -> list[int]:
        """The grid's nodes, once some have registered and their number has stopped changing for
        :data:`NODE_SETTLE` seconds. A ServerApp may start before its nodes: Flower's simulation
        runtime starts the ServerApp's thread, then registers the simulated SuperNodes; in a
        deployment a SuperNode may connect after ``flwr run``. Waits up to ``timeout`` seconds (a
        grid with no node after it is an error that says what to start)."""
        patience = NODE_WAIT if self.timeout is None else self.timeout
        end = time.monotonic() + patience
        seen, wait = self._grid_nodes(), FIRST_POLL
        while time.monotonic() < end:
            time.sleep(NODE_SETTLE if seen else wait)
            now = self._grid_nodes()
            if now and now == seen:
                return now
            seen, wait = now, min(wait * POLL_GROWTH, POLL_CAP)
        if not seen:
            raise EngineError(
                f"the Flower grid has no nodes: none registered within {patience:g} s; start the "
                "SuperNodes (flwr supernode list shows the registered ones)"
            )
        return seen

    def start(self, strategy: Strategy, seed: int) -> Roster:
        self._flight, self._clock = {}, None  # a new run: nothing of an earlier one is awaited
        nodes = self._registered_nodes()
        head = {
            "strategy": config_json(strategy.client_view()),
            "seed": int(seed),
            "fields": fields_to_json(reply_fields("hello", self.spec, 1)),
            "first_key": 0,
            "clients": [],
        }
        messages = [self._message(Task("hello"), node, head, all_clients=True) for node in nodes]
        replies, _ = self._exchange(messages)
        missing = {
            n: (replies[n].error.reason if n in replies else "no reply")
            for n in nodes
            if n not in replies or replies[n].has_error()
        }
        if missing:  # a node that cannot register sits the run out; the others go ahead
            warnings.warn(f"Flower nodes not registered: {by_reason(missing)}", FedGPWarning, stacklevel=2)
        nodes = [n for n in nodes if n not in missing]
        if not nodes:
            raise EngineError(f"no Flower node registered: {by_reason(missing)}")
        outcomes = {n: outcome_from_content(replies[n].content) for n in nodes}
        ranks = {
            n: node_rank(json.loads(str(replies[n].content.config_records["node"]["partition"])), n)
            for n in nodes
        }
        self.nodes = sorted(nodes, key=ranks.__getitem__)
        ids, sizes, n_test, dims, node_of = [], [], [], [], []
        self._first = {}
        for index, node in enumerate(self.nodes):
            out = outcomes[node]
            self._first[node] = len(ids)
            ids.extend(json.loads(replies[node].content.config_records["node"]["ids"]))
            sizes.append(out.individual["n"])
            n_test.append(out.individual["n_test"])
            dims.append(out.individual["d"])
            node_of.extend([index] * len(out.clients))  # an index: Flower node ids are unsigned 64-bit
        self._node_of = torch.tensor(node_of, dtype=torch.long)
        self.node_columns = {
            n: json.loads(str(replies[n].content.config_records["node"].get("columns", "null")))
            for n in self.nodes
        }
        return Roster(ids, torch.cat(sizes), torch.cat(n_test), torch.cat(dims))

    def _message(self, task: Task, node: int, head: dict, all_clients: bool = False) -> Message:
        content = task_to_content(task, {**head, "all_clients": all_clients})
        return Message(
            content, dst_node_id=node, message_type=message_type(task.kind), group_id=str(task.round)
        )

    def _failure(self, node: int, reply: Message | None) -> str | None:
        """Why ``node`` has no usable reply (``None`` when it has one)."""
        if reply is None:
            return f"no reply from Flower node {node} (timeout {self.timeout} s or node lost)"
        return f"Flower node {node}: {plain_reason(reply.error.reason)}" if reply.has_error() else None

    def _secagg_exchange(
        self, contents: Mapping[int, RecordDict], rnd: int, spent: list[int]
    ) -> dict[int, RecordDict | str]:
        """One step of the secure-aggregation protocol: each node's reply content, or why it has
        none; ``spent`` adds the step's bytes down and up, as Flower serialises the messages."""
        messages = [
            Message(c, dst_node_id=n, message_type=MESSAGE_TYPE, group_id=str(rnd))
            for n, c in contents.items()
        ]
        spent[0] += sum(len(message_bytes(m)) for m in messages)
        replies, _ = self._exchange(messages)
        spent[1] += sum(len(message_bytes(m)) for m in replies.values() if not m.has_error())
        return {n: self._failure(n, replies.get(n)) or replies[n].content for n in contents}

    @property
    def min_nodes_per_sum(self) -> int:
        """The fewest nodes whose sum a round may release: secure aggregation's ``min_nodes`` (1
        without it). A round that sampled fewer has its summed fields withheld (``Outcome.withheld``)."""
        return 1 if self.secure is None else int(self.secure.min_nodes)

    @staticmethod
    def _withheld(
        fields: Mapping[str, Field], clients: torch.Tensor, reason: str, spent: list[int]
    ) -> Outcome:
        """No reply: every client of the round fails with ``reason``, the sums withheld for it."""
        out = Outcome.empty(fields, dict.fromkeys(clients.tolist(), reason))
        out.bytes_down, out.bytes_up, out.withheld = spent[0], spent[1], reason
        return out

    def _members(self, clients: torch.Tensor) -> dict[int, torch.Tensor]:
        """Each node hosting some of ``clients``, with the rows of ``clients`` it hosts."""
        members = {}
        for index, node in enumerate(self.nodes):
            rows = torch.nonzero(self._node_of[clients] == index).flatten()
            if len(rows):
                members[node] = rows
        return members

    def run(self, task: Task, clients: torch.Tensor, fields: Mapping[str, Field]) -> Outcome:
        clients = torch.as_tensor(clients, dtype=torch.long)
        text = fields_to_json(fields)
        members = self._members(clients)
        secure, spent = None, [0, 0]
        if self.secure is not None and members and any(f.summed for f in fields.values()):
            secure = SecAggRound(
                self.secure, lambda c: self._secagg_exchange(c, task.round, spent), list(members)
            )
            try:
                carry = secure.setup()
            except EngineError as err:  # too few nodes: the round's sums are not released
                return self._withheld(fields, clients, str(err), spent)
        messages = []
        for node, rows in members.items():
            if secure is not None and node not in carry:
                continue
            head = {"fields": text, "first_key": self._first[node], "clients": clients[rows].tolist()}
            message = self._message(task.rows(rows).as_part(), node, head)  # a node's sum is a part
            if secure is not None:
                message.content[RECORD] = carry[node]
            messages.append(message)
        replies, _ = self._exchange(messages) if messages else ({}, 0)
        parts, masked = [], {}
        for node, rows in members.items():
            who, reply = clients[rows], replies.get(node)
            reason = secure.dropped.get(node) if secure is not None else None
            reason = reason or self._failure(node, reply)
            if reason is None:
                try:
                    outcome = outcome_from_content(reply.content)
                except _MALFORMED as err:  # a reply no fedgp node makes: that node's failure
                    reason = f"Flower node {node}: malformed reply: {type(err).__name__}: {err}"
            if reason is None and secure is not None:  # a node whose masked input is malformed leaves
                value = secure.masked_input(node, reply.content, fields)
                if value is None:
                    reason = f"Flower node {node}: {secure.dropped[node]}"
                else:
                    masked[node] = value
            if reason is None:
                parts.append(outcome)
                continue
            parts.append(Outcome.empty(fields, dict.fromkeys(who.tolist(), reason)))
        out = merge_outcomes(parts, fields)
        if secure is not None:
            try:
                sums = secure.finish(masked, fields)
            except EngineError as err:  # too few survivors: the round's sums are not released
                spent[0], spent[1] = spent[0] + out.bytes_down, spent[1] + out.bytes_up
                return self._withheld(fields, clients, str(err), spent)
            out.sums = sums if len(out.clients) else {}
            # The protocol's own messages (keys, shares, unmask), as Flower serialises them.
            out.bytes_down += spent[0]
            out.bytes_up += spent[1]
        return withhold_small_sums(out, fields, task.min_contributors)

    # -- replies as they arrive (fedgp.engines.arrivals) -------------------------------------------
    def dispatch(self, task: Task, clients: torch.Tensor, fields: Mapping[str, Field]) -> dict[int, str]:
        """Push ``task``'s messages to the nodes of ``clients`` and return at once (module docstring)."""
        if self.secure is not None:
            raise EngineError(
                "secure aggregation does not combine with a server that consumes replies as they arrive "
                "(Asynchronous): it releases the sum of one exchange's replies, and a buffer mixes replies "
                "of several exchanges, each weighed by its own staleness; run without secure-aggregation"
            )
        clients = torch.as_tensor(clients, dtype=torch.long)
        text = fields_to_json(fields)
        sent = []
        for node, rows in self._members(clients).items():
            head = {"fields": text, "first_key": self._first[node], "clients": clients[rows].tolist()}
            sent.append((self._message(task.rows(rows).as_part(), node, head), node, clients[rows]))
        if self._clock is None:
            self._clock = time.monotonic()
        pushed = set(self.grid.push_messages([m for m, _, _ in sent])) if sent else set()
        now, failures = time.monotonic(), {}
        for message, node, who in sent:
            mid = message.metadata.message_id  # the grid sets it as it pushes
            if mid and mid in pushed:
                self._flight[mid] = (node, who, now)
            else:
                failures.update(
                    dict.fromkeys(who.tolist(), f"Flower node {node}: the message was not pushed")
                )
        return failures

    def in_flight(self) -> torch.Tensor:
        """The clients of every message pushed and not yet answered or given up."""
        held = [who for _, who, _ in self._flight.values()]
        return torch.sort(torch.cat(held)).values if held else torch.zeros(0, dtype=torch.long)

    def arrivals(self, need: int, fields: Mapping[str, Field]) -> tuple[Outcome, torch.Tensor]:
        """Pull the messages in flight until ``need`` clients' replies are in (module docstring)."""
        parts, when, arrived, wait = [], {}, 0, FIRST_POLL
        while self._flight:
            got = list(self.grid.pull_messages(list(self._flight)))
            now = time.monotonic()
            for reply in got:
                flight = self._flight.pop(reply.metadata.reply_to_message_id, None)
                if flight is None:  # not a message of ours in flight (pulled twice, or given up)
                    continue
                outcome = self._arrived(flight[0], flight[1], reply, fields)
                when.update(dict.fromkeys(outcome.clients.tolist(), now - self._clock))
                arrived += len(outcome.clients)
                parts.append(outcome)
            if self.timeout is not None:
                for mid, (node, who, pushed) in list(self._flight.items()):
                    if now - pushed > self.timeout:
                        del self._flight[mid]
                        parts.append(
                            Outcome.empty(fields, dict.fromkeys(who.tolist(), self._failure(node, None)))
                        )
            if arrived >= need or not self._flight:
                break
            time.sleep(wait)
            wait = min(wait * POLL_GROWTH, POLL_CAP)
        out = merge_outcomes(parts, fields)
        return out, torch.tensor([when[c] for c in out.clients.tolist()], dtype=torch.float64)

    def _arrived(self, node: int, who: torch.Tensor, reply: Message, fields: Mapping[str, Field]) -> Outcome:
        """A node's reply to a dispatched task, checked: an error reply, a reply no fedgp node makes
        (unreadable, other clients than asked, a row that does not match ``fields``) fails the
        clients it concerns with the reason."""
        reason = self._failure(node, reply)
        if reason is None:
            try:
                outcome = outcome_from_content(reply.content)
                rows = outcome.individual
                if not set(outcome.clients.tolist()) | set(outcome.failures) <= set(who.tolist()):
                    raise ValueError(
                        f"it answers for clients {outcome.clients.tolist()}, asked {who.tolist()}"
                    )
                plain = {k: f for k, f in fields.items() if not f.summed}
                reasons = check_reply(Record(dict(rows)), plain, len(outcome.clients))
            except _MALFORMED as err:
                reason = f"Flower node {node}: malformed reply: {type(err).__name__}: {err}"
        if reason is not None:
            return Outcome.empty(fields, dict.fromkeys(who.tolist(), reason))
        bad = [i for i, r in enumerate(reasons) if r is not None]
        left_out = set(who.tolist()) - set(outcome.clients.tolist()) - set(outcome.failures)
        if bad or left_out:  # those clients fail; the node's other clients keep their rows
            keep = torch.tensor([i for i in range(len(reasons)) if reasons[i] is None], dtype=torch.long)
            failures = {**outcome.failures}
            failures.update(
                dict.fromkeys(left_out, f"Flower node {node}: malformed reply: it leaves the client out")
            )
            failures.update(
                {int(outcome.clients[i]): f"Flower node {node}: malformed reply: {reasons[i]}" for i in bad}
            )
            outcome = Outcome(outcome.clients[keep], {k: v[keep] for k, v in rows.items()}, {}, failures,
                              outcome.bytes_down, outcome.bytes_up)  # fmt: skip
        return outcome
