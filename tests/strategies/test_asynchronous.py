"""The buffered asynchronous server (fedgp.strategies.Asynchronous): the synchronous round as its
special case, a deterministic replay, the staleness weights as their formulas, a stale reply's
update applied exactly as FedBuff's rule says, and bad settings refused by name."""

import math

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import fedgp
from fedgp.errors import InputError, InputTypeError
from fedgp.messages import Replies, ServerContext, state_tensors
from fedgp.models.state import HyperState
from fedgp.rng import generator
from fedgp.run import ClientDP, Progress
from fedgp.strategies import (
    DPFGPR,
    FGPR,
    IFCA,
    Asynchronous,
    Constant,
    Hinge,
    LogUniform,
    Polynomial,
    WeightedFGPR,
)
from fedgp.strategies.asynchronous import VERSION
from fedgp.synthetic import gp_federation
from fedgp.testing.strategy import StrategyContract

QUIET = [Progress(False)]
TRAIN = FGPR(local_steps=2, batch_size=8)  # minibatches: the round number keys the clients' draws


@pytest.fixture(scope="module")
def gp():
    return gp_federation(num_clients=5, n=[14, 20, 9, 17, 12], d=2, n_test=5, seed=3)


def run(gp, strategy, rounds=4, seed=1, engine="sequential"):
    return fedgp.fit(
        gp.spec, gp.federation, strategy, rounds=rounds, engine=engine, seed=seed, callbacks=QUIET
    )


@pytest.mark.parametrize("engine", ["sequential", "batched"])
def test_equal_speeds_and_a_full_buffer_are_the_synchronous_round(gp, engine) -> None:
    """B = K and equal speeds: every step consumes every owner's fresh reply, so the run is FGPR's."""
    sync = run(gp, TRAIN, engine=engine)
    buffered = run(gp, Asynchronous(TRAIN, buffer=5, staleness=Polynomial(a=2.0)), engine=engine)
    assert buffered.state.max_relative_difference(sync.state) < 1e-10
    for name, value in sync.state.items():  # in fact bit for bit: fresh replies enter as they came
        assert torch.equal(buffered.state[name], value), name
    np.testing.assert_allclose(buffered.history["train_nll"], sync.history["train_nll"], rtol=1e-10)
    assert (buffered.history["staleness_max"] == 0).all()
    assert buffered.history["sim_time"].tolist() == [1.0, 2.0, 3.0, 4.0]


def test_the_inner_strategys_weights_are_the_buffers(gp) -> None:
    """WeightedFGPR forces the first owner's weight: the asynchronous server keeps it (B = K is its
    synchronous run), and renormalises it over a smaller buffer."""
    inner = WeightedFGPR(hf_weight=0.9, local_steps=2, batch_size=8)
    sync = run(gp, inner)
    buffered = run(gp, Asynchronous(inner, buffer=5))
    assert buffered.state.max_relative_difference(sync.state) < 1e-10
    assert run(gp, Asynchronous(TRAIN, buffer=5)).state.max_relative_difference(sync.state) > 1e-3


def test_the_schedule_is_replayed_bit_for_bit_on_every_engine(gp) -> None:
    """Random speeds from the seed: the same seed replays the same run on either engine; another
    seed draws other speeds, so other replies arrive when."""
    strategy = Asynchronous(TRAIN, buffer=2, speeds=LogUniform(spread=10.0))
    first, again = run(gp, strategy, rounds=6), run(gp, strategy, rounds=6)
    for name, value in first.state.items():
        assert torch.equal(value, again.state[name]), name
    pd.testing.assert_frame_equal(first.history, again.history)
    table = first.server_state.arrivals(first.roster.ids)
    pd.testing.assert_frame_equal(table, again.server_state.arrivals(again.roster.ids))
    assert len(table) == 12 and table["staleness"].max() > 0  # stale replies did arrive
    batched = run(gp, strategy, rounds=6, engine="batched")
    pd.testing.assert_frame_equal(table, batched.server_state.arrivals(batched.roster.ids))
    assert batched.state.max_relative_difference(first.state) < 1e-8
    other = run(gp, strategy, rounds=6, seed=2).server_state.arrivals(first.roster.ids)
    assert not other[["client", "arrival"]].equals(table[["client", "arrival"]])


@given(a=st.floats(0.0, 5.0), tau=st.lists(st.integers(0, 10_000), min_size=1, max_size=20))
def test_polynomial_weights_are_their_formula(a, tau) -> None:
    weights = Polynomial(a=a)(torch.tensor(tau))
    expected = [(1.0 + t) ** (-a) for t in tau]
    np.testing.assert_allclose(weights.numpy(), expected, rtol=1e-15)
    assert weights.dtype == torch.float64


@given(
    a=st.floats(0.0, 50.0),
    b=st.integers(0, 20),
    tau=st.lists(st.integers(0, 1000), min_size=1, max_size=20),
)
def test_hinge_and_constant_weights_are_their_formulas(a, b, tau) -> None:
    expected = [1.0 if t <= b else 1.0 / (a * (t - b) + 1.0) for t in tau]
    np.testing.assert_allclose(Hinge(a=a, b=b)(torch.tensor(tau)).numpy(), expected, rtol=1e-15)
    assert Constant()(torch.tensor(tau)).tolist() == [1.0] * len(tau)


def _reply(spec, start: HyperState, move: float, rows: int = 1) -> dict[str, torch.Tensor]:
    """A trained reply: ``start`` moved by ``move`` (and a bit per parameter) in raw space."""
    raw = spec.to_raw(start.expand(rows))
    moved = {k: v + move * (1 + i) / 10 for i, (k, v) in enumerate(raw.items())}
    trained = spec.from_raw(HyperState(moved, spec.event_shapes))
    return {**state_tensors(trained, "state/"), "loss": torch.full((rows,), move, dtype=torch.float64)}


@pytest.mark.parametrize("rule", [Polynomial(a=0.5), Constant(), Hinge(a=3.0, b=1)])
def test_a_stale_reply_moves_the_state_by_its_weighted_update(gp, rule) -> None:
    """FedBuff's weights. Two owners, speeds 1 and 0.4, B = 1, FedAvg: owner 0 makes versions 1 and
    2, then owner 1's reply, trained from version 0, arrives 2 versions stale:
    θ₃ = θ₂ + s(2)(θ₁' − θ₀) in raw space."""
    spec = gp.spec
    sizes = torch.tensor([10, 30])
    ctx = ServerContext(spec, sizes, sizes.double() / sizes.sum(), ["a", "b"], 0)
    strategy = Asynchronous(
        FGPR(server_optimizer=None), buffer=1, staleness=rule, speeds=(1.0, 0.4), weighting="buffer"
    )
    server = strategy.initialize(ctx, generator(0, "init"))
    theta0 = strategy.global_state(server)
    trained = {}
    for rnd, move in enumerate([0.3, -0.2, 0.5]):
        plan = strategy.configure(rnd, server, ctx, generator(0, "configure", rnd))
        start = strategy.global_state(server)
        n = len(plan.participants)
        reply = _reply(spec, start, move, n)
        reply[VERSION] = torch.full((n,), float(rnd), dtype=torch.float64)
        for row, client in enumerate(plan.participants.tolist()):
            trained[(client, rnd)] = {k: v[row] for k, v in reply.items()}
        replies = Replies(plan.participants, plan.weights, reply, {}, {}, torch.arange(n))
        server, metrics = strategy.aggregate(rnd, server, plan, replies, ctx)
        if rnd < 2:  # owner 0's fresh reply is the mean of a buffer of one (to FedAvg's rounding)
            assert metrics["staleness_max"] == 0
            for k, v in server.inner.items():
                expected = trained[(0, rnd)]["state/" + k].reshape(v.shape)
                torch.testing.assert_close(v, expected, rtol=1e-13, atol=0)
    assert metrics["staleness_max"] == 2 and metrics["sim_time"] == 2.5
    theta2 = HyperState({k: trained[(0, 1)]["state/" + k] for k in theta0}, spec.event_shapes)
    stale = HyperState({k: trained[(1, 0)]["state/" + k] for k in theta0}, spec.event_shapes)
    weight = float(rule(torch.tensor([2]))[0])
    raw0, raw2, raw1 = spec.to_raw(theta0), spec.to_raw(theta2), spec.to_raw(stale)
    got = spec.to_raw(server.inner)
    for k in raw0:
        torch.testing.assert_close(got[k], raw2[k] + weight * (raw1[k] - raw0[k]), rtol=1e-12, atol=1e-12)
    table = server.arrivals(ctx.ids)
    assert table["client"].tolist() == ["a", "a", "b"] and table["staleness"].tolist() == [0, 0, 2]
    assert table["weight"].tolist()[-1] == weight


def test_a_buffer_weighs_its_replies_by_size_renormalised(gp) -> None:
    """FedBuff's weights. B = 2 of 3 owners, all fresh: the aggregate is the buffer's mean weighted
    by p_k over the two."""
    spec = gp.spec
    sizes = torch.tensor([10, 30, 60])
    ctx = ServerContext(spec, sizes, sizes.double() / sizes.sum(), [0, 1, 2], 0)
    strategy = Asynchronous(
        FGPR(server_optimizer=None, average_space="raw"), buffer=2, speeds=(2.0, 1.0, 0.5), weighting="buffer"
    )
    server = strategy.initialize(ctx, generator(0, "init"))
    plan = strategy.configure(0, server, ctx, generator(0, "configure", 0))
    reply = _reply(spec, strategy.global_state(server), 0.0, 3)
    raw = {k: v.clone() for k, v in spec.to_raw(strategy.global_state(server).expand(3)).items()}
    for k in raw:
        raw[k] = raw[k] + torch.tensor([0.1, -0.4, 9.0]).reshape(-1, *([1] * (raw[k].dim() - 1)))
    reply.update(state_tensors(spec.from_raw(HyperState(raw, spec.event_shapes)), "state/"))
    reply[VERSION] = torch.zeros(3, dtype=torch.float64)
    server, metrics = strategy.aggregate(
        0, server, plan, Replies(plan.participants, plan.weights, reply, {}, {}, torch.arange(3)), ctx
    )
    assert metrics["buffered"] == 2 and metrics["sim_time"] == 1.0  # owners 0 and 1; owner 2 still works
    got = spec.to_raw(server.inner)
    for k in got:
        torch.testing.assert_close(got[k], 0.25 * raw[k][0] + 0.75 * raw[k][1], rtol=1e-12, atol=1e-12)


def _shares(gp, weighting: str, steps: int) -> np.ndarray:
    """Each owner's applied weights summed over ``steps`` steps, over ``steps p_k``."""
    strategy = Asynchronous(TRAIN, buffer=2, staleness=Constant(), weighting=weighting)
    table = run(gp, strategy, rounds=steps).server_state.arrivals()
    sizes = torch.tensor([c.n for c in gp.federation], dtype=torch.float64)
    return table.groupby("client")["applied"].sum().to_numpy() / (steps * (sizes / sizes.sum()).numpy())


def test_rate_weights_give_every_owner_its_share_of_the_steps(gp) -> None:
    """Equal speeds, B = 2 of 5: the buffers are fixed groups of owners. FedBuff's weights give each
    owner its group's share, not its own (biased: 0.6x to 1.3x p_k, for ever); ``"rate"``'s add up to
    p_k per step, up to a start-up term that shrinks as the run goes (log(T)/T)."""
    early, late = _shares(gp, "rate", 20), _shares(gp, "rate", 80)
    assert np.abs(late - 1).max() < 0.13 and np.abs(late - 1).max() < np.abs(early - 1).max()
    assert np.abs(_shares(gp, "buffer", 80) - 1).max() > 0.3


def test_a_rate_weight_is_size_over_replies_per_step(gp) -> None:
    """Every consumed reply's applied weight is ``p_k · t / n_k(t) · s(τ)`` (``n_k(t)``: owner k's replies
    consumed by step t, this one included), on unequal speeds."""
    rule = Polynomial(a=0.5)
    strategy = Asynchronous(TRAIN, buffer=2, staleness=rule, speeds=(1.0, 0.3, 0.5, 0.9, 0.2))
    table = run(gp, strategy, rounds=12).server_state.arrivals()
    sizes = torch.tensor([c.n for c in gp.federation], dtype=torch.float64)
    p = (sizes / sizes.sum()).numpy()
    seen = table.groupby("client").cumcount().to_numpy() + 1
    stale = rule(torch.tensor(table["staleness"].to_numpy())).numpy()
    expected = p[table["client"].to_numpy()] * table["step"].to_numpy() / seen * stale
    np.testing.assert_allclose(table["applied"].to_numpy(), expected, rtol=1e-12)


def test_bad_settings_are_refused_by_name(gp) -> None:
    with pytest.raises(InputError, match="buffer"):
        Asynchronous(buffer=0)
    with pytest.raises(InputError, match="buffer=6 is more than the 5"):
        run(gp, Asynchronous(buffer=6), rounds=1)
    with pytest.raises(InputError, match="Polynomial: a must be"):
        Polynomial(a=-0.5)
    with pytest.raises(InputError, match=r"speeds\[1\] must be a finite number > 0, got 0"):
        Asynchronous(speeds=[1.0, 0.0, 1.0])
    with pytest.raises(InputError, match=r"speeds\[2\] must be a finite number > 0, got nan"):
        Asynchronous(speeds=np.array([1.0, 2.0, np.nan]))
    assert Asynchronous(speeds=torch.tensor([1.0, 0.5])).speeds == (1.0, 0.5)
    with pytest.raises(InputError, match=r"speeds\[0\]"):
        Asynchronous(speeds=[-2.0])
    with pytest.raises(InputError, match="3 speeds for 5 registered clients"):
        run(gp, Asynchronous(speeds=[1.0, 2.0, 3.0]), rounds=1)
    with pytest.raises(InputError, match="LogUniform: spread"):
        LogUniform(spread=0.5)
    with pytest.raises(InputError, match="clients_per_round must be None"):
        Asynchronous(FGPR(clients_per_round=2))
    with pytest.raises(InputTypeError, match="inner must be an FGPR"):
        Asynchronous(IFCA(num_clusters=2))
    with pytest.raises(InputTypeError, match="inner must be an FGPR"):  # summed replies: no buffer of them
        Asynchronous(DPFGPR(FGPR(), clip=1.0, noise=1.0))
    with pytest.raises(InputError, match="work must be one of"):
        Asynchronous(work="flops")
    with pytest.raises(InputError, match="weighting must be one of"):
        Asynchronous(weighting="fedavg")
    with pytest.raises(InputTypeError, match="staleness must be"):
        Asynchronous(staleness=lambda t: 1.0)
    with pytest.raises(InputError, match="ClientDP does not apply to Asynchronous"):
        run(gp, ClientDP(Asynchronous(), epsilon=1.0, delta=1e-3, clip=1.0), rounds=1)


def test_slow_owners_cost_simulated_time_not_steps(gp) -> None:
    """One owner 100x slower: a synchronous-like buffer (B = K) waits for it every step; B = K - 1
    steps without it, and its one reply arrives stale."""
    speeds = (1.0, 1.0, 1.0, 1.0, 0.01)
    waiting = run(gp, Asynchronous(TRAIN, buffer=5, speeds=speeds), rounds=3)
    buffered = run(gp, Asynchronous(TRAIN, buffer=4, speeds=speeds), rounds=3)
    assert waiting.history["sim_time"].tolist() == [100.0, 200.0, 300.0]
    assert buffered.history["sim_time"].tolist() == [1.0, 2.0, 3.0]
    assert 4 not in buffered.server_state.arrivals()["client"].tolist()


def test_work_in_points_scales_durations_by_size(gp) -> None:
    result = run(gp, Asynchronous(TRAIN, buffer=1, work="points"), rounds=1)
    sizes = torch.tensor([c.n for c in gp.federation], dtype=torch.float64)
    fastest = float((sizes / sizes.mean()).min())
    assert result.history["sim_time"].tolist() == [fastest]
    assert result.server_state.arrivals()["client"].tolist() == [int(sizes.argmin())]


class TestAsynchronousContract(StrategyContract):
    """The asynchronous server keeps the strategy contract: it adds one individual field, the version."""

    strategy = Asynchronous(FGPR(local_steps=2, batch_size=8), buffer=2, speeds=(1.0, 3.0, 0.5, 2.0, 1.0))
    expected_replies = {"state/*": "individual", "loss": "individual", VERSION: "individual"}
    rounds = 4


def test_personal_hyperparameters_stay_home_under_the_asynchronous_server(gp) -> None:
    """Personal noise: never in a reply, each owner's own after a run with stale replies."""
    strategy = Asynchronous(
        FGPR(local_steps=2, batch_size=8, personal=("noise",)), buffer=2, speeds=(1.0, 3.0, 0.5, 2.0, 1.0)
    )
    result = run(gp, strategy, rounds=4)
    assert result.history["staleness_max"].max() > 0
    assert math.isfinite(result.history["train_nll"].iloc[-1])
    noise = "likelihood.noise_covar.noise"
    assert torch.equal(result.state[noise], gp.spec.initial_state()[noise])


def test_a_resumed_asynchronous_run_ends_as_an_unbroken_one(gp, tmp_path) -> None:
    """The server state (jobs in flight, replies not yet arrived, the clock) goes into the checkpoint."""
    strategy = Asynchronous(TRAIN, buffer=2, speeds=LogUniform(spread=10.0))
    path = tmp_path / "run.ckpt"
    unbroken = run(gp, strategy, rounds=6)
    # the unbroken run's engine: the automatic choice (batched) splits its tiles over the CPUs a busy
    # machine leaves free, whose sums may differ in the last bit from the sequential engine's
    fedgp.fit(
        gp.spec, gp.federation, strategy, rounds=3, seed=1, engine="sequential",
        callbacks=[*QUIET, fedgp.run.Checkpointing(path)],
    )  # fmt: skip
    resumed = fedgp.fit(
        gp.spec, gp.federation, strategy, rounds=6, seed=1, engine="sequential",
        callbacks=[*QUIET, fedgp.run.Checkpointing(path, resume=True)],
    )  # fmt: skip
    for name, value in unbroken.state.items():
        assert torch.equal(value, resumed.state[name]), name
    pd.testing.assert_frame_equal(unbroken.server_state.arrivals(), resumed.server_state.arrivals())


def test_a_failed_job_never_arrives_and_its_owner_starts_again_from_the_next_version(gp) -> None:
    strategy = Asynchronous(TRAIN, buffer=2, speeds=(1.0, 3.0, 0.5, 2.0, 1.0))
    result = fedgp.fit(
        gp.spec, gp.federation, strategy, rounds=8, seed=1, faults=fedgp.run.Faults(simulate=0.3),
        callbacks=QUIET,
    )  # fmt: skip
    assert len(result.failures) > 0
    arrived = set(map(tuple, result.server_state.arrivals(result.roster.ids)[["client", "version"]].values))
    failed = {
        (row.client, row.round - 1) for row in result.failures.itertuples()
    }  # round t sends version t-1
    assert not arrived & failed
    restarted = {(client, version + 1) for client, version in failed if version + 1 < 7}
    assert restarted & arrived  # the owners that failed came back with a later version


def test_a_saved_asynchronous_result_loads_with_its_arrivals(gp, tmp_path) -> None:
    result = run(gp, Asynchronous(TRAIN, buffer=2, speeds=LogUniform()), rounds=4)
    result.save(tmp_path / "model")
    back = fedgp.run.load(tmp_path / "model")
    assert back.state.max_relative_difference(result.state) == 0
    pd.testing.assert_frame_equal(back.server_state.arrivals(), result.server_state.arrivals())


@given(
    speeds=st.lists(st.floats(0.01, 100.0), min_size=1, max_size=6),
    buffer=st.integers(1, 6),
    steps=st.integers(1, 8),
)
def test_the_schedule_keeps_its_invariants(gp, speeds, buffer, steps) -> None:
    """Any speeds and buffer: every step consumes B replies that arrived since the last step, each
    owner trains from a version at most once, and a job started at a step lasts 1 / speed."""
    k = len(speeds)
    buffer = min(buffer, k)
    spec = gp.spec
    sizes = torch.full((k,), 10)
    ctx = ServerContext(spec, sizes, torch.full((k,), 1.0 / k, dtype=torch.float64), list(range(k)), 0)
    strategy = Asynchronous(FGPR(server_optimizer=None), buffer=buffer, speeds=speeds)
    server = strategy.initialize(ctx, generator(0, "init"))
    times = [0.0]
    for rnd in range(steps):
        plan = strategy.configure(rnd, server, ctx, generator(0, "configure", rnd))
        n = len(plan.participants)
        reply = _reply(spec, strategy.global_state(server), 0.01 * (rnd + 1), n)
        reply[VERSION] = torch.full((n,), float(rnd), dtype=torch.float64)
        replies = Replies(plan.participants, plan.weights, reply, {}, {}, torch.arange(n))
        server, metrics = strategy.aggregate(rnd, server, plan, replies, ctx)
        assert metrics["buffered"] == buffer
        times.append(metrics["sim_time"])
    table = server.arrivals()
    assert times == sorted(times)
    assert not table.duplicated(["client", "version"]).any()
    assert (table["staleness"] == table["step"] - 1 - table["version"]).all()
    assert (table["staleness"] >= 0).all()
    for row in table.itertuples():
        assert times[row.step - 1] <= row.arrival <= times[row.step]
        assert row.arrival == times[row.version] + 1.0 / speeds[row.client]
