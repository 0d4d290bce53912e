"""Crafted files whose seal is recomputed (the payload altered, then sealed again with fedgp's own
``seal``): every field is checked against fedgp.models.limits before anything is built, and every
refusal is a FileFormatError (CheckpointError for checkpoints) naming the file and the field."""

from __future__ import annotations

import json
import math
import resource

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load as load_payload
from safetensors.torch import save as save_payload

import fedgp
from fedgp.errors import CheckpointError, CodecError, FedGPError, FileFormatError
from fedgp.messages.codec import decode, encode
from fedgp.messages.container import HEADER, seal, unseal
from fedgp.models import limits
from fedgp.run.checkpoint import load_checkpoint
from fedgp.strategies import FGPR, IFCA


@pytest.fixture(scope="module")
def draws():
    return fedgp.synthetic.gp_federation(num_clients=3, n=12, d=2, seed=0)


@pytest.fixture(scope="module")
def files(draws, tmp_path_factory):
    folder = tmp_path_factory.mktemp("bounds")
    result = fedgp.fit(
        draws.spec,
        draws.federation,
        FGPR(local_steps=1),
        engine="sequential",
        rounds=2,
        callbacks=[fedgp.run.Checkpointing(folder / "run.ckpt", every=1)],
    )
    return result, result.save(folder / "model.fgp"), folder / "run.ckpt"


def reseal(src, dst, header_fn=None, tensor_fn=None, text_fn=None, key=None):
    """``src`` with its header and tensors changed, sealed again as fedgp seals (a crafted file)."""
    tensors = load_payload(unseal(src.read_bytes(), str(src)))
    header = json.loads(tensors.pop(HEADER).numpy().tobytes().decode())
    if header_fn:
        header_fn(header)
    if tensor_fn:
        tensor_fn(tensors)
    text = json.dumps(header, allow_nan=True)
    if text_fn:
        text = text_fn(text)
    own = {k: v.contiguous().clone() for k, v in tensors.items()}
    own[HEADER] = torch.frombuffer(bytearray(text.encode()), dtype=torch.uint8)
    dst.write_bytes(seal(save_payload(own), key))
    return dst


def refused(path, *phrases, error=FileFormatError, load=fedgp.load):
    with pytest.raises(error) as info:
        load(path)
    assert type(info.value) in (error, FileFormatError, CheckpointError)
    message = str(info.value)
    assert str(path) in message, message
    for phrase in phrases:
        assert phrase in message, message
    return message


def _rbf(header):
    return header["spec"]["kernel"]["base_kernel"]


# -- each case of issue 35 -----------------------------------------------------------------------
@pytest.mark.parametrize("value", [1e9, 10**9, -1, 0, 2.0, "2", True])
def test_ard_num_dims_outside_its_range_is_refused_before_allocating(files, tmp_path, value):
    path = reseal(files[1], tmp_path / "f.fgp", lambda h: _rbf(h).update(ard_num_dims=value))
    refused(path, "spec.kernel.base_kernel.ard_num_dims must be an integer in [1, 100000]")


@pytest.mark.parametrize("shape", [[1e5, 1e5], [100_000, 100_000], [0], [-1], [2, 2, 2, 2, 2], "3"])
def test_a_huge_or_malformed_batch_shape_is_refused(files, tmp_path, shape):
    path = reseal(files[1], tmp_path / "f.fgp", lambda h: h["spec"]["likelihood"].update(batch_shape=shape))
    refused(path, "spec.likelihood.batch_shape")


def test_a_batch_shape_times_ard_dims_is_bounded(files, tmp_path):
    path = reseal(
        files[1], tmp_path / "f.fgp", lambda h: _rbf(h).update(ard_num_dims=100_000, batch_shape=[1000])
    )
    refused(path, "spec.kernel.base_kernel implies a parameter of 100000000 numbers")


def test_json_nested_100000_deep_is_refused_without_recursion(files, tmp_path):
    deep = "[" * 100_000 + "]" * 100_000
    path = reseal(files[1], tmp_path / "f.fgp", text_fn=lambda t: t[:-1] + f', "x": {deep}}}')
    refused(path, f"nests 100001 deep; the limit is {limits.MAX_JSON_DEPTH}")
    for load in (load_checkpoint,):
        ckpt = reseal(files[2], tmp_path / "c.ckpt", text_fn=lambda t: t[:-1] + f', "x": {deep}}}')
        refused(ckpt, "nests", error=CheckpointError, load=load)


def test_brackets_inside_strings_do_not_count_as_nesting():
    limits.check_json_depth(b'{"a": "[[[[[[[[[[' + b"[" * 1000 + b'\\"]"}')
    with pytest.raises(FileFormatError, match="nests 101 deep"):
        limits.check_json_depth(b"[" * 101 + b"]" * 101)


@pytest.mark.parametrize("text", ["1e999", "-1e999", '"zero"', "1.5", "true", "null", "NaN"])
def test_a_seed_that_is_not_an_integer_is_refused_by_name(files, tmp_path, text):
    path = reseal(files[1], tmp_path / "f.fgp", text_fn=lambda t: t.replace('"seed": 0', f'"seed": {text}'))
    assert f'"seed": {text}'.encode() in path.read_bytes()
    refused(path, "seed must be an integer")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.complex64, torch.int8])
def test_state_tensors_of_other_dtypes_are_refused(files, tmp_path, dtype):
    def change(tensors):
        tensors["spec/initial/covar_module.outputscale"] = tensors[
            "spec/initial/covar_module.outputscale"
        ].to(dtype)

    path = reseal(files[1], tmp_path / "f.fgp", tensor_fn=change)
    refused(path, "'spec/initial/covar_module.outputscale' is " + str(dtype).removeprefix("torch."))
    ckpt = reseal(
        files[2], tmp_path / "c.ckpt", tensor_fn=lambda t: t.update({k: v.to(dtype) for k, v in t.items()})
    )
    refused(ckpt, str(dtype).removeprefix("torch."), error=CheckpointError, load=load_checkpoint)


def test_a_string_where_a_boolean_belongs_is_refused(files, tmp_path):
    path = reseal(
        files[1],
        tmp_path / "f.fgp",
        lambda h: h["transforms"]["settings"].update({"transform/y_local": "false"}),
    )
    refused(path, "transforms.settings['transform/y_local'] must be true or false, got 'false'")
    linear = {"class": "LinearMean", "input_size": 2, "bias": "false", "batch_shape": []}
    path = reseal(files[1], tmp_path / "g.fgp", lambda h: h["spec"].update(mean=linear))
    refused(path, "spec.mean.bias must be true or false")
    path = reseal(files[1], tmp_path / "h.fgp", lambda h: h["strategy"]["params"].update(local_steps="1"))
    refused(path, "local_steps must be an int")
    # A settings dataclass whose own checks would take any value for a bool field: the codec refuses.
    config = encode(IFCA(), None)
    config["params"]["weighted"] = "false"
    with pytest.raises(CodecError, match="IFCA: field 'weighted' must be a bool, got 'false'"):
        decode(config)


@pytest.mark.parametrize("value", [-1.0, 0.0, math.inf, math.nan])
def test_a_scale_that_is_not_positive_and_finite_is_refused(files, tmp_path, value):
    def change(tensors):
        tensors["transform/y_scale"] = torch.tensor(value, dtype=torch.float64)

    refused(reseal(files[1], tmp_path / "f.fgp", tensor_fn=change), "'transform/y_scale'")


def test_a_roster_of_7_ids_over_5_sizes_is_refused(files, tmp_path):
    def header(h):
        h["roster"]["ids"] = [f"c{i}" for i in range(7)]

    def tensors(t):
        for name in ("sizes", "n_test", "dims"):
            t[f"roster/{name}"] = torch.ones(5, dtype=torch.long)

    path = reseal(files[1], tmp_path / "f.fgp", header, tensors)
    refused(path, "tensor 'roster/sizes' must hold one integer per client id (7)")
    repeated = reseal(
        files[1], tmp_path / "g.fgp", lambda h: h["roster"]["ids"].__setitem__(1, h["roster"]["ids"][0])
    )
    refused(repeated, "roster.ids repeats a client id")


def test_a_checkpoint_with_another_state_type_is_refused_on_resume(files, draws, tmp_path):
    """Issue 35: a crafted state type gave a bare AttributeError when the run resumed."""
    other = encode(fedgp.run.checkpoint.Checkpoint(0, None, []), None)
    path = reseal(files[2], tmp_path / "run.ckpt", lambda h: h.update(server_state=other))
    assert isinstance(load_checkpoint(path).server_state, fedgp.run.checkpoint.Checkpoint)
    with pytest.raises(
        CheckpointError, match="server_state is a Checkpoint, but this run's strategy keeps a"
    ):
        fedgp.fit(
            draws.spec, draws.federation, FGPR(local_steps=1), engine="sequential", rounds=3,
            callbacks=[fedgp.run.Checkpointing(path, every=1, resume=True)],
        )  # fmt: skip
    for text in ('"two"', "-1", "1e999", "true"):
        bad = reseal(files[2], tmp_path / "c.ckpt", text_fn=_replace('"completed_rounds": 2', text))
        refused(bad, "completed_rounds must be an integer", error=CheckpointError, load=load_checkpoint)


def _replace(field, text):
    return lambda header: header.replace(field, field.rsplit(" ", 1)[0] + " " + text)


# -- any mutation: loads, or is refused naming the file ---------------------------------------------
HOSTILE = st.sampled_from(
    [1e9, 10**12, -1, 0, 1.5, math.inf, -math.inf, math.nan, "zero", "false", True, False, None, [], {},
     [1e5, 1e5], [[[[]]]], {"class": "RBFKernel"}, {"type": "os:system", "params": {}},
     {"__tensor__": "nope"}]
)  # fmt: skip


def _leaves(value, path=()):
    if isinstance(value, dict):
        yield path
        for k, v in value.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(value, list):
        yield path
        for i, v in enumerate(value[:4]):
            yield from _leaves(v, (*path, i))
    else:
        yield path


def _set(header, path, value):
    node = header
    try:
        for step in path[:-1]:
            node = node[step]
        node[path[-1]] = value
    except (KeyError, IndexError, TypeError):  # an earlier edit replaced a node above this one
        pass


def _mutate_tensor(tensors, name, how):
    t = tensors[name]
    tensors[name] = {
        "float16": lambda: t.to(torch.float16),
        "int32": lambda: t.to(torch.int32),
        "bool": lambda: t.to(torch.bool),
        "negate": lambda: ~t if t.dtype == torch.bool else -t,
        "double": lambda: t if t.dtype == torch.bool else 2 * t,
        "huge": lambda: t * 1e300 if t.is_floating_point() else t * 2**40,
        "longer": lambda: torch.cat([t.reshape(-1), t.reshape(-1)]),
        "scalar": lambda: t.reshape(-1)[:1].reshape(()) if t.numel() else t,
        "empty": lambda: t.reshape(-1)[:0],
        "drop": lambda: None,
    }[how]()
    if tensors[name] is None:
        del tensors[name]


def _check_any(path, load, error, use):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        loaded = load(path)
    except FileFormatError as err:
        assert isinstance(err, error) and str(path) in str(err), err
        return
    finally:
        assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 512 * 1024  # KiB: < 0.5 GiB
    use(loaded)


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_any_resealed_mutation_loads_or_is_refused_naming_the_file(files, draws, tmp_path, data):
    result, model, checkpoint = files
    src, load, error = data.draw(
        st.sampled_from(
            [(model, fedgp.load, FileFormatError), (checkpoint, load_checkpoint, CheckpointError)]
        )
    )
    tensors = load_payload(unseal(src.read_bytes(), str(src)))
    header = json.loads(tensors.pop(HEADER).numpy().tobytes().decode())
    edits = []
    for _ in range(data.draw(st.integers(1, 3))):
        if data.draw(st.booleans()):
            where = data.draw(
                st.sampled_from([p for p in _leaves(header) if p and p[0] not in ("format", "version")])
            )
            edits.append(("header", where, data.draw(HOSTILE)))
        else:
            edits.append(("tensor", data.draw(st.sampled_from(sorted(tensors))), data.draw(
                st.sampled_from(["float16", "int32", "bool", "negate", "double", "huge", "longer", "scalar",
                                 "empty", "drop"]))))  # fmt: skip

    def header_fn(h):
        for kind, where, value in edits:
            if kind == "header":
                _set(h, where, value)

    def tensor_fn(t):
        for kind, name, how in edits:
            if kind == "tensor" and name in t:
                _mutate_tensor(t, name, how)

    path = reseal(src, tmp_path / f"m{data.draw(st.integers(0, 10**6))}{src.suffix}", header_fn, tensor_fn)

    def use(loaded):
        if src is model:  # it predicts, or says why not with a fedgp error
            client = draws.federation[0]
            try:
                loaded.predict(client.X, client)
            except FedGPError:
                pass

    _check_any(path, load, error, use)


class _Keeper(fedgp.run.Callback):
    checkpoint_key = "keeper"

    def state(self):
        return {"seen": 1}

    def load_state(self, state):
        self.seen = state["seen"]


def test_a_crafted_callback_state_is_refused_naming_the_callback(draws, tmp_path):
    path = tmp_path / "run.ckpt"
    fit = dict(engine="sequential", rounds=3)
    fedgp.fit(
        draws.spec,
        draws.federation,
        FGPR(local_steps=1),
        **fit,
        callbacks=[_Keeper(), fedgp.run.Checkpointing(path)],
    )
    reseal(path, path, lambda h: h["callbacks"]["__dict__"].update(keeper=5))
    with pytest.raises(CheckpointError, match=r"callbacks\['keeper'\] is not a state _Keeper can take back"):
        fedgp.fit(
            draws.spec, draws.federation, FGPR(local_steps=1), **fit,
            callbacks=[_Keeper(), fedgp.run.Checkpointing(path, resume=True)],
        )  # fmt: skip


@pytest.mark.parametrize("value", [1.5, "false", None])
def test_a_server_state_that_is_not_a_state_is_refused_at_load_not_at_predict(files, tmp_path, value):
    path = reseal(files[1], tmp_path / "f.fgp", lambda h: h.update(server_state=value))
    refused(path, "f.fgp")
    theta = reseal(files[1], tmp_path / "g.fgp", lambda h: h["server_state"]["params"].update(theta=0))
    refused(theta, "field 'theta' must be a HyperState, got 0")
