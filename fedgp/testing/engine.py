"""The contract every engine keeps, as a pytest class to subclass (in the spirit of GPyTorch's
``BaseKernelTestCase`` and scikit-learn's ``estimator_checks``).

An engine — fedgp's own or yours — subclasses :class:`EngineContract` and says how to build it
(``engine = fedgp.engines.Batched(chunk_size=3)``, or override :meth:`EngineContract.make_engine`);
every test here then runs against it and against the sequential engine, the reference::

    from fedgp.testing import EngineContract

    class TestMyEngine(EngineContract):
        def make_engine(self, spec, federation, **overrides):
            return MyEngine(spec, list(federation), **overrides)

It checks: the same replies and final states as the reference (float64, 1e-8 relative); failures
reported, never raised; summed fields reaching the server only as sums; only records crossing the
boundary; no sum of fewer replies than the task's ``min_contributors`` leaving the engine; the same
seed giving the same result; and the bytes-per-round figure. Needs pytest.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

from fedgp import attacks
from fedgp.aggregators import Krum, ThresholdMean
from fedgp.clustering import QuantileRadius
from fedgp.data import Federation
from fedgp.engines.base import Engine
from fedgp.engines.config import EngineConfig, Sequential
from fedgp.errors import RoundFailedError
from fedgp.messages import (
    MIN_CONTRIBUTORS,
    Field,
    Outcome,
    Record,
    RoundPlan,
    ServerContext,
    Task,
    record_to_bytes,
    state_tensors,
    task_to_bytes,
)
from fedgp.rng import generator
from fedgp.run import Faults, FitResult, fit
from fedgp.strategies import FGPR, IFCA, Asynchronous, FederatedClustering
from fedgp.strategies import clustered as C
from fedgp.strategies.fgpr import STATE
from fedgp.synthetic import gp_federation
from fedgp.testing.zoo import strategy_zoo

__all__ = ["EngineContract", "Saboteur", "SummingSpy", "recording"]

RTOL = 1e-8

# -- strategies that misbehave on purpose (module level: clients rebuild them from their config) -----


@dataclass(frozen=True)
class Saboteur(FGPR):
    """FGPR whose client ``victim`` raises (``"raise"``), replies NaN (``"nan"``), replies a
    Python object (``"object"``) or a wrongly shaped state (``"shape"``)."""

    victim: int = 2
    how: str = "raise"

    def local_update(self, ops, task) -> dict[str, torch.Tensor]:
        reply = super().local_update(ops, task)
        hit = ops.indices == self.victim
        if not bool(hit.any()):
            return reply
        if self.how == "raise":
            raise RuntimeError("sabotaged")
        if self.how == "nan":
            reply["loss"] = torch.where(hit, torch.nan, reply["loss"])
        elif self.how == "object":
            reply["loss"] = {"not": "a tensor"}
        elif self.how == "shape":
            key = next(k for k in reply if k.startswith(STATE))
            reply[key] = torch.cat([reply[key], reply[key]], dim=-1)
        return reply


SEEN_SUMS: list[dict] = []


@dataclass(frozen=True)
class SummingSpy(FGPR):
    """FGPR that also declares a summed field ``secret`` = (n_i, 1) per client, and records what
    ``aggregate`` can see of it."""

    def configure(self, rnd, server, ctx, rng) -> RoundPlan:
        plan = super().configure(rnd, server, ctx, rng)
        replies = {**plan.replies, "secret": Field((2,), summed=True)}
        return type(plan)(plan.participants, plan.weights, plan.shared, plan.personal, replies)

    def local_update(self, ops, task) -> dict[str, torch.Tensor]:
        reply = super().local_update(ops, task)
        n = ops.sizes.to(torch.float64)
        reply["secret"] = torch.stack([n, torch.ones_like(n)], dim=1)
        return reply

    def aggregate(self, rnd, server, plan, replies, ctx) -> tuple[Any, dict[str, Any]]:
        seen = {"sum": replies.sums["secret"].clone(), "individual": "secret" in replies.individual}
        try:
            replies["secret"]
        except KeyError as err:
            seen["error"] = str(err)
        SEEN_SUMS.append(seen)
        return super().aggregate(rnd, server, plan, replies, ctx)


def recording(engine: Engine) -> list[tuple[Task, Outcome]]:
    """Every task ``engine.run`` is given from now on and the outcome it returns, in a list that
    grows as the engine runs: all that leaves the engine (its instance's ``run`` is wrapped)."""
    seen: list[tuple[Task, Outcome]] = []
    run = engine.run

    def recorded(task: Task, clients, fields) -> Outcome:
        outcome = run(task, clients, fields)
        seen.append((task, outcome))
        return outcome

    engine.run = recorded
    return seen


# -- the contract -----------------------------------------------------------------------------------


class EngineContract:
    """Subclass and set ``engine`` (a :mod:`fedgp.engines` config), or override :meth:`make_engine`.
    ``supports_loopback``: whether ``make_engine(..., loopback=True)`` sends every message through
    bytes (then the run must be bit for bit the same)."""

    engine: EngineConfig = Sequential()
    supports_loopback = True

    def make_engine(self, spec, federation, **overrides) -> Engine:
        """The engine under test for ``federation``; ``overrides`` replace fields of its config."""
        return dataclasses.replace(self.engine, **overrides).build(spec, list(federation), 0)

    def reference(self, spec, federation) -> Engine:
        """The sequential engine, whose numbers every engine must reproduce."""
        return Sequential().build(spec, list(federation), 0)

    @pytest.fixture(scope="class")
    @classmethod
    def gp(cls):
        """The federation every test runs on: 7 GP clients of unequal sizes, with test splits."""
        return gp_federation(num_clients=7, n=[12, 20, 9, 30, 16, 25, 14], d=2, n_test=6, seed=4)

    def fit(self, data, strategy, engine=None, rounds=3, seed=5, **kwargs) -> FitResult:
        """A fit of ``strategy`` on ``data`` with the engine under test (or ``engine``)."""
        spec = data.spec
        runner = engine if engine is not None else self.make_engine(spec, data.federation)
        return fit(spec, data.federation, strategy, engine=runner, rounds=rounds, seed=seed, **kwargs)

    # -- same numbers as the reference --------------------------------------------------------------
    @pytest.mark.parametrize(
        "strategy",
        [
            FGPR(local_steps=3, batch_size=8),
            IFCA(num_clusters=2, aggregation="gradient", lr=0.1),  # summed, cluster-scattered gradients
            C.ClusteredGP(2, C.RandomInit(), C.SoftAssigner(), C.LocalTrainingSolver(), C.ClusterAverage()),
        ],
        ids=["fgpr", "ifca_gradient", "soft"],
    )
    def test_one_round_gives_the_same_replies_as_sequential(self, gp, strategy) -> None:
        """One training round: the same clients reply, with the same individual fields and sums as the
        reference engine, to 1e-8."""
        outcomes = []
        for engine in (self.reference(gp.spec, gp.federation), self.make_engine(gp.spec, gp.federation)):
            roster = engine.start(strategy, 3)
            ctx = ServerContext.from_roster(gp.spec, roster, 3)
            server = strategy.initialize(ctx, generator(3, "init"))
            plan = strategy.configure(0, server, ctx, generator(3, "configure", 0))
            task = Task("train", 0, plan.shared, plan.personal)
            outcomes.append(engine.run(task, plan.participants, plan.replies))
        ref, ours = outcomes
        assert torch.equal(ref.clients, ours.clients) and not ours.failures
        assert set(ours.individual) == set(ref.individual) and set(ours.sums) == set(ref.sums)
        for name in ref.individual:
            torch.testing.assert_close(ours.individual[name], ref.individual[name], rtol=RTOL, atol=1e-12)
        for name in ref.sums:
            torch.testing.assert_close(ours.sums[name], ref.sums[name], rtol=RTOL, atol=1e-12)

    @pytest.mark.parametrize(
        "name",
        ["fgpr_partial_sgd", "ifca_model_restarts", "linear_two_phase_orth_power", "clustered_oneshot_train"],
    )
    def test_final_state_equals_sequential(self, name) -> None:
        """A small run of each strategy family ends at the reference engine's state, to 1e-8."""
        data, spec, strategy, rounds = strategy_zoo()[name]
        results = [
            fit(spec, data.federation, strategy, engine=engine, rounds=rounds, seed=11)
            for engine in (self.reference(spec, data.federation), self.make_engine(spec, data.federation))
        ]
        assert results[1].state.max_relative_difference(results[0].state) < RTOL

    def test_an_asynchronous_replay_equals_sequential(self, gp) -> None:
        """The buffered asynchronous server's simulated schedule (owners of unequal speed, stale
        replies rebased) runs through the engine's ordinary tasks to the reference engine's state and
        arrivals, to 1e-8."""
        strategy = Asynchronous(
            FGPR(local_steps=2, batch_size=8), buffer=3, speeds=(1.0, 0.3, 2.0, 0.5, 1.0, 0.8, 0.2)
        )
        results = [
            self.fit(gp, strategy, engine=engine, rounds=5)
            for engine in (self.reference(gp.spec, gp.federation), self.make_engine(gp.spec, gp.federation))
        ]
        assert results[1].state.max_relative_difference(results[0].state) < RTOL
        pd.testing.assert_frame_equal(results[1].server_state.arrivals(), results[0].server_state.arrivals())
        assert int(results[0].history["staleness_max"].max()) > 0  # stale replies were rebased

    # -- attacks (forged in fedgp.run.exchange, on the engine's outcome) -------------------------
    @pytest.mark.parametrize(
        "strategy,attack",
        [
            (FGPR(local_steps=2, batch_size=8, aggregator=Krum(f=2)), attacks.BitFlip(count=2)),
            (FGPR(local_steps=2, batch_size=8, aggregator=ThresholdMean()), attacks.Gaussian(count=2)),
            (
                FederatedClustering(lr=0.05, group_size=4, radius=QuantileRadius(0.3)),
                attacks.IPM(count=2, epsilon=0.5),
            ),
        ],
        ids=["fgpr_krum_bitflip", "fgpr_threshold_gaussian", "fc_groups_ipm"],
    )
    def test_an_attack_on_a_robust_rule_gives_the_reference_result(self, gp, strategy, attack) -> None:
        """An attack forged on this engine picks the same attackers and ends at the reference state,
        and it did act (the clean run differs)."""
        runs = [
            self.fit(gp, strategy, engine, rounds=3, faults=Faults(attack=attack))
            for engine in (self.reference(gp.spec, gp.federation), self.make_engine(gp.spec, gp.federation))
        ]
        ref, ours = runs
        assert ours.attackers == ref.attackers and len(ours.attackers) == 2
        assert ours.state.max_relative_difference(ref.state) < RTOL
        clean = self.fit(gp, strategy, self.reference(gp.spec, gp.federation), rounds=3)
        assert clean.state.max_relative_difference(ref.state) > 1e-6  # the attack did act

    # -- failures ---------------------------------------------------------------------------------
    def test_simulated_failures_are_reported_and_match_the_reference(self, gp) -> None:
        """Simulated failures: the same clients fail in the same rounds as on the reference engine,
        each reported with its reason, and the run ends at the reference state."""
        strategy = FGPR(local_steps=2, batch_size=8)
        runs = [
            self.fit(gp, strategy, engine, rounds=6, faults=Faults(simulate=0.3))
            for engine in (self.reference(gp.spec, gp.federation), self.make_engine(gp.spec, gp.federation))
        ]
        ref, ours = runs
        assert ours.history["failed"].sum() > 0
        pd_cols = ["round", "client"]
        assert ours.failures[pd_cols].values.tolist() == ref.failures[pd_cols].values.tolist()
        assert ours.failures["reason"].str.startswith("SimulatedFailure").all()
        assert ours.state.max_relative_difference(ref.state) < RTOL
        # the weights are renormalised over the clients that replied (compare with their own FedAvg)
        assert (ours.history["failed"] < len(gp.federation)).all()

    @pytest.mark.parametrize(
        "how,reason",
        [
            ("raise", "RuntimeError: sabotaged"),
            ("nan", "invalid reply: field 'loss' is not finite"),
            ("object", "TypeError: record entry 'loss' is a dict"),
            ("shape", "has shape {doubled}, expected {shape}"),  # the first state field's last dim doubled
        ],
    )
    def test_a_failing_client_is_dropped_and_never_changes_the_state(self, gp, how, reason) -> None:
        """The victim is the last client, so dropping it leaves every other client's random stream
        (keyed by position) alone: the run equals FGPR on the federation without it."""
        victim = len(gp.federation) - 1
        # transforms off: the federation without the victim would learn other ones
        raw = {"transforms": None}
        result = self.fit(gp, Saboteur(local_steps=2, batch_size=8, victim=victim, how=how), **raw)
        assert result.history["failed"].tolist() == [1, 1, 1]
        assert result.failures["client"].tolist() == [gp.federation.ids[victim]] * 3
        first = gp.spec.params[0]
        doubled = (*first.shape[:-1], 2 * first.shape[-1]) if first.shape else (2,)
        reason = reason.format(doubled=tuple(doubled), shape=tuple(first.shape) or (1,))
        assert result.failures["reason"].str.contains(reason, regex=False).all(), result.failures["reason"][0]
        without = Federation(list(gp.federation)[:victim])
        alone = fit(
            gp.spec, without, FGPR(local_steps=2, batch_size=8), engine="sequential", rounds=3, seed=5, **raw
        )
        assert result.state.max_relative_difference(alone.state) < 1e-12

    def test_too_few_replies_stop_the_run_with_the_reasons(self, gp) -> None:
        """Below ``min_replies`` the run stops with ``RoundFailedError`` naming the client and why;
        at the threshold it goes on."""
        strategy = Saboteur(local_steps=2, batch_size=8, victim=1)
        with pytest.raises(RoundFailedError, match=r"6 of 7 clients replied.*sabotaged"):
            self.fit(gp, strategy, faults=Faults(min_replies=1.0))
        assert self.fit(gp, strategy, faults=Faults(min_replies=6)).history["failed"].sum() == 3

    # -- what the server may see --------------------------------------------------------------------
    def test_summed_fields_reach_the_server_only_as_sums(self, gp) -> None:
        """A summed field reaches ``aggregate`` only as the sum over the clients that replied; the
        engine's outcome holds it only among the sums."""
        SEEN_SUMS.clear()
        self.fit(gp, SummingSpy(local_steps=1, batch_size=8), rounds=2)
        n = float(sum(c.n for c in gp.federation))
        assert len(SEEN_SUMS) == 2
        for seen in SEEN_SUMS:
            assert not seen["individual"] and "only replies.sums" in seen["error"]
            torch.testing.assert_close(seen["sum"], torch.tensor([n, 7.0], dtype=torch.float64))
        engine = self.make_engine(gp.spec, gp.federation)
        strategy = SummingSpy(local_steps=1, batch_size=8)
        roster = engine.start(strategy, 0)
        ctx = ServerContext.from_roster(gp.spec, roster, 0)
        plan = strategy.configure(0, strategy.initialize(ctx, generator(0, "init")), ctx, generator(0, "c"))
        outcome = engine.run(Task("train", 0, plan.shared, plan.personal), plan.participants, plan.replies)
        assert "secret" not in outcome.individual and "secret" in outcome.sums

    def test_a_sum_of_too_few_clients_never_leaves_the_engine(self, gp) -> None:
        """Below the task's ``min_contributors`` the engine returns no sum and no reply: each would-be
        contributor fails with the reason. At the threshold the sum is released, also when its
        clients sit on different hosts (each host's part has fewer)."""
        engine = self.make_engine(gp.spec, gp.federation)
        strategy = SummingSpy(local_steps=1, batch_size=8)
        roster = engine.start(strategy, 0)
        ctx = ServerContext.from_roster(gp.spec, roster, 0)
        plan = strategy.configure(0, strategy.initialize(ctx, generator(0, "init")), ctx, generator(0, "c"))
        last = len(gp.federation) - 1
        for clients, minimum in (([last], 2), ([0, last], 3), ([0, last], 2)):
            rows = torch.tensor(clients)
            task = Task("train", 0, plan.shared, plan.personal.rows(rows), {MIN_CONTRIBUTORS: minimum})
            outcome = engine.run(task, rows, plan.replies)
            if len(clients) < minimum:
                assert not outcome.sums and not len(outcome.clients) and outcome.withheld
                assert not len(outcome.individual["loss"])
                for c in clients:
                    assert f"not released: {len(clients)} contributor(s)" in outcome.failures[c]
            else:
                n = float(sum(gp.federation[c].n for c in clients))
                torch.testing.assert_close(
                    outcome.sums["secret"], torch.tensor([n, 2.0], dtype=torch.float64)
                )

    def test_a_run_never_sees_a_sum_of_too_few_clients(self, gp) -> None:
        """``Faults(min_contributors=2)``: of everything the engine returns in a run that samples one
        client a round, nothing holds a sum (the round fails, saying why); two a round are a sum."""
        for per_round, minimum in ((1, 2), (2, 2)):
            engine = self.make_engine(gp.spec, gp.federation)
            seen = recording(engine)
            strategy = SummingSpy(
                local_steps=1, batch_size=8, clients_per_round=per_round, sampling="uniform"
            )
            faults = Faults(min_contributors=minimum)
            if per_round < minimum:
                with pytest.raises(RoundFailedError, match=r"summed fields \['secret'\] not released"):
                    self.fit(gp, strategy, engine, rounds=2, faults=faults)
            else:
                assert len(self.fit(gp, strategy, engine, rounds=2, faults=faults).history) == 2
            trained = [(task, out) for task, out in seen if task.kind == "train"]
            assert trained
            for task, outcome in trained:  # the lone client's (n_i, 1) is nowhere
                assert not outcome.sums or len(outcome.clients) >= minimum
                assert bool(outcome.sums) == (per_round >= minimum)
                assert task.min_contributors == minimum  # the setting travelled with the task

    def test_only_records_cross_the_boundary(self, gp) -> None:
        """Through bytes and back gives the same run bit for bit (everything the clients and the
        server need is in the records); a reply that is not a record fails its client."""
        if self.supports_loopback:
            plain = self.fit(gp, IFCA(num_clusters=2, restarts=2, local_steps=2, batch_size=8))
            wired = self.fit(
                gp,
                IFCA(num_clusters=2, restarts=2, local_steps=2, batch_size=8),
                self.make_engine(gp.spec, gp.federation, loopback=True),
            )
            for key in plain.state:
                assert torch.equal(plain.state[key], wired.state[key])
        result = self.fit(gp, Saboteur(local_steps=1, batch_size=8, victim=0, how="object"), rounds=1)
        assert "only tensors travel" in result.failures["reason"][0]

    # -- reproducibility ----------------------------------------------------------------------------
    def test_same_seed_same_result(self, gp) -> None:
        """The same seed gives the same state bit for bit; another seed another state."""
        strategy = FGPR(local_steps=2, batch_size=8, clients_per_round=4)
        a, b = self.fit(gp, strategy, seed=8), self.fit(gp, strategy, seed=8)
        for key in a.state:
            assert torch.equal(a.state[key], b.state[key])
        assert not torch.equal(
            self.fit(gp, strategy, seed=9).state["covar_module.outputscale"],
            a.state["covar_module.outputscale"],
        )

    # -- traffic ---------------------------------------------------------------------------------
    def test_bytes_per_round_are_the_serialised_messages(self, gp) -> None:
        """FGPR sends every participant one message with the state and gets one reply back: the
        history's bytes equal K times the serialised size of each, computed here independently. The
        data transforms went to the clients once, before round 1, and ride in no round's message."""
        K = len(gp.federation)
        result = self.fit(gp, FGPR(local_steps=1, batch_size=8), rounds=2)
        state = gp.spec.initial_state()
        reply = Record({**state_tensors(state.expand(1), STATE), "loss": torch.zeros(1, dtype=torch.float64)})
        shared = Record(state_tensors(state, STATE))
        assert set(result.transform.tensors()) == {
            f"transform/{n}" for n in ("x_offset", "x_scale", "y_offset", "y_scale")
        }  # a transform the clients hold, not one the rounds carry
        for rnd in range(2):
            down = len(task_to_bytes(Task("train", rnd, shared)))
            assert result.history["bytes_down"][rnd] == K * down
            assert result.history["bytes_up"][rnd] == K * len(record_to_bytes(reply))
        # each client's traffic does not grow with the number of clients (no O(K²) broadcast)
        assert np.all(result.history["bytes_down"] / K < 2_000)
