"""The Ray engine keeps the engine contract, and survives a worker that dies.

Ray runs locally with 2 CPUs; it must be installed (``fedgp[ray]``, installed by ``make``): under
``CI=true`` a missing Ray fails these tests instead of skipping them.
"""

import os

import pytest
import torch

import fedgp
from fedgp.engines import Batched, Ray
from fedgp.testing import EngineContract

if os.environ.get("CI", "").strip().lower() == "true":
    import ray  # noqa: F401  (fail, not skip, when CI lacks it)
else:
    pytest.importorskip("ray")


@pytest.fixture(scope="module", autouse=True)
def ray_cluster():
    import ray

    from fedgp.engines.ray import shutdown

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    shutdown()


class TestRayEngineContract(EngineContract):
    engine = Ray(num_workers=2, shard=Batched(chunk_size=2))
    supports_loopback = False  # every message already crosses as bytes


def test_a_dead_worker_fails_its_clients_for_that_round_and_the_run_goes_on():
    draws = fedgp.data.gp_federation(num_clients=6, n=20, d=1, n_test=5, seed=1)
    from fedgp.engines.ray import RayEngine

    engine = RayEngine(draws.spec, draws.federation, num_workers=2)
    lost = set(engine.shards[0].tolist())

    def crash_after_round_1(run):
        if run.completed == 1:
            engine.kill(0)

    result = fedgp.fit(
        draws.spec,
        draws.federation,
        fedgp.strategies.FGPR(batch_size=8),
        engine=engine,
        rounds=3,
        callbacks=[crash_after_round_1],
    )
    assert result.history["failed"].tolist() == [0, len(lost), 0]
    assert set(result.failures["client"]) == {draws.federation.ids[p] for p in lost}
    assert result.failures["reason"].str.startswith("worker 0 lost").all()
    reference = fedgp.fit(
        draws.spec, draws.federation, fedgp.strategies.FGPR(batch_size=8), engine="sequential", rounds=1
    )
    assert result.evaluate()["client"].tolist() == reference.evaluate()["client"].tolist()
    engine.close()
    assert torch.isfinite(result.state["covar_module.outputscale"])


def test_more_workers_than_cores_warns_with_the_count(monkeypatch):
    """Each actor runs a whole shard: more actors than cores share them and run slower than one per
    core (measured 62.8 s against 24.3 s for 8 workers on 2 cores); fedgp says so."""
    from fedgp.engines.ray import RayEngine

    draws = fedgp.data.gp_federation(num_clients=4, n=10, d=1, seed=2)
    monkeypatch.setattr("os.cpu_count", lambda: 1)
    with pytest.warns(fedgp.errors.FedGPWarning, match=r"num_workers=2\) on a machine with 1 CPUs"):
        RayEngine(draws.spec, draws.federation, num_workers=2)
