"""``Asynchronous(..., speeds="measured")`` over a Flower grid: replies consumed as they arrive.

A grid that releases the train replies one per pull, in the order a simulated schedule would have
them arrive, makes the measured server take the same buffers as the simulated one: the same state,
staleness and arrivals. A node whose reply fails or is malformed is dropped with its reason, and
the run goes on; an engine that runs its clients in process, and secure aggregation (in the engine
and in the app's run config), are refused. The app's ``train-delay`` node setting slows train tasks.
"""

import math
import os

import pytest
import torch
from flwr.app import Message, RecordDict
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fedgp
from fedgp.errors import EngineError, InputError, InputTypeError
from fedgp.flower import Flower, FlowerEngine, SecureAggregation
from fedgp.strategies import FGPR, Asynchronous

if os.environ.get("CI", "").strip().lower() == "true":
    import flwr  # noqa: F401  (fail, not skip, when CI lacks it)
else:
    pytest.importorskip("flwr")

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

TRAIN = FGPR(local_steps=2, batch_size=8)
QUIET = [fedgp.run.Progress(False)]


@pytest.fixture(scope="module")
def draws():
    return fedgp.synthetic.gp_federation(num_clients=5, n=[14, 20, 9, 17, 12], d=2, n_test=5, seed=3)


class ScheduledArrivals:
    """Wraps an engine's in-memory grid (one client per node): a train reply is held and released
    one per pull, earliest first, where node ``i``'s job lasts ``1 / speeds[i]`` from the last
    arrival released before it was pushed (ties: node order) — a simulated schedule's arrivals."""

    def __init__(self, grid, speeds):
        self.grid, self.clock = grid, 0.0
        self.lasts = {node: 1.0 / s for node, s in zip(sorted(grid.apps), speeds)}
        self.held: dict[str, tuple[float, int]] = {}  # message id -> (arrival, node)

    def __getattr__(self, name):
        return getattr(self.grid, name)

    def push_messages(self, messages):
        messages = list(messages)
        ids = list(self.grid.push_messages(messages))
        for m in messages:
            if m.metadata.message_type == "train" and m.metadata.message_id in ids:
                node = m.metadata.dst_node_id
                self.held[m.metadata.message_id] = (self.clock + self.lasts[node], node)
        return ids

    def pull_messages(self, message_ids):
        asked = list(message_ids)
        ready = [i for i in asked if i not in self.held]
        trains = sorted((self.held[i], i) for i in asked if i in self.held)
        if trains:
            (self.clock, _), first = trains[0]
            del self.held[first]
            ready.append(first)
        return self.grid.pull_messages(ready)


def scheduled(draws, speeds, buffer=2, rounds=5):
    engine = FlowerEngine(draws.spec, draws.federation, num_nodes=len(draws.federation))
    engine.inner.grid = ScheduledArrivals(engine.grid, speeds)
    strategy = Asynchronous(TRAIN, buffer=buffer, speeds="measured")
    return fedgp.fit(
        draws.spec, draws.federation, strategy, rounds=rounds, engine=engine, seed=1, callbacks=QUIET
    )


def simulated(draws, speeds, buffer=2, rounds=5):
    strategy = Asynchronous(TRAIN, buffer=buffer, speeds=speeds)
    return fedgp.fit(
        draws.spec, draws.federation, strategy, rounds=rounds, engine="sequential", seed=1, callbacks=QUIET
    )


def assert_same_run(measured, simulated):
    """The same state bit for bit, the same replies consumed with the same staleness, step by step."""
    for name, value in simulated.state.items():
        assert torch.equal(measured.state[name], value), name
    columns = ["step", "client", "version", "staleness", "weight"]
    mine, theirs = measured.server_state.arrivals(), simulated.server_state.arrivals()
    assert mine[columns].equals(theirs[columns])
    assert (mine["arrival"].diff().dropna() >= 0).all()  # wall-clock times, in the order consumed
    for column in ("buffered", "staleness_mean", "staleness_max", "train_nll"):
        assert measured.history[column].tolist() == simulated.history[column].tolist(), column
    assert "wall_time" in measured.history and "sim_time" not in measured.history


@pytest.mark.parametrize(
    ("speeds", "buffer"), [((1.0, 3.0, 0.5, 2.0, 1.0), 2), ((1.0, 1.0, 0.25, 1.0, 2.0), 3)]
)
def test_replies_consumed_as_they_arrive_are_the_simulated_schedule_in_the_same_order(draws, speeds, buffer):
    measured = scheduled(draws, speeds, buffer)
    assert_same_run(measured, simulated(draws, speeds, buffer))
    assert measured.server_state.arrivals()["staleness"].max() > 0  # the slow owners' replies were stale


@settings(max_examples=4, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    speeds=st.lists(st.sampled_from([0.25, 0.5, 1.0, 2.0, 3.0]), min_size=5, max_size=5),
    buffer=st.integers(1, 4),
)
def test_any_arrival_order_with_ties_is_the_simulated_schedules(draws, speeds, buffer):
    """Speeds with ties (broken in registration order on both sides), any buffer below K."""
    assert_same_run(scheduled(draws, speeds, buffer, rounds=4), simulated(draws, speeds, buffer, rounds=4))


def _broken(kind):
    """A mod that makes node 1002's train replies fail (``error``) or no fedgp node's (``garbage``)."""

    def mod(message, context, call_next):
        reply = call_next(message, context)
        if context.node_id != 1002 or message.metadata.message_type != "train":
            return reply
        if kind == "error":
            raise RuntimeError("disk on fire")
        return Message(RecordDict(), reply_to=message)

    return mod


@pytest.mark.parametrize(("kind", "reason"), [("error", "disk on fire"), ("garbage", "malformed reply")])
def test_a_node_whose_reply_fails_or_is_malformed_is_dropped_with_its_reason(draws, kind, reason):
    engine = Flower(num_nodes=5, mods=(_broken(kind),))
    strategy = Asynchronous(TRAIN, buffer=2, speeds="measured")
    result = fedgp.fit(
        draws.spec, draws.federation, strategy, rounds=4, engine=engine, seed=1, callbacks=QUIET
    )
    assert len(result.history) == 4
    failures = result.failures
    assert set(failures["client"]) == {draws.federation.ids[2]}
    assert failures["reason"].str.contains(reason).all() and failures["reason"].str.contains("1002").all()
    assert draws.federation.ids[2] not in set(result.server_state.arrivals(result.roster.ids)["client"])
    assert all(math.isfinite(float(v.sum())) for v in result.state.values())


def _rewriting(node, change):
    """A mod that rewrites ``node``'s train replies: ``change(outcome)`` on the outcome it sends."""
    from fedgp.flower.records import outcome_from_content, outcome_to_content

    def mod(message, context, call_next):
        reply = call_next(message, context)
        if context.node_id != node or message.metadata.message_type != "train":
            return reply
        outcome = change(outcome_from_content(reply.content))
        keys, outcome.clients = outcome.clients, torch.arange(len(outcome.clients))  # the node's own
        return Message(outcome_to_content(outcome, keys), reply_to=message)

    return mod


def _later_version(outcome):
    outcome.individual["version"] = outcome.individual["version"] + 7
    return outcome


def _first_client_only(outcome):
    outcome.clients = outcome.clients[:1]
    outcome.individual = {k: v[:1] for k, v in outcome.individual.items()}
    return outcome


@pytest.mark.parametrize(
    ("nodes", "change", "dropped", "reason"),
    [
        (5, _later_version, 1, r"says version 7, but version 0 was sent"),  # exchange_arrivals' check
        (2, _first_client_only, 4, r"Flower node 1001: malformed reply: it leaves the client out"),
    ],
)
def test_a_reply_naming_another_version_or_leaving_a_client_out_drops_that_client(
    draws, nodes, change, dropped, reason
):
    """Node 1001 (clients 1, or 3 and 4 of 5) rewrites its replies: the client concerned is dropped
    for that job with the reason, gets the next version, and the run goes on."""
    strategy = Asynchronous(TRAIN, buffer=2, speeds="measured")
    engine = Flower(num_nodes=nodes, mods=(_rewriting(1001, change),))
    result = fedgp.fit(
        draws.spec, draws.federation, strategy, rounds=3, engine=engine, seed=1, callbacks=QUIET
    )
    assert len(result.history) == 3
    assert set(result.failures["client"]) == {draws.federation.ids[dropped]}
    assert result.failures["reason"].str.contains(reason).any()


def test_measured_speeds_are_refused_in_process_and_with_secure_aggregation(draws):
    strategy = Asynchronous(TRAIN, buffer=2, speeds="measured")
    with pytest.raises(InputError, match=r"speeds='measured'\) times replies as they arrive.*'sequential'"):
        fedgp.fit(draws.spec, draws.federation, strategy, rounds=2, engine="sequential", callbacks=QUIET)
    with pytest.raises(EngineError, match="secure aggregation does not combine with a server that consumes"):
        fedgp.fit(draws.spec, draws.federation, strategy, rounds=2, callbacks=QUIET,
                  engine=Flower(num_nodes=5, secure=SecureAggregation()))  # fmt: skip
    with pytest.raises(InputTypeError, match="or 'measured'"):
        Asynchronous(TRAIN, speeds="fast")


def test_the_app_refuses_secure_aggregation_with_an_asynchronous_strategy():
    from fedgp.flower.app import AppSettings
    from fedgp.messages import config_json

    strategy = config_json(Asynchronous(TRAIN, buffer=2, speeds="measured"))
    settings = AppSettings({"strategy-config": strategy, "secure-aggregation": "{}"})
    with pytest.raises(InputError, match="'secure-aggregation' does not combine with an Asynchronous"):
        settings.secure()
    assert AppSettings({"strategy-config": strategy}).secure() is None
    assert AppSettings({"secure-aggregation": "{}"}).secure() is not None


def test_train_delay_slows_a_nodes_train_messages_only_and_refuses_a_bad_value():
    import time
    from types import SimpleNamespace

    from flwr.app import Context

    from fedgp.flower.delay import delay_mod

    def context(value):
        return Context(
            run_id=0, node_id=1, node_config={"train-delay": value}, state=RecordDict(), run_config={}
        )

    def took(kind, value):
        start = time.perf_counter()
        message = SimpleNamespace(metadata=SimpleNamespace(message_type=kind))  # all the mod reads
        delay_mod(message, context(value), lambda m, c: "replied")
        return time.perf_counter() - start

    assert took("train", 0.3) >= 0.3 and took("query.hello", 5.0) < 0.3
    for bad in ("soon", -1.0, float("nan"), True):
        with pytest.raises(InputError, match=r"node config 'train-delay' must be a number of seconds >= 0"):
            took("train", bad)


def test_a_resumed_measured_run_sends_the_jobs_it_had_out_again(draws, tmp_path):
    """A checkpoint holds the server's view of the jobs out; a fresh engine holds none of them, so
    their owners fail that step with the reason and start again from the next version (without
    it they would never be sent anything again)."""
    path, speeds = tmp_path / "run.ckpt", (1.0, 3.0, 0.5, 2.0, 1.0)

    def measured(rounds, resume):
        engine = FlowerEngine(draws.spec, draws.federation, num_nodes=len(draws.federation))
        engine.inner.grid = ScheduledArrivals(engine.grid, speeds)
        strategy = Asynchronous(TRAIN, buffer=2, speeds="measured")
        keep = fedgp.run.Checkpointing(path, resume=resume)
        return fedgp.fit(draws.spec, draws.federation, strategy, rounds=rounds, engine=engine, seed=1,
                         callbacks=[*QUIET, keep])  # fmt: skip

    first = measured(3, False)
    out = first.server_state
    mask = (out.started >= 0) & ~torch.isfinite(out.arrival) & ~out.dispatch
    was_out = set(torch.nonzero(mask).flatten().tolist())
    assert was_out, "the checkpoint should hold jobs out"
    resumed = measured(8, True)
    assert len(resumed.history) == 8
    failures = resumed.failures
    assert set(failures["round"]) == {4}
    assert set(failures["client"]) == {draws.federation.ids[i] for i in was_out}
    assert failures["reason"].str.contains("not in flight on this engine").all()
    started = resumed.server_state.started  # the version each owner's job was last sent
    assert all(int(started[i]) >= 4 for i in was_out), started  # sent a version after the resume
