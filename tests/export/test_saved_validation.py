"""Files that validate what they hold (issue 51, item 5): a file without a key is sealed with a SHA-256
anyone can recompute, so a forger can reseal whatever they wrote. Every state it holds is checked at
load as a client's reply is (the fields ``state_fields`` declares: float64, the spec's shapes, finite,
within each constraint), the server state against the structure the strategy gives it, the history
and the header against their schema. On 47441d7 each crafted file below loaded, and most predicted.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load as load_payload

import fedgp
from fedgp.errors import CheckpointError, EngineError, FileFormatError
from fedgp.messages.container import HEADER, unseal
from fedgp.strategies import FGPR, IFCA, FederatedClustering
from tests.export.test_file_bounds import refused, reseal

NOISE = "likelihood.noise_covar.noise"
SCALE = "covar_module.outputscale"
LENGTH = "covar_module.base_kernel.lengthscale"
QUIET = [fedgp.run.Progress(False)]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """FGPR (with a checkpoint), IFCA and Federated-Clustering (one state per client) results, saved,
    and the draws they were fitted on."""
    folder = tmp_path_factory.mktemp("validation")
    draws = fedgp.synthetic.gp_federation(num_clients=3, n=12, d=2, seed=0)
    spec, fed = draws.spec, draws.federation
    checkpoint = fedgp.run.Checkpointing(folder / "run.ckpt", every=1)
    out = {"ckpt": folder / "run.ckpt", "draws": draws}
    for name, strategy in {
        "fgpr": FGPR(local_steps=1),
        "ifca": IFCA(num_clusters=2, local_steps=1),
        "personal": FederatedClustering(lr=0.05),
    }.items():
        callbacks = [*QUIET, checkpoint] if name == "fgpr" else QUIET
        result = fedgp.fit(spec, fed, strategy, engine="sequential", rounds=2, callbacks=callbacks)
        out[name] = result.save(folder / f"{name}.fgp")
    return out


def craft(src, dst, edit):
    """``src`` changed by ``edit(header, tensors)`` and sealed again with a recomputed SHA-256."""
    seen = {}
    return reseal(
        src, dst, header_fn=lambda h: seen.update(header=h), tensor_fn=lambda t: edit(seen["header"], t)
    )


def _entry(state, name):
    """The tensor name of hyper-parameter ``name`` in an encoded HyperState."""
    return state["__hyperstate__"][name]["__tensor__"]


def _theta(header):
    return header["server_state"]["params"]["theta"]


def _set(name_of, value):
    """An edit setting the tensor ``name_of(header)`` to ``value(old tensor)``."""

    def edit(header, tensors):
        key = name_of(header)
        tensors[key] = value(tensors[key])

    return edit


def _drop_history(header, tensors):
    """No rows, and no kept states (with their tensors): the table a forger empties consistently."""
    states = header.pop("history_states")
    for name in (states["states"]["__hyperstate__"][n]["__tensor__"] for n in (NOISE, SCALE, LENGTH)):
        del tensors[name]
    header["history"].update(index=[], data=[], range=[0, 0, 1])


def _reverse_rounds(header, tensors):
    header["history"]["data"].reverse()
    header["history"].update(index=header["history"]["index"][::-1], range=None)
    header["history_states"]["rounds"].reverse()


def _more_clusters(header, tensors):
    """IFCA of 2 clusters holding 3 cluster states."""
    for name in (NOISE, SCALE, LENGTH):
        key = _entry(header["server_state"]["params"]["states"], name)
        tensors[key] = torch.cat([tensors[key], tensors[key][:, :1]], dim=1)


def _fewer_personal_states(header, tensors):
    """Federated-Clustering over 3 clients holding 2 personal states."""
    for name in (NOISE, SCALE, LENGTH):
        key = _entry(header["server_state"]["params"]["states"], name)
        tensors[key] = tensors[key][:2]


def _f64(*values):
    return lambda old: torch.tensor(values, dtype=torch.float64).reshape(old.shape)


def theta(name):
    return lambda h: _entry(_theta(h), name)


def kept(name):
    return lambda h: _entry(h["history_states"]["states"], name)


def states(name):
    return lambda h: _entry(h["server_state"]["params"]["states"], name)


def slot(which, name):
    return lambda h: h["server_state"]["params"]["slots"]["__dict__"][which]["__dict__"][name]["__tensor__"]


def _assignment(h):
    return h["server_state"]["params"]["assignment"]["__tensor__"]


def _float32(t):
    return t.float()


THETA, KEPT = "field 'server_state.theta.", "field 'history_states."
#: name: (which saved file, the edit, what load says). Each of these loaded on 47441d7.
CRAFTED = {
    "noise -1": ("fgpr", _set(theta(NOISE), _f64(-1.0)), f"{THETA}{NOISE}' is -1, outside its domain"),
    "initial noise -1": (
        "fgpr",
        _set(lambda h: f"spec/initial/{NOISE}", _f64(-1.0)),
        f"field 'spec.initial.{NOISE}' is -1, outside its domain",
    ),
    "noise 0": ("fgpr", _set(theta(NOISE), _f64(0.0)), f"{THETA}{NOISE}' is 0, outside its domain"),
    "lengthscale 0": ("fgpr", _set(theta(LENGTH), _f64(0.0, 1.0)), f"{THETA}{LENGTH}' is 0, outside"),
    "lengthscale NaN": ("fgpr", _set(theta(LENGTH), _f64(math.nan, 1.0)), f"{THETA}{LENGTH}' is not finite"),
    "outputscale inf": ("fgpr", _set(theta(SCALE), _f64(math.inf)), f"{THETA}{SCALE}' is not finite"),
    "float32 state": ("fgpr", _set(theta(NOISE), _float32),
                      f"{THETA}{NOISE}' has dtype torch.float32, expected torch.float64"),
    "optimiser moment NaN": ("fgpr", _set(slot("m", NOISE), _f64(math.nan)),
                             f"server_state.slots['m']['{NOISE}'] holds a NaN or infinite value"),
    "kept state negative": ("fgpr", _set(kept(NOISE), lambda t: -t), f"{KEPT}{NOISE}' is -0."),
    "kept state float32": ("fgpr", _set(kept(SCALE), _float32), f"{KEPT}{SCALE}' has dtype torch.float32"),
    "empty history": ("fgpr", _drop_history, "history has no rows"),
    "rounds decreasing": ("fgpr", _reverse_rounds, "history column 'round' must hold increasing round"),
    "missing field": ("fgpr", lambda h, t: h.pop("feature_names"), "the header lacks ['feature_names']"),
    "unknown tensor": ("fgpr", lambda h, t: t.update({"99": torch.ones(2, dtype=torch.float64)}),
                       "tensor '99' is not one a saved result holds"),
    "unknown transform tensor": ("fgpr", lambda h, t: t.update({"transform/z_scale": torch.ones(())}),
                                 "tensor 'transform/z_scale' is not one a saved result holds"),
    "3 clusters of 2": ("ifca", _more_clusters,
                        "server_state.states holds states of batch [1, 3]; this strategy keeps [1, 2]"),
    "assignment of 2 clients": ("ifca", _set(_assignment, lambda t: t[:, :2]),
                                "server_state.assignment is a torch.int64 tensor of shape [1, 2]; this "
                                "strategy keeps a torch.int64 tensor of shape [1, 3]"),
    "2 personal states of 3 clients": ("personal", _fewer_personal_states,
                                       "server_state.states holds states of batch [2]; this strategy keeps "
                                       "[3]"),
    "personal state below its constraint": ("personal", _set(states(NOISE), lambda t: t - 10),
                                            f"field 'server_state.states.{NOISE}' is"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_a_resealed_file_holding_nonsense_is_refused_at_load_naming_the_field(saved, tmp_path, case):
    source, edit, phrase = CRAFTED[case]
    path = craft(saved[source], tmp_path / "crafted.fgp", edit)
    refused(path, phrase)


def test_the_untouched_files_load_and_predict(saved):
    draws = saved["draws"]
    """The control: each source file, resealed unchanged, loads and predicts finitely."""
    client = draws.federation[0]
    for name in ("fgpr", "ifca", "personal"):
        mean, variance = fedgp.load(saved[name]).predict(client.X, client)
        assert torch.isfinite(mean).all() and torch.isfinite(variance).all() and (variance > 0).all()


def test_saving_a_history_load_would_refuse_is_refused(saved):
    draws = saved["draws"]
    import dataclasses

    result = fedgp.fit(draws.spec, draws.federation, FGPR(local_steps=1), rounds=1, callbacks=QUIET)
    with pytest.raises(fedgp.errors.InputError, match="cannot save this result: history has no rows"):
        dataclasses.replace(result, history=result.history.iloc[:0]).save(saved["fgpr"].parent / "x.fgp")


# -- checkpoints, checked against the state the resuming run starts from ---------------------------
def _resume(draws, path):
    return fedgp.fit(
        draws.spec, draws.federation, FGPR(local_steps=1), engine="sequential", rounds=3,
        callbacks=[*QUIET, fedgp.run.Checkpointing(path, resume=True, every=None)],
    )  # fmt: skip


CHECKPOINTS = {
    "noise -1": (_set(theta(NOISE), _f64(-1.0)), f"{THETA}{NOISE}' is -1, outside its domain"),
    "float32 moment": (_set(slot("v", SCALE), _float32),
                       f"server_state.slots['v']['{SCALE}'] is a torch.float32"),
    "completed rounds not the history's": (lambda h, t: h.update(completed_rounds=1),
                                           "completed_rounds is 1, but its history's last round is 2"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CHECKPOINTS))
def test_a_resealed_checkpoint_holding_nonsense_is_refused_on_resume(saved, tmp_path, case):
    draws = saved["draws"]
    edit, phrase = CHECKPOINTS[case]
    path = craft(saved["ckpt"], tmp_path / "run.ckpt", edit)
    with pytest.raises(CheckpointError) as info:
        _resume(draws, path)
    assert str(path) in str(info.value) and phrase in str(info.value), info.value


def test_an_untouched_checkpoint_resumes(saved, tmp_path):
    draws = saved["draws"]
    path = tmp_path / "run.ckpt"
    path.write_bytes(saved["ckpt"].read_bytes())
    assert len(_resume(draws, path).history) == 3


# -- any one value changed: refused at load, or a model that predicts finitely -----------------------
VALUES = st.sampled_from(
    [-1.0, 0.0, -0.0, math.nan, math.inf, -math.inf, -1e-300, 1e-300, 5e-5, 1e150]
) | st.floats(-1e3, 1e3, allow_nan=False)


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_any_single_value_changed_is_refused_or_predicts_finitely(saved, tmp_path, data):
    draws = saved["draws"]
    source = saved[data.draw(st.sampled_from(["fgpr", "ifca", "personal"]))]
    tensors = load_payload(unseal(source.read_bytes(), str(source)))
    tensors.pop(HEADER)
    name = data.draw(
        st.sampled_from(sorted(k for k, v in tensors.items() if v.is_floating_point() and v.numel()))
    )
    position = data.draw(st.integers(0, tensors[name].numel() - 1))
    value = data.draw(VALUES)

    def edit(header, tensors):
        changed = tensors[name].clone().reshape(-1)
        changed[position] = value
        tensors[name] = changed.reshape(tensors[name].shape)

    path = craft(source, tmp_path / f"v{data.draw(st.integers(0, 10**6))}.fgp", edit)
    try:
        loaded = fedgp.load(path)
    except FileFormatError as err:
        assert str(path) in str(err), err
        return
    client = draws.federation[1]
    try:
        mean, variance = loaded.predict(client.X, client, observation_noise=True)
    except EngineError as err:  # a scale of 1e-300 is a model of data that span 1e-300: data outside
        assert "the data transforms map" in str(err), err  # its box are refused, saying so
        return
    assert torch.isfinite(mean).all() and torch.isfinite(variance).all(), (name, position, value)


def test_docs_say_which_guarantees_a_file_has_with_and_without_a_key():
    from pathlib import Path

    text = Path(__file__).parents[2].joinpath("docs", "guarantees.md").read_text()
    assert "validated against nonsense" in text and "authentic" in text
