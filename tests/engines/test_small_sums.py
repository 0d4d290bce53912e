"""Small sums never leave the engine (issue 51, item 3): ``Faults(min_contributors=m)`` travels in
the task, and the engine withholds a sum of fewer replies where it forms it, so nothing that reads
what an engine returns holds a lone client's value. Each test records everything ``engine.run``
returns (:func:`fedgp.testing.engine.recording`) and searches it; Ray and the Flower engines keep the
same rule through the shipped contract (``EngineContract.test_a_run_never_sees_a_sum_of_too_few_clients``).
"""

from __future__ import annotations

from functools import cache

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fedgp
from fedgp.engines import Batched, Engine, Sequential
from fedgp.errors import EngineError, InputError, RoundFailedError
from fedgp.messages import MIN_CONTRIBUTORS, Record, Task, task_from_bytes, task_to_bytes
from fedgp.run import Faults, Progress
from fedgp.strategies import IFCA
from fedgp.testing.engine import SummingSpy, recording

ENGINES = {
    "sequential": Sequential(),
    "sequential_loopback": Sequential(loopback=True),
    "batched": Batched(chunk_size=2, check=False),
    "fused": Batched(fused=True, check=False),
}


@cache
def draws(k: int):
    return fedgp.synthetic.gp_federation(num_clients=k, n=[12, 9, 15, 11][:k], d=1, seed=7)


def tensors(outcome) -> list[torch.Tensor]:
    return [*outcome.sums.values(), *outcome.individual.values()]


def holds(t: torch.Tensor, secret: torch.Tensor) -> bool:
    """Whether ``t`` (any shape) holds ``secret``'s values as one of its rows of ``secret.numel()``."""
    flat = t.reshape(-1).to(torch.float64)
    if not flat.numel() or flat.numel() % secret.numel():
        return False
    return bool(torch.isclose(flat.reshape(-1, secret.numel()), secret.reshape(-1), atol=1e-12).all(1).any())


@pytest.mark.parametrize("config", list(ENGINES.values()), ids=list(ENGINES))
def test_nothing_the_engine_returns_holds_a_lone_clients_gradient(config):
    """IFCA's gradients are summed per cluster; a round that samples one client sums one gradient,
    which is that client's own. Without the minimum the engine returns it (the attack works); with
    ``min_contributors=2`` no tensor the engine returns holds it, and the round fails saying why."""
    data = draws(3)
    strategy = IFCA(num_clusters=2, aggregation="gradient", lr=0.1, clients_per_round=1)

    def fit(faults):
        engine = config.build(data.spec, list(data.federation), 0)
        seen = recording(engine)
        try:
            fedgp.fit(data.spec, data.federation, strategy, engine=engine, rounds=1, seed=3, faults=faults,
                      callbacks=[Progress(False)])  # fmt: skip
        except RoundFailedError as err:
            return seen, err
        finally:
            engine.close()
        return seen, None

    seen, _ = fit(Faults())
    (open_round,) = [out for task, out in seen if task.kind == "train"]
    assert len(open_round.clients) == 1 and open_round.sums  # a "sum" of one: that client's gradient
    lone = [t.to(torch.float64) for t in open_round.sums.values() if bool(t.abs().gt(1e-6).any())]
    assert lone
    seen, err = fit(Faults(min_contributors=2))
    assert err is not None and "not released: 1 contributor(s), fewer than the 2" in str(err)
    returned = [t for _, out in seen for t in tensors(out)]
    assert not any(holds(t, secret) for t in returned for secret in lone)


class Predates(Engine):
    """A third-party engine written before ``min_contributors``: it hands the option to nobody and
    returns every sum it forms (here: the sequential engine, given the task without it)."""

    def __init__(self, inner: Engine):
        self.inner = inner

    def start(self, strategy, seed):
        return self.inner.start(strategy, seed)

    def run(self, task, clients, fields):
        return self.inner.run(task.as_part(), clients, fields)


def test_an_engine_that_returns_a_small_sum_is_refused_not_repaired():
    """The run layer does not withhold after the fact: an engine that returns a sum of fewer
    clients than the task allows broke the contract, and the run stops with an EngineError naming it."""
    data = draws(3)
    engine = Predates(Sequential().build(data.spec, list(data.federation), 0))
    strategy = SummingSpy(local_steps=1, batch_size=4, clients_per_round=1)
    with pytest.raises(EngineError, match=r"Predates returned summed fields \['secret'\] of 1 client\(s\)"):
        fedgp.fit(data.spec, data.federation, strategy, engine=engine, rounds=1,
                  faults=Faults(min_contributors=2), callbacks=[Progress(False)])  # fmt: skip


@settings(max_examples=25)
@given(
    k=st.integers(2, 4),
    per_round=st.integers(1, 4),
    minimum=st.integers(1, 4),
    engine=st.sampled_from(["sequential", "batched", "fused"]),
)
def test_no_returned_sum_has_fewer_contributors_than_the_minimum(k, per_round, minimum, engine):
    """Whatever the federation, the sampling and the minimum: every sum an engine returns adds up at
    least ``min_contributors`` replies, the summary's included; a run goes on exactly when every
    exchange has enough, else it fails saying which sums were not released."""
    per_round = min(per_round, k)
    data = draws(k)
    built = ENGINES[engine].build(data.spec, list(data.federation), 0)
    seen = recording(built)
    strategy = SummingSpy(local_steps=1, batch_size=4, clients_per_round=per_round, sampling="uniform")
    run = lambda: fedgp.fit(data.spec, data.federation, strategy, engine=built, rounds=1,  # noqa: E731
                            faults=Faults(min_contributors=minimum), callbacks=[Progress(False)])  # fmt: skip
    if per_round >= minimum:
        run()
    else:
        with pytest.raises(RoundFailedError, match=r"not released"):
            run()
    for task, outcome in seen:
        assert not outcome.sums or len(outcome.clients) >= task.min_contributors
        if task.kind in ("summarise", "train"):
            assert task.min_contributors == minimum
    released = [out for task, out in seen if task.kind == "train" and out.sums]
    assert bool(released) == (per_round >= minimum)


def test_the_minimum_travels_in_the_task_and_is_checked():
    """``min_contributors`` is a task option: it survives the bytes a remote engine sends, a part
    for a shard drops it, and a value that is not a count of at least 1 is refused naming it."""
    shared = Record({"theta": torch.ones(2, dtype=torch.float64)})
    task = Task("train", 2, shared, options={MIN_CONTRIBUTORS: 3, "x": 1.0})
    assert task.min_contributors == 3 and Task("train").min_contributors == 1
    assert task_from_bytes(task_to_bytes(task)).min_contributors == 3
    part = task.as_part()
    assert part.min_contributors == 1 and dict(part.options) == {"x": 1.0} and part.round == 2
    plain = Task("train")
    assert plain.as_part() is plain
    for bad in (0, -1, True, 2.0, "2"):
        with pytest.raises(InputError, match="task option 'min_contributors' must be an int >= 1"):
            Task("train", options={MIN_CONTRIBUTORS: bad})
