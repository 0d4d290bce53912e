"""The round mechanics around the engines: reply thresholds, option checks, timeouts."""

from dataclasses import dataclass

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given

import fedgp
from fedgp.aggregators import CoordinateMedian, WeightedMean
from fedgp.errors import RoundFailedError
from fedgp.run.exchange import required_replies
from fedgp.strategies import FGPR
from fedgp.synthetic import gp_federation


@pytest.fixture(scope="module")
def draws():
    return gp_federation(num_clients=4, n=20, d=1, n_test=5, seed=0)


@given(st.integers(1, 10_000), st.floats(1e-6, 1.0))
def test_a_fraction_of_replies_is_a_count_between_one_and_all(asked, fraction):
    need = required_replies(fraction, asked)
    assert 1 <= need <= asked and need >= fraction * asked - 1e-9


@given(st.integers(1, 10_000), st.integers(1, 20_000))
def test_a_count_of_replies_is_capped_at_the_participants(asked, count):
    assert required_replies(count, asked) == min(count, asked)


@pytest.mark.parametrize("bad", [0, -1, 0.0, 1.5, "half", True])
def test_bad_min_replies_are_refused(bad):
    with pytest.raises((ValueError, TypeError)):
        required_replies(bad, 10)


@pytest.mark.parametrize(
    "p, error", [(-0.1, ValueError), (1.0, ValueError), (2, ValueError), ("0.1", TypeError)]
)
def test_simulate_failures_must_be_a_probability(p, error):
    # refused when the settings are made, before any fit starts
    with pytest.raises(error, match=r"Faults\(simulate=\.\.\.\) must be a probability"):
        fedgp.run.Faults(simulate=p)


def test_every_client_failing_stops_the_run_naming_them(draws):
    with pytest.raises(RoundFailedError, match=r"round 1 \(train\): 0 of 4 clients replied") as info:
        fedgp.fit(
            draws.spec,
            draws.federation,
            engine="sequential",
            rounds=2,
            faults=fedgp.run.Faults(simulate=0.999999),
        )
    assert sorted(info.value.failures) == sorted(draws.federation.ids)


@dataclass(frozen=True)
class Slow(FGPR):
    """FGPR whose client 1 takes a long time."""

    def local_update(self, ops, task):
        if bool((ops.indices == 1).any()):
            import time

            time.sleep(1.0)
        return super().local_update(ops, task)


def test_a_late_reply_is_a_timeout_failure_of_that_round(draws):
    result = fedgp.fit(
        draws.spec,
        draws.federation,
        Slow(batch_size=8),
        engine=fedgp.engines.Sequential(timeout=0.5),
        rounds=2,
    )
    # the slow client fails every round (others are fast, but on a loaded machine not guaranteed so)
    slow = result.failures[result.failures["client"] == draws.federation.ids[1]]
    assert slow["round"].tolist() == [1, 2]
    assert (result.failures["reason"] == "timeout: no reply within 0.5 s; cut off").all()


values = st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=9)


@given(values)
def test_median_lies_within_the_participants_values_and_a_shared_state_is_kept(xs):
    spec = gp_federation(num_clients=2, n=5, d=1, seed=0).spec
    base = spec.initial_state()
    name = "covar_module.base_kernel.lengthscale"
    ls = torch.tensor([abs(x) + 1e-3 for x in xs], dtype=torch.float64).reshape(-1, 1, 1)
    states = base.expand(len(xs)).clone()
    states = fedgp.HyperState({**dict(states), name: ls}, spec.event_shapes)
    w = torch.full((len(xs),), 1.0 / len(xs), dtype=torch.float64)
    median = CoordinateMedian("constrained")(spec, states, w, base)[name]
    assert float(ls.min()) <= float(median) <= float(ls.max())
    same = base.expand(len(xs)).clone()
    kept = WeightedMean()(spec, same, w, base)
    assert all(torch.allclose(kept[k], base[k], rtol=1e-12) for k in base)


def test_fit_takes_an_engine_instance_and_then_needs_no_federation(draws):
    from fedgp.engines.batched import BatchedEngine

    by_name = fedgp.fit(draws.spec, draws.federation, FGPR(batch_size=8), engine="batched", rounds=2)
    engine = BatchedEngine(draws.spec, draws.federation, chunk_size=2)
    by_instance = fedgp.fit(draws.spec, None, FGPR(batch_size=8), engine=engine, rounds=2)
    assert all(torch.equal(by_name.state[k], by_instance.state[k]) for k in by_name.state)
    assert by_instance.evaluate()["client"].tolist() == list(draws.federation.ids)
    assert by_instance.engine is engine  # used as it is
    # options go on a config, which builds its engine for a federation: without one it cannot
    with pytest.raises(
        TypeError, match="federation is None: pass a fedgp.data.Federation, or an Engine instance that hosts"
    ):
        fedgp.fit(draws.spec, None, engine=fedgp.engines.Batched(chunk_size=3), rounds=1)
