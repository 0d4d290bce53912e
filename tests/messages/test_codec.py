"""The one codec for configs, server states and histories (messages, checkpoints and saved results)."""

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

import fedgp
from fedgp.errors import CodecError, InputTypeError
from fedgp.messages import codec
from fedgp.strategies.clustered.state import ClusteredState


def _tree():
    hs = fedgp.GPSpec().initial_state().expand(2)
    tree = {
        "state": ClusteredState(hs, torch.tensor([0, -1]), torch.tensor([1.5])),
        (1, "a"): [np.arange(3.0), np.float64(2.5), None, True, "x", (2, torch.float32)],
    }
    return hs, tree


def _check(back, hs):
    assert back[(1, "a")][0].tolist() == [0.0, 1.0, 2.0] and isinstance(back[(1, "a")][0], np.ndarray)
    assert back[(1, "a")][1:] == [2.5, None, True, "x", (2, torch.float32)]
    state = back["state"]
    assert isinstance(state, ClusteredState)
    for k, v in hs.items():
        assert torch.equal(state.states[k], v)
    assert state.states.event_shapes == hs.event_shapes
    assert torch.equal(state.assignment, torch.tensor([0, -1]))
    assert torch.equal(state.objective, torch.tensor([1.5]))


def test_a_tree_of_every_kind_round_trips_exactly():
    hs, tree = _tree()
    kept = torch.tensor([9.0])
    tensors: dict = {"0": kept}
    encoded = codec.encode(tree, tensors, "tree")
    assert tensors["0"] is kept  # new tensors never overwrite the table's entries
    assert len(tensors) == 1 + len(hs) + 3
    json.dumps(encoded, allow_nan=False)  # plain JSON
    _check(codec.decode(encoded, tensors), hs)


def test_without_a_table_tensors_are_written_inline_and_round_trip():
    hs, tree = _tree()
    encoded = json.loads(json.dumps(codec.encode(tree, where="tree"), allow_nan=False))
    assert encoded["__items__"][0][0] == "state"
    assert encoded["__items__"][0][1]["type"] == "fedgp.strategies.clustered.state:ClusteredState"
    assert encoded["__items__"][0][1]["params"]["assignment"] == {
        "__tensor__": {"data": [0, -1], "dtype": "int64", "shape": [2]}
    }
    _check(codec.decode(encoded), hs)


def test_what_cannot_be_written_is_named():
    with pytest.raises(TypeError, match=r"at tree\[0\]"):
        codec.encode([object()], {}, "tree")
    with pytest.raises(TypeError, match=r"at tree\['k'\]"):
        codec.encode({"k": object()}, where="tree")


def test_a_missing_tensor_is_named():
    with pytest.raises(CodecError, match="tensor '7'"):
        codec.decode({"__tensor__": "7"}, {})
    with pytest.raises(CodecError, match="tensor '7'"):
        codec.decode({"__tensor__": "7"})


@pytest.mark.parametrize(
    "name",
    [
        "os:system",
        "fedgp.run.result:os",
        "fedgp.run.result:np.ndarray",
        "fedgp.messages.codec:dataclasses",
        "fedgp.messages.codec:HyperState",  # a fedgp class, but no dataclass
        "fedgp.nope:X",
    ],
)
def test_only_fedgp_dataclasses_can_be_named(name):
    with pytest.raises(CodecError, match="not a registered or imported fedgp dataclass"):
        codec._resolve_type(name)
    with pytest.raises(CodecError, match="not a registered or imported fedgp dataclass"):
        codec.decode({"type": name, "params": {}})
    assert codec._resolve_type("fedgp.strategies.clustered.state:ClusteredState").__name__ == "ClusteredState"


def test_naming_a_type_imports_nothing():
    # A fedgp Configurable whose module is not imported is refused, and its module stays unimported.
    code = (
        "import sys, fedgp\n"
        "from fedgp.errors import CodecError\n"
        "from fedgp.messages import decode\n"
        "assert 'fedgp.experiments.table1' not in sys.modules\n"
        "try:\n"
        "    decode({'type': 'fedgp.experiments.table1:WeightedFGPR', 'params': {}})\n"
        "except CodecError as err:\n"
        "    assert 'not a registered or imported fedgp dataclass' in str(err), err\n"
        "else:\n"
        "    raise SystemExit('decoded')\n"
        "assert 'fedgp.experiments.table1' not in sys.modules\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


@dataclasses.dataclass
class _UserState:
    w: torch.Tensor
    note: str = "x"


def test_registered_user_dataclasses_round_trip_and_others_are_refused():
    value = _UserState(torch.tensor([1.0, 2.0]), "y")
    name = f"{__name__}:_UserState"
    with pytest.raises(CodecError, match="not a registered or imported fedgp dataclass"):
        codec.decode(codec.encode(value))
    assert codec.register_type(_UserState) is _UserState
    assert fedgp.messages.register_type is codec.register_type
    encoded = codec.encode(value)
    assert encoded["type"] == name
    back = codec.decode(encoded)
    assert isinstance(back, _UserState) and torch.equal(back.w, value.w) and back.note == "y"
    with pytest.raises(InputTypeError, match="not a dataclass"):
        codec.register_type(int)
    with pytest.raises(CodecError, match="_UserState"):
        codec.decode({"type": name, "params": {"nope": 1}})
