"""The Ray engine keeps the engine contract, survives a worker that dies, and stops the Ray a fit
started (unless told to keep it) while its result still predicts.

Ray runs locally with 2 CPUs; it must be installed (``fedgp[ray]``, installed by ``make``): under
``CI=true`` a missing Ray fails these tests instead of skipping them. The tests that need a Ray the
user started come first, those that need none (so the engine starts it) last: each start of Ray costs
seconds.
"""

import dataclasses
import os

import pandas as pd
import pytest
import torch

import fedgp
from fedgp.engines import Batched, Ray
from fedgp.engines.sequential import SequentialEngine
from fedgp.run import Progress
from fedgp.run.exchange import ask
from fedgp.testing import EngineContract

if os.environ.get("CI", "").strip().lower() == "true":
    import ray  # noqa: F401  (fail, not skip, when CI lacks it)
else:
    pytest.importorskip("ray")


@pytest.fixture(scope="module", autouse=True)
def stop_ray_after_the_module():
    from fedgp.engines.ray import shutdown

    yield
    shutdown()


@pytest.fixture
def user_ray():
    """A Ray the user started before fit (``ray.init`` with 2 CPUs), kept between tests."""
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    return ray


@pytest.fixture
def no_ray():
    """No Ray running: the engine has to start it (with ``num_cpus=num_workers``, 2 here)."""
    import ray

    from fedgp.engines.ray import shutdown

    shutdown()
    yield ray
    shutdown()


@pytest.mark.usefixtures("user_ray")
class TestRayEngineContract(EngineContract):
    engine = Ray(num_workers=2, shard=Batched(chunk_size=2))
    supports_loopback = False  # every message already crosses as bytes


@pytest.mark.usefixtures("user_ray")
@pytest.mark.filterwarnings("ignore:the batched engine evaluates this spec client by client")
def test_a_sparse_variational_gp_gives_the_sequential_engines_numbers():
    """A VariationalGPSpec reaches the actors and runs there client by client: the same final state
    and test metrics as the sequential engine."""
    draws = fedgp.synthetic.gp_federation(num_clients=5, n=[30, 12, 25, 18, 40], d=2, n_test=5, seed=1)
    spec = fedgp.VariationalGPSpec(6, draws.spec.kernel, input_dim=2)
    runs = [
        fedgp.fit(spec, draws.federation, rounds=3, engine=engine, seed=4)
        for engine in ("sequential", Ray(num_workers=2))
    ]
    for name in spec.names:
        assert torch.allclose(runs[0].state[name], runs[1].state[name], rtol=1e-10, atol=1e-12), name
    pd.testing.assert_frame_equal(runs[0].evaluate(), runs[1].evaluate())


def test_a_dead_worker_fails_its_clients_for_that_round_and_the_run_goes_on(user_ray):
    draws = fedgp.synthetic.gp_federation(num_clients=6, n=20, d=1, n_test=5, seed=1)
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


def test_more_workers_than_cores_warns_with_the_count(user_ray, monkeypatch):
    """Each actor runs a whole shard: more actors than cores share them and run slower than one per
    core (measured 62.8 s against 24.3 s for 8 workers on 2 cores); fedgp says so."""
    from fedgp.engines.ray import RayEngine

    draws = fedgp.synthetic.gp_federation(num_clients=4, n=10, d=1, seed=2)
    monkeypatch.setattr("os.cpu_count", lambda: 1)
    with pytest.warns(fedgp.errors.FedGPWarning, match=r"num_workers=2\) on a machine with 1 CPUs"):
        RayEngine(draws.spec, draws.federation, num_workers=2)


# -- personal hyper-parameters: each actor keeps its clients' memory ----------------------------------------
NOISE = "likelihood.noise_covar.noise"
PERSONAL = fedgp.strategies.FGPR(batch_size=8, local_steps=2, personal=("noise",))


def _personal_fit(draws, engine, rounds=4, callbacks=()):
    """A personal-noise fit; each round's per-client states (asked of the clients, as a result asks)
    are recorded in the result's ``per_round``."""
    per_round = []

    def record(run):
        out = ask(run, "personal", torch.arange(len(draws.federation)))
        per_round.append({k: v.clone() for k, v in out.individual.items()})

    result = fedgp.fit(draws.spec, draws.federation, PERSONAL, engine=engine, rounds=rounds, seed=4,
                       callbacks=[Progress(False), record, *callbacks])  # fmt: skip
    result.per_round = per_round
    return result


def _assert_same_personal_fit(result, reference, draws, rtol=1e-8):
    """Every round's shared state (history) and every client's state, the final predictions."""
    columns = [c for c in reference.history if c in reference.state]
    pd.testing.assert_frame_equal(result.history[columns], reference.history[columns], rtol=rtol)
    assert len(result.per_round) == len(reference.per_round)
    for ours, ref in zip(result.per_round, reference.per_round):
        assert set(ours) == set(ref)
        for name in ref:
            torch.testing.assert_close(ours[name], ref[name], rtol=rtol, atol=1e-12)
    X = torch.linspace(-0.5, 1.5, 7, dtype=torch.float64)[:, None]
    for client in range(len(draws.federation)):
        for a, b in zip(result.predict(X, client, True), reference.predict(X, client, True)):
            torch.testing.assert_close(a, b, rtol=rtol, atol=1e-12)
        torch.testing.assert_close(result.client_state(client)[NOISE], reference.client_state(client)[NOISE],
                                   rtol=rtol, atol=1e-12)  # fmt: skip


def test_personal_noise_on_ray_is_the_sequential_fit_every_round_and_after_close(user_ray):
    """FGPR(personal=("noise",)): the actors keep each owner's noise between rounds, so every round's
    states and the predictions after fit (the engine closed by fit: the memory came back to the
    driver) are the sequential engine's; each owner's noise is its own."""
    draws = _draws()
    reference = _personal_fit(draws, "sequential")
    result = _personal_fit(draws, Ray(num_workers=2, shard=Batched(compiled=False)))
    _assert_same_personal_fit(result, reference, draws)
    assert len({float(result.client_state(k)[NOISE]) for k in range(6)}) == 6
    assert result.state[NOISE] == draws.spec.initial_state()[NOISE]  # the server never learns them


def test_the_memory_stays_on_the_actors_until_the_engine_closes(user_ray):
    """During the run the driver holds no client's personal values; predictions of the open engine
    (on the actors) and of the closed one (in the driver, with the memory brought back) agree."""
    from fedgp.engines.ray import RayEngine

    draws = _draws()
    engine = RayEngine(draws.spec, draws.federation, num_workers=2, shard={"compiled": False})
    on_driver = []
    result = _personal_fit(
        draws, engine, rounds=3, callbacks=[lambda run: on_driver.append(dict(engine._memory))]
    )
    assert on_driver == [{}] * 3 and engine._local is None
    X = torch.linspace(0, 1, 5, dtype=torch.float64)[:, None]
    on_actors = [result.predict(X, k) for k in range(6)]
    engine.close()
    assert sorted(engine._memory) == list(range(6)) and all(
        set(m) == {NOISE} for m in engine._memory.values()
    )
    for k in range(6):
        for ours, ref in zip(result.predict(X, k), on_actors[k]):
            torch.testing.assert_close(ours, ref, rtol=1e-8, atol=1e-12)
    _assert_same_personal_fit(result, _personal_fit(draws, "sequential", rounds=3), draws)


class _Crashing(SequentialEngine):
    """The sequential engine with a dead Ray worker's effect: after ``crash()`` the next task fails
    the ``lost`` clients, and they have lost what they kept."""

    def crash(self, lost):
        self.lost = lost
        for key in lost:
            self.memory.pop(key, None)

    def run(self, task, clients, fields):
        lost, self.lost = getattr(self, "lost", []), []
        hit = torch.isin(clients, torch.tensor(lost, dtype=torch.long))
        out = super().run(task, clients[~hit], fields)
        out.failures.update(dict.fromkeys(clients[hit].tolist(), "worker 0 lost"))
        return out


def test_a_dead_workers_clients_lose_their_personal_values_and_restart_from_the_servers(user_ray):
    """A worker killed after round 1: its clients fail round 2 and, their memory gone with the actor,
    train from the server's values again (the docstring's choice), with a warning naming them; the
    run equals the sequential engine's where those clients fail round 2 and forget what they kept."""
    from fedgp.engines.ray import RayEngine

    draws = _draws()
    engine = RayEngine(draws.spec, draws.federation, num_workers=2, shard={"compiled": False})
    lost = engine.shards[0].tolist()
    reference_engine = _Crashing(draws.spec, list(draws.federation))

    def crash(which):
        def after_round_1(run):
            if run.completed == 1:
                which()

        return after_round_1

    with pytest.warns(
        fedgp.errors.FedGPWarning, match=r"worker 0 was replaced: the personal values its 3 clients"
    ):
        result = _personal_fit(draws, engine, callbacks=[crash(lambda: engine.kill(0))])
    reference = _personal_fit(
        draws, reference_engine, callbacks=[crash(lambda: reference_engine.crash(lost))]
    )
    engine.close()
    assert result.history["failed"].tolist() == reference.history["failed"].tolist() == [0, 3, 0, 0]
    _assert_same_personal_fit(result, reference, draws)
    unbroken = _personal_fit(draws, "sequential")
    for k in lost:  # what they kept mattered: without the crash they end elsewhere
        assert not torch.allclose(result.client_state(k)[NOISE], unbroken.client_state(k)[NOISE], rtol=1e-6)


def test_a_worker_lost_before_close_leaves_its_clients_the_servers_values(user_ray):
    """The memory comes back at close from the actors alive then; a dead one's clients answer
    under the server's values afterwards (with a warning), the others under their own."""
    from fedgp.engines.ray import RayEngine

    draws = _draws()
    engine = RayEngine(draws.spec, draws.federation, num_workers=2, shard={"compiled": False})
    result = _personal_fit(draws, engine, rounds=2)
    before = [result.client_state(k)[NOISE] for k in range(6)]
    engine.kill(0)
    with pytest.warns(fedgp.errors.FedGPWarning, match="worker 0 was lost before the engine closed"):
        engine.close()
    lost = engine.shards[0].tolist()
    for k in range(6):
        now = result.client_state(k)[NOISE]
        if k in lost:
            assert torch.equal(now, result.state[NOISE]) and not torch.equal(now, before[k])
        else:
            assert torch.equal(now, before[k])


def test_a_private_run_with_personal_noise_on_ray_is_the_sequential_one(user_ray):
    """ClientDP(FGPR(personal=...)), the noise drawn from the seed by the clients: the actors' owners
    keep their own noise and draw the sequential engine's shares."""
    draws = _draws()
    private = fedgp.run.ClientDP(PERSONAL, noise=0.7, rate=0.8, delta=1e-3, reproducible=True,
                                 noise_at="clients", noise_shares=2)  # fmt: skip
    runs = [
        fedgp.fit(
            draws.spec,
            draws.federation,
            private,
            engine=engine,
            rounds=3,
            seed=4,
            callbacks=[Progress(False)],
        )
        for engine in ("sequential", Ray(num_workers=2, shard=Batched(compiled=False)))
    ]
    assert runs[0].state.max_relative_difference(runs[1].state) < 1e-8
    for k in range(6):
        torch.testing.assert_close(runs[1].client_state(k)[NOISE], runs[0].client_state(k)[NOISE],
                                   rtol=1e-8, atol=1e-12)  # fmt: skip


def test_a_ray_runs_owners_values_save_and_resume_as_the_sequential_runs(user_ray, tmp_path):
    """The actors' kept values reach a checkpoint mid-run (asked of the actors) and a saved model
    after it (the driver's copy); a run resumed on Ray gives them back to the actors and ends as the
    unbroken sequential run, and the loaded model predicts every owner under its own values."""
    draws, path = _draws(), tmp_path / "run.ckpt"
    unbroken = _personal_fit(draws, "sequential")
    _personal_fit(draws, Ray(num_workers=2, shard=Batched(compiled=False)), rounds=2,
                  callbacks=[fedgp.run.Checkpointing(path)])  # fmt: skip
    resume = fedgp.run.Checkpointing(path, every=None, resume=True)
    resumed = fedgp.fit(draws.spec, draws.federation, PERSONAL, rounds=4, seed=4,
                        engine=Ray(num_workers=2, shard=Batched(compiled=False)),
                        callbacks=[Progress(False), resume])  # fmt: skip
    a, b = unbroken.personal_values(), resumed.personal_values()
    assert set(a) == set(b) == set(draws.federation.ids)
    for owner in a:
        torch.testing.assert_close(b[owner][NOISE], a[owner][NOISE], rtol=1e-8, atol=1e-12)
    loaded = fedgp.load(resumed.save(tmp_path / "model.fedgp"))
    X = torch.linspace(-0.5, 1.5, 7, dtype=torch.float64)[:, None]
    for client in draws.federation:
        for ours, ref in zip(loaded.predict(X, client, True), unbroken.predict(X, client.id, True)):
            torch.testing.assert_close(ours, ref, rtol=1e-8, atol=1e-12)


# -- Ray's lifetime ----------------------------------------------------------------------------------------
# Each start of Ray starts fresh actors; without the compiled step they need not load numba (seconds less).
FRESH = Ray(num_workers=2, shard=Batched(compiled=False))


def _draws():
    return fedgp.synthetic.gp_federation(num_clients=6, n=20, d=1, n_test=5, seed=3)


def _fit(draws, engine, rounds=2, **kwargs):
    strategy = fedgp.strategies.FGPR(batch_size=8)
    return fedgp.fit(draws.spec, draws.federation, strategy, engine=engine, rounds=rounds, seed=4, **kwargs)


def _assert_predicts_as(result, reference, draws):
    """Prediction, a client's state and evaluation as the reference result's, to the contract's 1e-8."""
    X = torch.linspace(-0.5, 1.5, 7, dtype=torch.float64)[:, None]
    for client in (0, draws.federation.ids[4], draws.federation[5]):
        for ours, ref in zip(result.predict(X, client, True), reference.predict(X, client, True)):
            torch.testing.assert_close(ours, ref, rtol=1e-8, atol=1e-12)
    for name, value in reference.client_state(2).items():
        torch.testing.assert_close(result.client_state(2)[name], value, rtol=1e-8, atol=1e-12)
    pd.testing.assert_frame_equal(result.evaluate(), reference.evaluate(), rtol=1e-8)


def test_a_ray_the_user_started_stays_up_after_fit(user_ray):
    draws = _draws()
    result = _fit(draws, "ray")  # the engine's defaults: one worker per CPU of the running Ray
    assert user_ray.is_initialized()
    _assert_predicts_as(result, _fit(draws, "sequential"), draws)


def test_a_closed_engine_answers_in_process_and_a_new_run_reloads_its_shards(user_ray):
    from fedgp.engines.ray import RayEngine

    draws = _draws()
    engine = RayEngine(draws.spec, draws.federation, num_workers=2)
    result = _fit(draws, engine)
    X = torch.linspace(0, 1, 5, dtype=torch.float64)[:, None]
    on_actors = result.predict(X, 3)
    engine.close()
    assert user_ray.is_initialized()  # not this engine's to stop
    assert engine._loaded == [None, None]  # the shards left the actors
    for ours, ref in zip(result.predict(X, 3), on_actors):
        torch.testing.assert_close(ours, ref, rtol=1e-8, atol=1e-12)
    again = _fit(draws, engine)
    assert all(actor is not None for actor in engine._loaded)  # back on the actors
    assert again.state.max_relative_difference(result.state) == 0.0
    engine.close()


def test_a_fit_that_started_ray_stops_it_and_its_result_still_predicts_as_sequential(no_ray):
    draws = _draws()
    result = _fit(draws, FRESH)
    assert not no_ray.is_initialized()
    reference = _fit(draws, "sequential")
    assert result.state.max_relative_difference(reference.state) < 1e-8
    _assert_predicts_as(result, reference, draws)  # answered in this process ...
    assert not no_ray.is_initialized()  # ... without starting Ray again


def test_keep_alive_leaves_the_ray_fit_started_running_for_the_next_fit(no_ray):
    from fedgp.engines.ray import shutdown

    draws = _draws()
    first = _fit(draws, dataclasses.replace(FRESH, keep_alive=True), rounds=1)
    assert no_ray.is_initialized()
    second = _fit(draws, FRESH, rounds=1)  # Ray was running: this fit leaves it so
    assert no_ray.is_initialized()
    assert second.state.max_relative_difference(first.state) == 0.0
    shutdown()
    assert not no_ray.is_initialized()
    _assert_predicts_as(first, _fit(draws, "sequential", rounds=1), draws)


def test_an_error_inside_fit_or_in_building_the_engine_still_stops_the_ray_it_started(no_ray, monkeypatch):
    draws = _draws()

    def fail_in_round_2(run):
        if run.completed == 2:
            raise RuntimeError("a callback failed")

    with pytest.raises(RuntimeError, match="a callback failed"):
        _fit(draws, FRESH, rounds=3, callbacks=[fail_in_round_2])
    assert not no_ray.is_initialized()

    def no_actor(slot, threads):
        raise RuntimeError("no actor")

    monkeypatch.setattr("fedgp.engines.ray._actor", no_actor)
    with pytest.raises(RuntimeError, match="no actor"):
        _fit(draws, FRESH)  # fails after ray.init, at the first actor
    assert not no_ray.is_initialized()


def test_an_engine_you_build_is_yours_to_close(no_ray):
    """fit leaves an Engine passed to it running; its close stops the Ray it started."""
    from fedgp.engines.ray import RayEngine

    draws = _draws()
    engine = RayEngine(draws.spec, draws.federation, num_workers=2, shard={"compiled": False})
    result = _fit(draws, engine)
    assert no_ray.is_initialized()
    engine.close()
    assert not no_ray.is_initialized()
    _assert_predicts_as(result, _fit(draws, "sequential"), draws)
