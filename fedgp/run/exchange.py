"""One exchange of a round, from the server's side: plan → task → engine → replies.

:func:`exchange` turns a strategy's :class:`~fedgp.messages.RoundPlan` (participants, maybe
repeated, with one personal row each) into one task per distinct client, has the engine deliver
it, and turns the engine's :class:`~fedgp.messages.Outcome` back into the
:class:`~fedgp.messages.Replies` the strategy aggregates: rows for every participant slot that
replied, weights renormalised over them, summed fields only as sums, failures with reasons.
Below ``min_replies`` the exchange does not count: :class:`~fedgp.errors.RoundFailedError` says
who failed and why.

:func:`exchange_arrivals` is the exchange of a server that steps on replies as they arrive
(``Asynchronous(..., speeds="measured")`` on an :class:`~fedgp.engines.arrivals.Arrivals` engine):
the plan's task goes out without waiting, and the replies are those of any earlier task that have
arrived since, each with its arrival time.

:func:`ask` is the same for the tasks that do not train (evaluate, predict, personal), without
a plan: the strategy tells each client which state to condition on, the client answers from its
own data, and only the answer travels.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fedgp.engines.arrivals import Arrivals
from fedgp.engines.base import Engine
from fedgp.engines.tasks import KINDS
from fedgp.errors import EngineError, InputError, InputTypeError, RoundFailedError
from fedgp.messages import (
    ARRIVED,
    MIN_CONTRIBUTORS,
    Field,
    Outcome,
    Record,
    Replies,
    RoundPlan,
    Setting,
    Task,
)
from fedgp.messages.roster import Roster
from fedgp.strategies.asynchronous import VERSION
from fedgp.transforms import DataTransform

__all__ = [
    "exchange",
    "exchange_arrivals",
    "send_transform",
    "ask",
    "personal_task",
    "distinct_participants",
    "Exchange",
    "required_replies",
    "check_withheld",
]


@dataclass(frozen=True)
class Exchange:
    """A finished exchange: the replies for ``aggregate`` and the outcome's accounting."""

    replies: Replies
    asked: int
    bytes_down: int
    bytes_up: int


def required_replies(min_replies: int | float, asked: int) -> int:
    """``min_replies`` as a count: an int is a count, a float in (0, 1] a fraction of those asked."""
    if isinstance(min_replies, bool) or not isinstance(min_replies, (int, float)):
        raise InputTypeError(
            f"min_replies must be an int (a count) or a float (a fraction), got {min_replies!r}"
        )
    if isinstance(min_replies, float):
        if not 0.0 < min_replies <= 1.0:
            raise InputError(f"min_replies as a fraction must be in (0, 1], got {min_replies}")
        return max(1, int(-(-min_replies * asked // 1)))
    if min_replies < 1:
        raise InputError(f"min_replies as a count must be >= 1, got {min_replies}")
    return min(int(min_replies), asked)


def distinct_participants(plan: RoundPlan) -> tuple[torch.Tensor, torch.Tensor]:
    """The plan's distinct participants (ascending) and each one's first slot: a client sampled
    twice gets one message, with the personal row of its first slot."""
    participants = torch.as_tensor(plan.participants, dtype=torch.long)
    unique, inverse = torch.unique(participants, sorted=True, return_inverse=True)
    first = torch.full((len(unique),), len(participants), dtype=torch.long)
    first.scatter_reduce_(0, inverse, torch.arange(len(participants)), reduce="amin")
    return unique, first


def exchange(
    engine: Engine,
    kind: str,
    rnd: int,
    plan: RoundPlan,
    ids: Sequence[Any],
    min_replies: int | float = 1,
    options: Mapping[str, Setting] | None = None,
    tamper: Callable[[Outcome], Outcome] | None = None,
    min_contributors: int = 1,
) -> Exchange:
    """Send ``plan`` as a ``kind`` task of round ``rnd``; the replies as ``aggregate`` sees them.

    ``tamper`` (an attack's hook, :mod:`fedgp.attacks`) rewrites the engine's outcome before it
    becomes the replies: one place, whatever the engine. ``min_contributors`` travels in the task
    (:attr:`~fedgp.messages.Task.min_contributors`): the engine releases no sum of fewer clients —
    it fails them with the reason (a one-client "sum" is that client's value) — and an outcome that
    holds one is refused (:func:`check_withheld`). The clients already hold their data in the run's
    units (the ``transform`` task, once per run: :func:`fedgp.run.exchange.send_transform`)."""
    participants = torch.as_tensor(plan.participants, dtype=torch.long)
    unique, first = distinct_participants(plan)
    options = dict(options or {})
    if min_contributors != 1:  # absent at its default: the messages of a run without it are as before
        options[MIN_CONTRIBUTORS] = int(min_contributors)
    task = Task(kind, rnd, plan.shared, plan.personal.rows(first), options)
    outcome = engine.run(task, unique, plan.replies)
    check_withheld(engine, outcome, task)
    if tamper is not None:
        outcome = tamper(outcome)
    replied = len(outcome.clients)
    needed = required_replies(min_replies, len(unique))
    if replied < needed:
        named = {ids[p]: reason for p, reason in outcome.failures.items()}
        listing = "; ".join(f"{cid!r}: {reason}" for cid, reason in list(named.items())[:10])
        more = f" (and {len(named) - 10} more)" if len(named) > 10 else ""
        when = "before round 1" if kind in ("summarise", "transform") else f"round {rnd + 1}"
        raise RoundFailedError(
            f"{when} ({kind}): {replied} of {len(unique)} clients replied, fewer than the "
            f"{needed} required; {KINDS[kind].undone}. Failed: {listing}{more}",
            named,
            withheld=outcome.withheld,
            bytes_down=outcome.bytes_down,
            bytes_up=outcome.bytes_up,
        )
    return Exchange(_replies(plan, participants, outcome), len(unique), outcome.bytes_down, outcome.bytes_up)


def exchange_arrivals(
    engine: Arrivals,
    rnd: int,
    plan: RoundPlan,
    need: int,
    versions: torch.Tensor,
    awaiting: torch.Tensor | None = None,
    options: Mapping[str, Setting] | None = None,
    tamper: Callable[[Outcome], Outcome] | None = None,
) -> Exchange:
    """Send ``plan`` as round ``rnd``'s train task without waiting, then take the replies of any
    task in flight once ``need`` of them are in (the engine's :meth:`~Arrivals.arrivals`).

    The replies' participants are the clients whose replies arrived (of this task or an earlier
    one), weighted 1 (the strategy weighs its buffer), with their arrival times as the row
    :data:`~fedgp.messages.ARRIVED`; ``versions`` is the version each client was sent (the
    strategy's bookkeeping, ``(K,)``): a reply whose ``version`` says otherwise is dropped, its
    reason with the failures, as are the clients the engine could not send to or heard nothing
    from in time, and those ``awaiting`` (``(K,)`` bool: the strategy's jobs out) whose job the
    engine does not hold (a run resumed on a fresh engine): so their owners get the next version."""
    unique, first = distinct_participants(plan)
    lost = {}
    if awaiting is not None:
        gone = awaiting & ~torch.isin(torch.arange(len(awaiting)), engine.in_flight())
        lost = dict.fromkeys(
            torch.nonzero(gone).flatten().tolist(),
            "its job is not in flight on this engine (sent before the run was resumed); it gets the "
            "next version",
        )
    task = Task("train", rnd, plan.shared, plan.personal.rows(first), dict(options or {}))
    unsent = engine.dispatch(task, unique, plan.replies)
    outcome, arrived = engine.arrivals(need, plan.replies)
    if tamper is not None:
        outcome = tamper(outcome)
    failures = {**lost, **unsent, **outcome.failures}
    said, owed = outcome.individual[VERSION], versions[outcome.clients].to(torch.float64)
    wrong = said != owed
    for client, v, w in zip(outcome.clients[wrong].tolist(), said[wrong].tolist(), owed[wrong].tolist()):
        failures[client] = f"its reply says version {v:g}, but version {w:g} was sent"
    ok = ~wrong
    individual = {k: v[ok] for k, v in outcome.individual.items()}
    individual[ARRIVED] = arrived[ok]
    clients = outcome.clients[ok]
    replies = Replies(
        clients,
        torch.ones(len(clients), dtype=torch.float64),
        individual,
        {},
        failures,
        torch.arange(len(clients)),
    )
    return Exchange(replies, len(unique), outcome.bytes_down, outcome.bytes_up)


def send_transform(engine: Engine, roster: Roster, transform: DataTransform) -> None:
    """The run's transform to every client, once (the ``transform`` task): from now on each holds
    its data in these units, and no later task carries it. Sent even when it changes nothing, so an
    engine a previous run left in other units is reset. Every client must take it — one that did
    not would answer in other units — so a failure here ends the run before round 1."""
    everyone = torch.arange(len(roster.ids))
    shared = Record(transform.tensors(), transform.settings())
    plan = RoundPlan(everyone, torch.ones(len(everyone)), shared, Record(), {})
    exchange(engine, "transform", 0, plan, roster.ids, min_replies=len(everyone))
    engine.transform_sent = transform


def check_withheld(engine: Engine, outcome: Outcome, task: Task) -> None:
    """Refuse an outcome whose sums add up fewer replies than ``task.min_contributors``: the engine
    should have withheld them (:func:`~fedgp.messages.withhold_small_sums`) before they left it, and
    an engine that does not honour the setting is not used as if it had (an
    :class:`~fedgp.errors.EngineError`, never a silent repair after the sum is out)."""
    if outcome.sums and len(outcome.clients) < task.min_contributors:
        raise EngineError(
            f"{type(engine).__name__} returned summed fields {sorted(outcome.sums)} of "
            f"{len(outcome.clients)} client(s), fewer than the task's min_contributors="
            f"{task.min_contributors}: an engine withholds such sums before it returns "
            "(fedgp.messages.withhold_small_sums)"
        )


def _replies(plan: RoundPlan, participants: torch.Tensor, outcome: Outcome) -> Replies:
    ok = torch.isin(participants, outcome.clients)
    slots = torch.nonzero(ok).flatten()
    rows = torch.searchsorted(outcome.clients, participants[slots])
    weights = plan.weights[slots]
    if len(slots) < len(participants) and len(slots):
        weights = weights * (plan.weights.sum() / weights.sum())
    individual = {k: v[rows] for k, v in outcome.individual.items()}
    return Replies(
        participants[slots], weights, individual, dict(outcome.sums), dict(outcome.failures), slots
    )


def personal_task(
    session: Any, kind: str, known: torch.Tensor, X: torch.Tensor | None = None, full_cov: bool = False
) -> tuple[Task, dict[str, Field]]:
    """The ``kind`` task for clients at training positions ``known`` (-1: never seen), and its
    declared reply: the strategy's choice of state to condition on, and the inputs ``X``."""
    strategy, server = session.strategy, session.server_state
    shared, personal = strategy.configure_personal(server, session.context, known)
    if X is not None:
        settings = {**shared.settings, "full_cov": True} if full_cov else shared.settings
        shared = Record({**shared.tensors, "X": X}, settings)
    state = strategy.global_state(server)
    clusters = int(state.batch_shape[0]) if state.batch_shape else 1
    fields = KINDS[kind].fields(session.spec, clusters, 0 if X is None else X.shape[0], full_cov)
    return Task(kind, 0, shared, personal), fields


def ask(
    session: Any,
    kind: str,
    positions: torch.Tensor,
    known: torch.Tensor | None = None,
    X: torch.Tensor | None = None,
    full_cov: bool = False,
    engine: Engine | None = None,
) -> Outcome:
    """A ``kind`` task (evaluate / predict / personal) to the clients at ``positions`` (ascending)
    of ``session.engine`` (or ``engine``): the strategy tells each client which state to condition
    on, the client answers from its own data, and only the answer travels. ``session`` holds the
    run's ``strategy``, ``server_state``, ``context`` and ``roster`` (a :class:`~fedgp.run.Run` or a
    :class:`~fedgp.run.FitResult`); ``known`` are the clients' positions in the training roster
    (default ``positions``; -1 for a client it never saw). Raises
    :class:`~fedgp.errors.RoundFailedError` when no client answers."""
    engine = session.engine if engine is None else engine
    if engine.transform_sent is not session.transform:  # a new engine, or one another fit ran on since
        send_transform(engine, session.roster, session.transform)
    task, fields = personal_task(session, kind, positions if known is None else known, X, full_cov)
    outcome = engine.run(task, positions, fields)
    if not len(outcome.clients):
        named = {session.roster.ids[p]: reason for p, reason in outcome.failures.items()}
        raise RoundFailedError(f"({kind}): no client answered; {KINDS[kind].undone}. Failed: {named}", named)
    return outcome
