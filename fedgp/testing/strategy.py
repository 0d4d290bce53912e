"""The contract every strategy keeps, as a pytest class to subclass (in the spirit of GPyTorch's
``BaseKernelTestCase`` and scikit-learn's ``estimator_checks``).

A strategy — fedgp's own or yours — subclasses :class:`StrategyContract`, names itself and declares
what leaves a client in its training rounds::

    from fedgp.testing import StrategyContract

    class TestMyStrategy(StrategyContract):
        strategy = MyStrategy(lr=0.1)
        expected_replies = {"state/*": "individual", "loss": "individual", "stats": "summed"}

``expected_replies`` maps reply-field name patterns (:mod:`fnmatch`) to ``"individual"`` (the server
sees each client's row) or ``"summed"`` (only the sum over the round's clients). The data default
to a small :func:`~fedgp.synthetic.gp_federation` with test splits; override :meth:`make_data` for
another model (a linear-regression strategy returns a ``gaussian_mixed_regression`` federation and
its spec, as :func:`fedgp.testing.zoo.strategy_zoo` does).

It checks, each a property that fails if broken:

* **records only** — the strategy and its client view round-trip through their JSON configs;
  every plan's shared and personal parts are :class:`~fedgp.messages.Record` s that travel as
  bytes, every declared reply a :class:`~fedgp.messages.Field`;
* **the declared reply table** — every training round declares exactly fields matching
  ``expected_replies``, with the stated kind, and every pattern is used; each client's reply
  passes :func:`~fedgp.messages.check_reply` against the declaration, and the engine delivers the
  individual fields as rows and the summed ones only as sums;
* **personal hyper-parameters stay home** — no training round declares or returns a field of a
  hyper-parameter the strategy keeps personal;
* **determinism** — two fits with the same seed give identical states and histories;
* **a client never sees another's rows** — on the batched engine, with every participant in one
  chunk, changing one other client's targets leaves every other reply row bit for bit the same,
  and removing a client from (or adding it to) the task's participants moves no other row beyond
  the rounding of a differently shaped batch.

Needs pytest.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from fedgp.data import Federation
from fedgp.engines import Batched, EngineConfig, Sequential
from fedgp.engines.tasks import handle
from fedgp.errors import FedGPWarning
from fedgp.messages import (
    Field,
    Record,
    Replies,
    RoundPlan,
    ServerContext,
    Task,
    check_reply,
    from_config,
    record_from_bytes,
    record_to_bytes,
    task_from_bytes,
    task_to_bytes,
)
from fedgp.models.spec import GPSpec
from fedgp.rng import generator
from fedgp.run import fit
from fedgp.run.exchange import distinct_participants, exchange
from fedgp.strategies.base import Strategy
from fedgp.synthetic import gp_federation

__all__ = ["StrategyContract", "RoundTrace"]

KINDS = ("individual", "summed")


@dataclass(frozen=True)
class RoundTrace:
    """One training round of the reference run: the plan, the task its distinct participants
    received (``clients``, ascending; personal rows aligned with them) and the replies."""

    round: int
    plan: RoundPlan
    task: Task
    clients: torch.Tensor
    replies: Replies


def _distinct(plan: RoundPlan, rnd: int) -> tuple[Task, torch.Tensor]:
    """The train task for the plan's distinct participants, each with its first slot's row (as
    :func:`fedgp.run.exchange.exchange` sends it)."""
    unique, first = distinct_participants(plan)
    return Task("train", rnd, plan.shared, plan.personal.rows(first)), unique


def _differing(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor], ra, rb) -> list[str]:
    """The fields whose rows ``ra`` of ``a`` differ from rows ``rb`` of ``b`` (bit for bit)."""
    return [name for name in a if not torch.equal(a[name][ra], b[name][rb])]


class StrategyContract:
    """Subclass and set ``strategy`` and ``expected_replies``; override :meth:`make_data` for data
    other than a small GP federation.

    ``rounds``: how many training rounds the checks run (enough to reach every phase whose fields
    ``expected_replies`` lists). ``seed``: the run's master seed. ``fit_engine``: the engine of the
    determinism check. ``isolation_engine``: the batched engine config the isolation checks run on
    (its ``chunk_size`` is set to hold every participant); ``membership_rtol`` / ``membership_atol``:
    how far a reply row may move, by rounding alone, when the chunk's other members change.
    """

    strategy: Strategy
    expected_replies: Mapping[str, str] = {}
    rounds: int = 3
    seed: int = 3
    fit_engine: str | EngineConfig = "auto"
    isolation_engine: Batched = Batched()
    membership_rtol: float = 1e-12
    membership_atol: float = 1e-14

    def make_data(self) -> tuple[GPSpec, Federation]:
        """The model and the federation the checks run on (default: 5 GP clients, 2 features,
        unequal sizes, with test splits)."""
        data = gp_federation(num_clients=5, n=[14, 20, 9, 17, 12], d=2, n_test=5, seed=3)
        return data.spec, data.federation

    # -- fixtures ---------------------------------------------------------------------------------
    @pytest.fixture(scope="class")
    @classmethod
    def problem(cls) -> tuple[GPSpec, Federation]:
        """The model and federation of :meth:`make_data`, built once per class."""
        return cls().make_data()

    @pytest.fixture(scope="class")
    @classmethod
    def trace(cls, problem) -> tuple[list[RoundTrace], Any, ServerContext]:
        """The reference run: ``rounds`` rounds on the sequential engine, every plan kept."""
        return cls()._run_rounds(*problem)

    def _run_rounds(self, spec: GPSpec, federation: Federation):
        strategy, seed = self.strategy, self.seed
        engine = Sequential().build(spec, list(federation), seed)
        roster = engine.start(strategy, seed)
        ctx = ServerContext.from_roster(spec, roster, seed)
        server = strategy.initialize(ctx, generator(seed, "init"))
        steps = []
        for rnd in range(self.rounds):
            plan = strategy.configure(rnd, server, ctx, generator(seed, "configure", rnd))
            task, clients = _distinct(plan, rnd)
            sent = exchange(engine, "train", rnd, plan, roster.ids)
            steps.append(RoundTrace(rnd, plan, task, clients, sent.replies))
            server, _ = strategy.aggregate(rnd, server, plan, sent.replies, ctx)
        return steps, server, ctx

    # -- records only -----------------------------------------------------------------------------
    def test_config_round_trips(self) -> None:
        """The strategy and its client view rebuild equal from their JSON configs (what a client
        receives), through JSON text and back."""
        for what in (self.strategy, self.strategy.client_view()):
            text = json.dumps(what.to_config(), allow_nan=False)
            rebuilt = from_config(json.loads(text))
            assert type(rebuilt) is type(what)
            assert rebuilt == what, f"{type(what).__name__} does not round-trip through its config"
            assert type(what).from_config(what.to_config()) == what
            assert json.dumps(rebuilt.to_config(), sort_keys=True) == json.dumps(
                what.to_config(), sort_keys=True
            )

    def test_plans_are_records_and_declared_fields(self, trace) -> None:
        """Every plan's shared and personal parts are Records (whose task travels as bytes), every
        declared reply a Field; what a client needs for prediction is records too."""
        steps, server, ctx = trace
        for step in steps:
            plan = step.plan
            assert isinstance(plan, RoundPlan), (
                f"round {step.round}: configure returned {type(plan).__name__}"
            )
            assert isinstance(plan.shared, Record) and isinstance(plan.personal, Record)
            assert plan.replies, f"round {step.round}: no reply fields declared"
            for name, value in plan.replies.items():
                assert isinstance(name, str) and isinstance(value, Field), (step.round, name, value)
            assert len(plan.weights) == len(plan.participants)
            received = task_from_bytes(task_to_bytes(step.task))
            assert set(received.tensors) == set(step.task.tensors)
            for name, value in step.task.tensors.items():
                assert torch.equal(received.tensors[name], value), name
            assert received.shared.settings == step.task.shared.settings
        shared, personal = self.strategy.configure_personal(server, ctx, torch.arange(ctx.num_clients))
        assert isinstance(shared, Record) and isinstance(personal, Record)

    # -- the declared reply table -----------------------------------------------------------------
    def test_expected_replies_are_well_formed(self) -> None:
        """The subclass declared a non-empty table whose kinds are "individual" or "summed"."""
        assert self.expected_replies, "declare expected_replies: {pattern: 'individual' | 'summed'}"
        for pattern, kind in self.expected_replies.items():
            assert kind in KINDS, f"expected_replies[{pattern!r}] = {kind!r}, not one of {KINDS}"

    def test_declared_replies_match_the_table(self, trace) -> None:
        """Every declared field matches a pattern of ``expected_replies``, with its kind; every
        pattern is declared in some round (the table is neither short nor stale)."""
        steps, _, _ = trace
        used = set()
        for step in steps:
            for name, f in step.plan.replies.items():
                kinds = {k for p, k in self.expected_replies.items() if fnmatch.fnmatchcase(name, p)}
                used |= {p for p in self.expected_replies if fnmatch.fnmatchcase(name, p)}
                assert kinds, f"round {step.round}: field {name!r} ({f.kind}) is not in expected_replies"
                assert len(kinds) == 1, f"patterns give field {name!r} both kinds"
                assert f.kind in kinds, (
                    f"round {step.round}: field {name!r} is {f.kind}, expected_replies says {kinds.pop()}"
                )
        stale = set(self.expected_replies) - used
        assert not stale, f"no round of {len(steps)} declared a field matching {sorted(stale)}"

    def test_personal_hyperparameters_never_leave(self, trace, problem) -> None:
        """No training round declares, and no reply carries, a field of a hyper-parameter the
        strategy keeps personal (:meth:`~fedgp.strategies.Strategy.personal_names`): each owner keeps
        those for itself."""
        spec, _ = problem
        steps, _, _ = trace
        personal = self.strategy.personal_names(spec)

        def leaks(names) -> list[str]:
            return sorted(n for n in names if n in personal or n.rsplit("/", 1)[-1] in personal)

        for step in steps:
            declared = leaks(step.plan.replies)
            assert not declared, f"round {step.round} declares personal hyper-parameters {declared}"
            sent = leaks([*step.replies.individual, *step.replies.sums])
            assert not sent, f"round {step.round}: replies carry personal hyper-parameters {sent}"

    def test_every_reply_passes_its_declaration(self, trace, problem) -> None:
        """Each client's reply, computed on its own, passes ``check_reply``; through the sequential
        engine's ``run`` every participant replied, individual fields as rows, summed ones only as
        sums."""
        spec, federation = problem
        steps, _, _ = trace
        engine = Sequential().build(spec, list(federation), self.seed)
        engine.start(self.strategy, self.seed)
        for step in steps:
            fields = step.plan.replies
            for slot, position in enumerate(step.clients.tolist()):
                message = task_from_bytes(task_to_bytes(step.task.rows(slice(slot, slot + 1))))
                ops = engine.client_ops(torch.tensor([position]), message)
                reply = Record(handle(engine.client_strategy, ops, message, transform=engine.transform))
                reply = record_from_bytes(record_to_bytes(reply))  # what would cross the wire
                reasons = check_reply(reply, fields, 1)
                assert reasons == [None], (
                    f"round {step.round}: client {position}'s reply fails its declaration: {reasons[0]}"
                )
            replies = step.replies
            assert not replies.failures, f"round {step.round}: {dict(replies.failures)}"
            individual = {k for k, f in fields.items() if not f.summed}
            assert set(replies.individual) == individual
            assert set(replies.sums) == set(fields) - individual
            for name in individual:
                assert replies[name].shape == (len(step.plan.participants), *fields[name].shape)
            for name in set(fields) - individual:
                assert replies.sums[name].shape == fields[name].shape
                with pytest.raises(KeyError):
                    replies[name]

    # -- determinism ------------------------------------------------------------------------------
    def test_same_seed_same_fit(self, problem) -> None:
        """Two fits with the same seed: identical states (bit for bit) and identical histories."""
        spec, federation = problem
        a, b = (
            fit(spec, federation, self.strategy, self.rounds, engine=self.fit_engine, seed=self.seed)
            for _ in range(2)
        )
        assert set(a.state) == set(b.state)
        for key in a.state:
            assert torch.equal(a.state[key], b.state[key]), key
        assert list(a.history.columns) == list(b.history.columns)
        assert a.history.equals(b.history), "the histories of two runs with the same seed differ"

    # -- a client never sees another's rows ---------------------------------------------------------
    def _chunk_reply(self, engine, task: Task, clients: torch.Tensor) -> dict[str, torch.Tensor]:
        """The stacked reply of ``clients`` run as one chunk of the batched engine."""
        return handle(
            engine.client_strategy, engine.client_ops(clients, task), task, transform=engine.transform
        )

    def _isolation_engine(self, spec, clients):
        config = dataclasses.replace(self.isolation_engine, chunk_size=max(1, len(clients)))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FedGPWarning)  # a spec the tensor path cannot evaluate
            engine = config.build(spec, list(clients), self.seed)
            engine.start(self.strategy, self.seed)
        return engine

    @staticmethod
    def _other_targets(client):
        """The client with other training targets: same id, same inputs, same size."""
        changed = client.y.flip(0) * 2.0 + 1.0
        assert not torch.equal(changed, client.y)
        return dataclasses.replace(client, y=changed)

    def test_other_clients_targets_never_reach_a_reply(self, trace, problem) -> None:
        """All participants in one chunk of the batched engine; one other client's targets changed
        (same id, same size): every other client's reply row is bit for bit the same, while the
        changed client's own reply does change."""
        spec, federation = problem
        steps, _, _ = trace
        clients = list(federation)
        engine = self._isolation_engine(spec, clients)
        altered = {}  # position -> the engine whose client there has other targets
        for step in steps:
            base = self._chunk_reply(engine, step.task, step.clients)
            for victim in sorted({0, len(step.clients) - 1}):
                position = int(step.clients[victim])
                if position not in altered:
                    changed = list(clients)
                    changed[position] = self._other_targets(clients[position])
                    altered[position] = self._isolation_engine(spec, changed)
                other = self._chunk_reply(altered[position], step.task, step.clients)
                rest = torch.arange(len(step.clients)) != victim
                differ = _differing(base, other, rest, rest)
                assert not differ, (
                    f"round {step.round}: changing client {clients[position].id!r}'s targets changed "
                    f"other clients' {differ}"
                )
                own = torch.tensor([victim])
                assert _differing(base, other, own, own), (
                    f"round {step.round}: client {clients[position].id!r}'s reply ignores its own targets"
                )

    def test_a_reply_does_not_depend_on_who_else_takes_part(self, trace, problem) -> None:
        """Removing a participant from the one-chunk task (or, read the other way, adding it) leaves
        every other participant's reply row the same. A different chunk changes the batched
        programs' shapes (the largest client sets the padding), hence their rounding: rows are
        compared to ``membership_rtol``, far below any real dependence."""
        spec, federation = problem
        steps, _, _ = trace
        engine = self._isolation_engine(spec, list(federation))
        for step in steps:
            if len(step.clients) < 2:
                continue
            base = self._chunk_reply(engine, step.task, step.clients)
            sizes = torch.tensor([federation[int(c)].n for c in step.clients])
            for gone in sorted({0, int(sizes.argmax())}):  # the largest sets the chunk's padding
                keep = torch.nonzero(torch.arange(len(step.clients)) != gone).flatten()
                fewer = self._chunk_reply(engine, step.task.rows(keep), step.clients[keep])
                assert set(fewer) == set(base)
                for name in base:
                    torch.testing.assert_close(
                        fewer[name],
                        base[name][keep],
                        rtol=self.membership_rtol,
                        atol=self.membership_atol,
                        msg=lambda m, name=name, gone=gone, step=step: (
                            f"round {step.round}: without client {federation[int(step.clients[gone])].id!r} "
                            f"the other clients' {name!r} changed: {m}"
                        ),
                    )
