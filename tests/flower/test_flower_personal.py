"""Personal hyper-parameters on Flower (issue 52, item 2): each node keeps its own clients' values in
its context state between messages; none of them is in a message a node sends.

On the in-process Flower engine, which runs the real ClientApp over Flower's wire format.
"""

from __future__ import annotations

import os
import struct

import pytest
import torch

import fedgp

if os.environ.get("CI", "").strip().lower() == "true":
    import flwr  # noqa: F401  (fail, not skip, when CI lacks it)
else:
    pytest.importorskip("flwr")
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

from flwr.app import Context, RecordDict  # noqa: E402

from fedgp.flower import Flower, FlowerEngine, SecureAggregation  # noqa: E402
from fedgp.flower.capture import message_bytes  # noqa: E402
from fedgp.flower.client import kept_memory  # noqa: E402
from fedgp.strategies import FGPR  # noqa: E402
from tests.strategies.test_personal_hyperparameters import NOISE, two_noise_levels  # noqa: E402

QUIET = [fedgp.run.Progress(False)]
OWNERS, NODES, ROUNDS = 4, 2, 3
PERSONAL = FGPR(local_steps=2, personal=("noise",))


def _fit(engine, strategy=PERSONAL, **options):
    return fedgp.fit(
        fedgp.GPSpec(), two_noise_levels(n=25, owners=OWNERS), strategy, rounds=ROUNDS, engine=engine,
        seed=0, callbacks=QUIET, **options,
    )  # fmt: skip


def _gap(a: fedgp.FitResult, b: fedgp.FitResult) -> float:
    """The largest difference of the server states and of every owner's own state."""
    pairs = [(a.state, b.state)] + [(a.client_state(k), b.client_state(k)) for k in range(OWNERS)]
    return max(float((x[n] - y[n]).abs().max()) for x, y in pairs for n in x)


def test_personal_noise_on_flower_is_the_sequential_run():
    """Bit for bit without a transform: the server state, every owner's own state (asked of its node:
    a ``personal`` task) and its predictions (a ``predict`` task on the node, with its own noise). With
    the run's units ("auto", whose sums come over nodes in another order: 1 ulp) and secure aggregation
    of those sums: measured 5.6e-16 plain, 2.0e-14 secure. An owner's node that forgot its noise
    between rounds would start each round from the server's and end elsewhere."""
    sequential, flower = _fit("sequential", transforms=None), _fit(Flower(num_nodes=NODES), transforms=None)
    assert _gap(flower, sequential) == 0.0
    noises = {float(flower.client_state(k)[NOISE]) for k in range(OWNERS)}
    assert len(noises) == OWNERS and float(flower.state[NOISE]) not in noises  # each owner's own
    X = torch.linspace(0, 4, 6, dtype=torch.float64)[:, None]
    for k in (0, OWNERS - 1):
        mine, theirs = flower.predict(X, client=k), sequential.predict(X, client=k)
        assert all(torch.equal(a, b) for a, b in zip(mine, theirs))
    shared = _fit(Flower(num_nodes=NODES), FGPR(local_steps=2), transforms=None)
    assert _gap(flower, shared) > 1e-3  # personal noise is not the shared run's

    sequential, plain = _fit("sequential"), _fit(Flower(num_nodes=NODES))
    assert _gap(plain, sequential) < 1e-12
    secure = _fit(Flower(num_nodes=NODES, secure=SecureAggregation()))
    assert _gap(secure, sequential) < 1e-12
    assert _gap(secure, plain) > 0  # the sums came through the protocol's fixed-point encoding


def _floats(t: torch.Tensor) -> list[bytes]:
    return [struct.pack("<d", v) for v in t.detach().to(torch.float64).flatten().tolist()]


@pytest.mark.parametrize("secure", [None, SecureAggregation()], ids=["plain", "secure"])
def test_no_message_a_node_sends_holds_a_personal_value(secure):
    """Every message in and out of every node, as Flower serialises it: the nodes keep each owner's
    trained noise (the values its own state reports), no reply holds one of those values' bytes or
    names the noise, while the messages to the nodes do carry the server's state (the search finds
    float64 values in Flower's format)."""
    into, out = [], []

    def record(message, context, call_next):
        into.append(message_bytes(message))
        reply = call_next(message, context)
        out.append(message_bytes(reply))
        return reply

    federation = two_noise_levels(n=25, owners=OWNERS)
    engine = FlowerEngine(fedgp.GPSpec(), list(federation), num_nodes=NODES, mods=(record,), secure=secure)
    result = fedgp.fit(fedgp.GPSpec(), federation, PERSONAL, rounds=ROUNDS, engine=engine, seed=0,
                       transforms=None, callbacks=QUIET)  # fmt: skip
    sent = b"".join(out)
    kept = {}
    for _, context in engine.grid.apps.values():
        kept.update(kept_memory(context))
    assert sorted(kept) == list(range(OWNERS))
    for key, values in kept.items():
        assert set(values) == {NOISE}
        assert torch.equal(values[NOISE], result.client_state(key)[NOISE])  # asked after the capture
        assert not any(value in sent for value in _floats(values[NOISE]))
    assert b"noise" not in sent and b"lengthscale" in sent
    assert _floats(result.state["covar_module.base_kernel.lengthscale"])[0] in b"".join(into)


def test_a_restarted_node_refuses_the_rest_of_the_run_and_the_others_keep_theirs():
    """A node restarted mid-run has an empty context state: no registration and no kept values. It
    fails the run's later tasks ("not been registered"), so its owners fail each later round and
    asking for their own state fails, rather than starting quietly from the server's noise; the other
    node's owners go on with their own values."""
    federation = two_noise_levels(n=25, owners=OWNERS)
    engine = FlowerEngine(fedgp.GPSpec(), list(federation), num_nodes=NODES)
    last = max(engine.grid.apps)

    def restart(run):
        if run.completed == 1:
            app, old = engine.grid.apps[last]
            assert kept_memory(old)  # it kept its owners' noise after round 1
            engine.grid.apps[last] = (app, Context(run_id=old.run_id, node_id=last,
                                                   node_config=old.node_config, state=RecordDict(),
                                                   run_config={}))  # fmt: skip

    result = fedgp.fit(fedgp.GPSpec(), federation, PERSONAL, rounds=ROUNDS, engine=engine, seed=0,
                       transforms=None, callbacks=[*QUIET, fedgp.run.Evaluate(every=0), restart])  # fmt: skip
    assert result.history["failed"].tolist() == [0, 2, 2]
    lost = set(federation.ids[OWNERS // 2 :])
    assert set(result.failures["client"]) == lost
    assert result.failures["reason"].str.contains("has not been registered for the run").all()
    survivors = kept_memory(engine.grid.apps[min(engine.grid.apps)][1])
    assert sorted(survivors) == [0, 1]
    for k in (0, 1):
        assert torch.equal(result.client_state(k)[NOISE], survivors[k][NOISE])
    with pytest.raises(fedgp.EngineError, match="not been registered"):
        result.client_state(OWNERS - 1)


def test_an_owner_whose_reply_is_refused_keeps_what_it_had_on_its_node():
    """A client whose reply is refused on its node (NaN loss) every round keeps its initial noise there,
    as on the sequential engine; its node's other client keeps what it trained."""
    from fedgp.testing.engine import Saboteur

    strategy = Saboteur(victim=2, how="nan", local_steps=2, personal=("noise",))
    federation = two_noise_levels(n=25, owners=OWNERS)
    engine = FlowerEngine(fedgp.GPSpec(), list(federation), num_nodes=NODES)
    result = fedgp.fit(fedgp.GPSpec(), federation, strategy, rounds=ROUNDS, engine=engine, seed=0,
                       transforms=None, callbacks=QUIET)  # fmt: skip
    assert set(result.failures["client"]) == {federation[2].id}
    kept = kept_memory(engine.grid.apps[max(engine.grid.apps)][1])
    assert sorted(kept) == [3]  # the victim's node keeps nothing for it
    assert result.client_state(2)[NOISE] == fedgp.GPSpec().initial_state()[NOISE]
    assert torch.equal(result.client_state(3)[NOISE], kept[3][NOISE])


def test_an_asynchronous_replay_with_personal_noise_over_flower_is_the_sequential_engines():
    """Replies consumed stale (a simulated schedule): each node still trains its owners from their
    own kept noise, bit for bit as in process."""
    from fedgp.strategies import Asynchronous

    strategy = Asynchronous(PERSONAL, buffer=2, speeds=(1.0, 3.0, 0.5, 2.0))
    sequential, flower = (
        _fit(engine, strategy, transforms=None) for engine in ("sequential", Flower(num_nodes=2))
    )
    assert _gap(flower, sequential) == 0.0
    assert flower.history["staleness_max"].max() > 0


def test_nodes_running_their_owners_batched_keep_their_values_as_the_batched_engine():
    """A node that runs its owners with the batched engine keeps and commits their values per owner:
    the batched engine's run bit for bit (measured; 1.1e-15 from the sequential one)."""
    from fedgp.engines import Batched

    batched = _fit(Batched(check=False), transforms=None)
    flower = _fit(Flower(num_nodes=NODES, node_engine=Batched(check=False)), transforms=None)
    assert _gap(flower, batched) == 0.0


def test_a_node_that_answers_no_prediction_reveals_no_personal_value():
    """With ``allow_predict=False`` (fedgp's app's default) a node trains and scores its owners under
    their own noise but refuses a ``personal`` task, whose answer is an owner's own state; with a
    strategy that keeps nothing on the nodes the same node still answers it (the shared state)."""
    from fedgp.flower import client_app
    from fedgp.flower.grid_engine import GridEngine
    from fedgp.flower.local import LocalGrid

    federation = two_noise_levels(n=25, owners=OWNERS)
    spec = fedgp.GPSpec().for_data(list(federation))
    shards = [list(federation)[: OWNERS // 2], list(federation)[OWNERS // 2 :]]
    app = client_app(lambda ctx: (spec, shards[ctx.node_config["partition-id"]]), allow_predict=False)
    contexts = {
        node: Context(
            run_id=0, node_id=node, node_config={"partition-id": i}, state=RecordDict(), run_config={}
        )
        for i, node in enumerate((1000, 1001))
    }
    grid = LocalGrid({node: (app, context) for node, context in contexts.items()})
    for strategy in (PERSONAL, FGPR(local_steps=2)):
        engine = GridEngine(grid, spec)
        result = fedgp.fit(
            spec, None, strategy, rounds=2, engine=engine, seed=0, transforms=None, callbacks=QUIET
        )
        assert len(result.evaluate()) == OWNERS
        if strategy.personal:
            assert all(kept_memory(context) for context in contexts.values())
            with pytest.raises(
                fedgp.EngineError, match="does not reveal its owners' personal.*allow-predict"
            ):
                result.client_state(0)
        else:
            assert NOISE in result.client_state(0)
