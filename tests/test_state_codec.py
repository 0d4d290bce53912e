"""The one codec for server states in fedgp's files (checkpoints and saved results)."""

import numpy as np
import pytest
import torch

import fedgp
from fedgp import state_codec
from fedgp.strategies.clustered.state import ClusteredState


def test_a_tree_of_every_kind_round_trips_exactly():
    hs = fedgp.GPSpec().initial_state().expand(2)
    tree = {
        "state": ClusteredState(hs, torch.tensor([0, -1]), torch.tensor([1.5])),
        (1, "a"): [np.arange(3.0), np.float64(2.5), None, True, "x"],
    }
    tensors: dict = {}
    encoded = state_codec.encode(tree, tensors, "tree", prefix="t/")
    assert all(k.startswith("t/") for k in tensors)
    back = state_codec.decode(encoded, tensors)
    assert back[(1, "a")][0].tolist() == [0.0, 1.0, 2.0] and back[(1, "a")][1:] == [2.5, None, True, "x"]
    state = back["state"]
    assert isinstance(state, ClusteredState)
    for k, v in hs.items():
        assert torch.equal(state.states[k], v)
    assert state.states.event_shapes == hs.event_shapes


def test_what_cannot_be_written_is_named():
    with pytest.raises(TypeError, match=r"at tree\[0\]"):
        state_codec.encode([object()], {}, "tree")


def test_a_missing_tensor_is_named():
    with pytest.raises(state_codec.StateCodecError, match="tensor '7'"):
        state_codec.decode({"__tensor__": "7"}, {})


@pytest.mark.parametrize(
    "name",
    [
        "os:system",
        "fedgp.fit:os",
        "fedgp.fit:np.ndarray",
        "fedgp.state_codec:dataclasses",
        "fedgp.nope:X",
    ],
)
def test_only_fedgp_dataclasses_can_be_named(name):
    with pytest.raises(state_codec.StateCodecError, match="not an imported fedgp dataclass"):
        state_codec._resolve_type(name)
    assert (
        state_codec._resolve_type("fedgp.strategies.clustered.state:ClusteredState").__name__
        == "ClusteredState"
    )
