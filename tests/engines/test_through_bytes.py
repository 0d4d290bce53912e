"""Every message of every strategy through bytes and back: the same run, bit for bit.

With ``loopback=True`` an in-process engine serialises each participant's message and each reply
(safetensors + JSON, never pickle) and rebuilds them from the bytes before use. If a strategy
smuggled anything but records across the boundary, or the format lost a bit, these runs would
differ. The bytes the history reports without loopback (computed from one representative message
per round) must equal the bytes that actually crossed with it.
"""

import pandas as pd
import pytest
import torch

import fedgp
from tests.pins.cases import zoo

ZOO = zoo()


@pytest.mark.parametrize("engine", ["sequential", "batched"])
@pytest.mark.parametrize("name", sorted(ZOO))
def test_every_message_survives_bytes_bit_for_bit(name, engine):
    data, spec, strategy, rounds = ZOO[name]
    runs = [
        fedgp.fit(
            spec,
            data.federation,
            strategy,
            rounds=rounds,
            engine=fedgp.engines.ENGINES[engine](loopback=loopback),
            seed=11,
        )
        for loopback in (False, True)
    ]
    direct, wired = runs
    for key in direct.state:
        assert torch.equal(direct.state[key], wired.state[key]), key
    pd.testing.assert_frame_equal(direct.history, wired.history, check_exact=True)
    assert (direct.history["bytes_down"] > 0).all() and (direct.history["bytes_up"] > 0).all()
    if data.federation.has_test:
        pd.testing.assert_frame_equal(direct.evaluate(), wired.evaluate(), check_exact=True)


@pytest.mark.parametrize("preset", ["fedavg", "ifca", "oracle", "one_shot", "two_phase"])
def test_every_clustered_preset_survives_bytes(preset):
    from fedgp.strategies import clustered as C

    data, spec, _, _ = ZOO["linear_one_shot"]
    k = 2
    states = spec.initial_state().expand(k).clone()
    strategy = {
        "fedavg": C.fedavg(lr=0.1),
        "ifca": C.ifca(k, lr=0.1),
        "oracle": C.oracle(states, lr=0.1),
        "one_shot": C.one_shot(k, lr=0.1),
        "two_phase": C.two_phase(k, lr=0.1, phase1=C.MomentDescentInit(num_anchors=3, anchor_pool="all")),
    }[preset]
    rounds = strategy.init_rounds + 2
    runs = [
        fedgp.fit(
            spec,
            data.federation,
            strategy,
            engine=fedgp.engines.Batched(loopback=loopback),
            rounds=rounds,
            seed=3,
        )
        for loopback in (False, True)
    ]
    for key in runs[0].state:
        assert torch.equal(runs[0].state[key], runs[1].state[key]), key
    pd.testing.assert_frame_equal(runs[0].history, runs[1].history, check_exact=True)
