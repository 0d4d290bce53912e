"""One slow client fails alone: the batched engine isolates it by halving the chunk, as it
isolates a failing one (a client's update is a pure function of seed, round and client, so the
re-run halves reply as they would have). A hung client is cut off at the timeout while it runs."""

import threading
import time
import types

import pytest
import torch

import fedgp
from fedgp.strategies import fgpr

DRAWS = fedgp.synthetic.gp_federation(num_clients=4, n=20, d=2, seed=0)


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
    assert result.failures["reason"].iloc[0] == "timeout: no reply within 1.5 s; cut off"
    assert result.history["failed"].tolist() == [1]


@pytest.fixture
def client_1(monkeypatch):
    """Client 1's local update hangs (until the test ends; an hour, were it not released) while
    ``client_1.mode`` is "hang", and raises when it is "fail"."""
    honest = fgpr.FGPR.local_update
    control = types.SimpleNamespace(mode="hang", hung=[], release=threading.Event())

    def local_update(self, ops, task):
        if 1 in [int(i) for i in ops.indices]:
            if control.mode == "fail":
                raise RuntimeError("client 1 is down")
            control.hung.append(threading.current_thread())
            control.release.wait(3600)
        return honest(self, ops, task)

    monkeypatch.setattr(fgpr.FGPR, "local_update", local_update)
    yield control
    control.release.set()
    for thread in control.hung:
        thread.join(60)


@pytest.mark.parametrize("engine", [fedgp.engines.Batched, fedgp.engines.Sequential])
def test_a_hung_client_is_cut_off_while_it_runs_and_the_run_is_the_one_without_it(client_1, engine):
    """The fit returns while the hung client's work still runs (its threads are alive); client 1
    fails each round by the timeout; every other number is that of the run in which client 1
    simply fails: the abandoned work shares nothing later clients use (the engine rebuilds its
    GPyTorch model and modules)."""
    hung = fedgp.fit(DRAWS.spec, DRAWS.federation, rounds=2, engine=engine(timeout=1.0), seed=0)
    assert client_1.hung and all(thread.is_alive() for thread in client_1.hung)
    assert hung.failures["client"].tolist() == [1, 1]
    assert set(hung.failures["reason"]) == {"timeout: no reply within 1 s; cut off"}
    client_1.mode = "fail"
    failed = fedgp.fit(DRAWS.spec, DRAWS.federation, rounds=2, engine=engine(timeout=1.0), seed=0)
    assert failed.failures["client"].tolist() == [1, 1]
    for name, value in failed.state.items():
        assert torch.equal(hung.state[name], value), name
    columns = [c for c in hung.history.columns if c not in ("failures", "bytes_down", "bytes_up")]
    assert hung.history[columns].equals(failed.history[columns])
    assert hung.evaluate()[["rmse", "nll"]].equals(failed.evaluate()[["rmse", "nll"]])
