"""One slow client fails alone: the batched engine isolates it by halving the chunk, as it
isolates a failing one (a client's update is a pure function of seed, round and client, so the
re-run halves reply as they would have)."""

import time

import pytest

import fedgp
from fedgp.strategies import fgpr

DRAWS = fedgp.data.gp_federation(num_clients=4, n=20, d=2, seed=0)


@pytest.fixture
def client_2_takes_three_seconds(monkeypatch):
    honest = fgpr.FGPR.local_update

    def local_update(self, ops, task):
        if 2 in [int(i) for i in ops.indices]:
            time.sleep(3.0)
        return honest(self, ops, task)

    monkeypatch.setattr(fgpr.FGPR, "local_update", local_update)


@pytest.mark.parametrize(
    "engine", [fedgp.engines.Batched(timeout=1.5), fedgp.engines.Sequential(timeout=1.5)]
)
def test_a_slow_client_fails_alone(client_2_takes_three_seconds, engine):
    result = fedgp.fit(DRAWS.spec, DRAWS.federation, rounds=1, engine=engine, seed=0)
    assert list(result.failures["client"]) == [2]
    assert result.failures["reason"].iloc[0].startswith("timeout: replied after")
    assert result.history["failed"].tolist() == [1]
