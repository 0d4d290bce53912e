"""Personal hyper-parameters through the doors that save: ``FitResult.save``/``fedgp.load``,
``Checkpointing(resume=True)`` and the engine's memory read out and put back (issue 52, item 2)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fedgp
from fedgp.data import ClientData
from fedgp.engines.base import Engine
from fedgp.engines.sequential import SequentialEngine
from fedgp.errors import CheckpointError, EngineError, InputError, UnknownClientError
from fedgp.experiments.owner_scale import OWN_SD, scale_spec
from fedgp.messages.container import unpack, unseal
from fedgp.run import Checkpointing, Progress
from fedgp.run.checkpoint import load_checkpoint, save_checkpoint
from fedgp.run.saved import VERSION, WITH_PERSONAL
from fedgp.strategies import FGPR, Asynchronous
from tests.export.test_file_bounds import refused, reseal
from tests.strategies.test_personal_hyperparameters import NOISE, OUTPUTSCALE, two_noise_levels

QUIET = [Progress(False)]
PERSONAL = FGPR(local_steps=2, batch_size=16, personal=("noise", "outputscale"))


def fit(federation, strategy=PERSONAL, engine="sequential", rounds=3, callbacks=(), **options):
    return fedgp.fit(
        fedgp.GPSpec(), federation, strategy=strategy, rounds=rounds, engine=engine, seed=0,
        transforms=None, callbacks=[*QUIET, *callbacks], **options,
    )  # fmt: skip


@pytest.fixture(scope="module")
def fed():
    return two_noise_levels(n=20, owners=4)


@pytest.fixture(scope="module")
def fitted(fed):
    return fit(
        fed, FGPR(local_steps=2, batch_size=16, personal=("noise", "outputscale"), clients_per_round=3)
    )


@pytest.fixture(scope="module")
def saved(fitted, tmp_path_factory):
    return fitted.save(tmp_path_factory.mktemp("personal") / "model.fedgp")


def header_of(path: Path) -> dict:
    header, _ = unpack(
        unseal(path.read_bytes(), str(path)), "fit-result", (VERSION, WITH_PERSONAL), str(path)
    )
    return header


def test_a_loaded_model_predicts_every_owner_bit_for_bit_as_the_fitted_one(fed, fitted, saved):
    loaded = fedgp.load(saved)
    assert header_of(saved)["version"] == WITH_PERSONAL
    kept = fitted.personal_values()
    assert 0 < len(kept) and set(kept) == set(loaded.personal_values())
    X = torch.linspace(0, 4, 7, dtype=torch.float64)[:, None]
    for k, owner in enumerate(fed):
        a, b = fitted.posterior(X, k), loaded.posterior(X, owner)
        assert torch.equal(a.mean, b.mean) and torch.equal(a.variance(True), b.variance(True)), owner.id
        assert loaded.client_state(owner) == fitted.client_state(k)
        noise = loaded.to_gpytorch(owner).likelihood.noise  # the exports condition on it too
        assert torch.equal(noise, fitted.to_gpytorch(k).likelihood.noise)
    differ = {float(v[NOISE]) for v in kept.values()}
    assert len(differ) == len(kept)  # each owner its own: not the shared value read back
    # another id is a new client: the initial values, as the fitted model gives a new client
    new = ClientData(fed[0].X, fed[0].y, id="new")
    assert loaded.client_state(new)[NOISE] == fitted.client_state(new)[NOISE] == fitted.state[NOISE]
    again = fedgp.load(loaded.save(saved.parent / "again.fedgp"))
    assert all(torch.equal(again.personal_values()[o][n], kept[o][n]) for o in kept for n in kept[o])


def test_the_owner_scale_model_round_trips_on_the_batched_engine(tmp_path):
    """``personal=("scale",)`` under each owner's own sd, fitted on the batched engine (its
    predictions computed by its batched path): the loaded model's agree to 1e-12."""
    fed = two_noise_levels(n=20, owners=4)
    result = fedgp.fit(
        scale_spec(), fed, FGPR(local_steps=2, personal=("scale",)), rounds=3, engine="batched", seed=0,
        transforms=OWN_SD, callbacks=QUIET,
    )  # fmt: skip
    loaded = fedgp.load(result.save(tmp_path / "scale.fedgp"))
    X = torch.linspace(0, 4, 5, dtype=torch.float64)[:, None]
    for k, owner in enumerate(fed):
        a, b = result.predict(X, k, observation_noise=True), loaded.predict(X, owner, observation_noise=True)
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_a_plain_model_still_writes_the_earlier_version(fed, tmp_path):
    plain = fit(fed, FGPR(local_steps=2), rounds=1)
    path = plain.save(tmp_path / "plain.fedgp")
    assert header_of(path)["version"] == VERSION and "personal" not in header_of(path)
    assert fedgp.load(path).personal_values() == {}


def _entry(header: dict, name: str) -> dict:
    return header["personal"]["__dict__"][name]["__dict__"]


DAMAGE = ("unknown client", "twice", "shared name", "no name", "nan", "outside", "shape", "rows")


def damaged(kind: str, row: int, saved: Path, where: Path, name: str = NOISE) -> Path:
    """``saved`` with one kind of damage to its owners' personal values, sealed again."""
    header = header_of(saved)
    ids = _entry(header, name)["ids"]
    row = row % len(ids)
    reference = _entry(header, name)["values"]["__tensor__"]

    def edit_header(h):
        entry = _entry(h, name)
        if kind == "unknown client":
            entry["ids"][row] = "stranger"
        elif kind == "twice":
            entry["ids"][row] = entry["ids"][row - 1]
        elif kind in ("shared name", "no name"):
            other = "covar_module.base_kernel.lengthscale" if kind == "shared name" else "smoothness"
            h["personal"]["__dict__"][other] = h["personal"]["__dict__"].pop(name)

    def edit_tensors(t):
        values = t[reference].clone()
        if kind == "nan":
            values[row] = float("nan")
        elif kind == "outside":
            values[row] = -1.0
        elif kind == "shape":
            values = values.reshape(len(ids), -1).expand(len(ids), 2).clone()
        elif kind == "rows":
            values = values[:-1].clone()
        t[reference] = values

    return reseal(saved, where, header_fn=edit_header, tensor_fn=edit_tensors)


@settings(max_examples=25, deadline=None)
@given(kind=st.sampled_from(DAMAGE), row=st.integers(0, 10), name=st.sampled_from((NOISE, OUTPUTSCALE)))
def test_damaged_personal_values_are_refused_naming_file_field_and_client(saved, kind, row, name):
    ids = _entry(header_of(saved), name)["ids"]
    owner = ids[row % len(ids)]
    with tempfile.TemporaryDirectory() as folder:
        path = damaged(kind, row, saved, Path(folder) / "crafted.fedgp", name)
        renamed = {"shared name": "covar_module.base_kernel.lengthscale", "no name": "smoothness"}
        field = renamed.get(kind, name)
        phrases = [f"personal[{field!r}]"]
        phrases += {
            "unknown client": ["client 'stranger' is not one of this model's clients"],
            "twice": [f"client {ids[row % len(ids) - 1]!r} appears twice"],
            "shared name": ["is not one of this model's personal hyper-parameters"],
            "no name": ["is not one of this model's personal hyper-parameters"],
            "nan": ["not finite", f"for client {owner!r}"],
            "outside": ["outside its domain", f"for client {owner!r}"],
            "shape": ["has shape (2,)", f"each of its {len(ids)} clients [{ids[0]!r}"],
            "rows": [f"holds {len(ids) - 1} rows for its {len(ids)} clients"],
        }[kind]
        refused(path, *phrases)


@pytest.mark.parametrize(
    "edit, phrase",
    [
        (lambda h: h.update(version=VERSION), "a file of version 4 holds no owners' personal values"),
        (lambda h: (h.pop("personal"), h.update(version=VERSION)), "holds none of their values"),
        (lambda h: h.pop("personal"), "lacks ['personal']"),
        (lambda h: h["personal"].update({"__dict__": 3}), "personal"),
    ],
)
def test_a_file_without_the_owners_values_is_refused(saved, tmp_path, edit, phrase):
    refused(reseal(saved, tmp_path / "crafted.fedgp", header_fn=edit), phrase)


def test_a_plain_strategys_file_with_personal_values_is_refused(fed, saved, tmp_path):
    def plain(h):
        h["strategy"] = json.loads(json.dumps(FGPR(local_steps=2, batch_size=16).to_config()))

    refused(reseal(saved, tmp_path / "crafted.fedgp", header_fn=plain), "its strategy keeps none")


class Nodes(SequentialEngine):
    """An engine whose clients keep their values where this process cannot read them (as a
    deployment's nodes do): the base :class:`Engine`'s memory doors."""

    read_client_memory = Engine.read_client_memory
    write_client_memory = Engine.write_client_memory


def test_a_deployments_result_refuses_to_save_saying_the_nodes_keep_their_values(fed, tmp_path):
    result = fit(fed, engine=Nodes(fedgp.GPSpec(), list(fed)), rounds=1)
    with pytest.raises(InputError, match="keep their personal hyper-parameters.*cannot read them") as info:
        result.save(tmp_path / "model.fedgp")
    assert "predict on the deployment" in str(info.value)
    assert not (tmp_path / "model.fedgp").exists()
    with pytest.raises(InputError, match="cannot read"):
        result.personal_values()


def test_a_deployments_shrunk_result_refuses_to_save_naming_what_the_owners_keep(fed, tmp_path):
    """Under shrinkage every personal name is shared, its offset kept: the refusal names the offsets
    (before, it named nothing: "personal hyper-parameters () with them")."""
    shrunk = FGPR(local_steps=2, batch_size=16, personal=("noise",), shrink=fedgp.strategies.Shrinkage(0.5))
    result = fit(fed, shrunk, engine=Nodes(fedgp.GPSpec(), list(fed)), rounds=1)
    for call in (lambda: result.save(tmp_path / "model.fedgp"), result.personal_values):
        with pytest.raises(
            InputError, match=r"hyper-parameters \(offset/likelihood\.noise_covar\.noise\) with"
        ):
            call()
    assert not (tmp_path / "model.fedgp").exists()


def test_the_engines_memory_reads_out_and_goes_back_in(fed, fitted):
    engine = fitted.engine
    kept = engine.read_client_memory()
    assert set(kept) <= set(fed.ids) and all(set(v) == {NOISE, OUTPUTSCALE} for v in kept.values())
    owner = next(iter(kept))
    kept[owner][NOISE].fill_(9.0)  # a copy: the engine's own is untouched
    assert engine.read_client_memory()[owner][NOISE] != 9.0
    fresh = SequentialEngine(fedgp.GPSpec(), list(fed))
    fresh.write_client_memory(fitted.personal_values())
    again = fresh.read_client_memory()
    assert set(again) == set(fitted.personal_values())
    with pytest.raises(UnknownClientError, match="'stranger'"):
        fresh.write_client_memory({"stranger": {NOISE: torch.ones(1, dtype=torch.float64)}})
    with pytest.raises(EngineError, match="cannot give"):
        Nodes(fedgp.GPSpec(), list(fed)).write_client_memory(kept)

    class Forgetful(Nodes):
        keeps_client_memory = False  # clients that keep nothing have nothing to read

    assert Forgetful(fedgp.GPSpec(), list(fed)).read_client_memory() == {}


# -- checkpoints -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "strategy",
    [
        FGPR(local_steps=2, batch_size=8, personal=("noise", "outputscale"), clients_per_round=3),
        Asynchronous(
            FGPR(local_steps=2, batch_size=8, personal=("noise",)), buffer=2, speeds=(1.0, 3.0, 0.5, 2.0)
        ),
    ],
    ids=["fgpr", "asynchronous"],
)
def test_a_resumed_run_with_personal_values_ends_as_the_unbroken_one(fed, tmp_path, strategy, monkeypatch):
    path = tmp_path / "run.ckpt"
    full = fit(fed, strategy, rounds=6)
    fit(fed, strategy, rounds=3, callbacks=[Checkpointing(path)])
    resumed = fit(fed, strategy, rounds=6, callbacks=[Checkpointing(path, every=None, resume=True)])
    assert resumed.state == full.state and resumed.history.equals(full.history)
    a, b = full.personal_values(), resumed.personal_values()
    assert set(a) == set(b) and all(torch.equal(a[o][n], b[o][n]) for o in a for n in a[o])
    # a resume that did not give the clients back their values would not
    monkeypatch.setattr(SequentialEngine, "write_client_memory", lambda self, kept: None, raising=False)
    forgot = fit(fed, strategy, rounds=6, callbacks=[Checkpointing(path, every=None, resume=True)])
    assert not forgot.history.equals(full.history)


def test_a_resumed_batched_run_keeps_its_owners_values(fed, tmp_path):
    """The batched engine resumes with its owners' values too (compared to 1e-8, not bit for bit:
    its thread split depends on the machine's load)."""
    path, engine = tmp_path / "run.ckpt", fedgp.engines.Batched(chunk_size=2)
    full = fit(fed, engine=engine, rounds=6)
    fit(fed, engine=engine, rounds=3, callbacks=[Checkpointing(path)])
    resumed = fit(fed, engine=engine, rounds=6, callbacks=[Checkpointing(path, every=None, resume=True)])
    a, b = full.personal_values(), resumed.personal_values()
    assert set(a) == set(b) == set(fed.ids)
    for owner in a:
        for name in a[owner]:
            torch.testing.assert_close(a[owner][name], b[owner][name], rtol=1e-8, atol=1e-10)
    for name in full.state:
        torch.testing.assert_close(full.state[name], resumed.state[name], rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize(
    "edit, phrases",
    [
        (lambda kept: kept.update(stranger=kept.pop(next(iter(kept)))), ["client 'stranger'"]),
        (lambda kept: next(iter(kept.values()))[NOISE].fill_(float("nan")), ["not finite", "for client"]),
        (lambda kept: next(iter(kept.values())).update(smoothness=torch.ones(1)), ["'smoothness' is not"]),
    ],
)
def test_a_damaged_checkpoints_client_memory_is_refused_naming_file_field_and_client(
    fed, tmp_path, edit, phrases
):
    path = tmp_path / "run.ckpt"
    fit(fed, rounds=2, callbacks=[Checkpointing(path)])
    checkpoint = load_checkpoint(path)
    from fedgp.run.kept import read_kept

    names = PERSONAL.personal_names(fedgp.GPSpec())
    kept = read_kept(checkpoint.client_memory, fedgp.GPSpec(), names, fed.ids, "client_memory")
    edit(kept)
    checkpoint.client_memory = kept
    save_checkpoint(path, checkpoint)
    with pytest.raises(CheckpointError) as info:
        fit(fed, rounds=4, callbacks=[Checkpointing(path, every=None, resume=True)])
    for phrase in [str(path), "client_memory[", *phrases]:
        assert phrase in str(info.value), str(info.value)


def test_a_checkpoint_without_the_clients_values_is_refused(fed, tmp_path):
    path = tmp_path / "run.ckpt"
    fit(fed, engine=Nodes(fedgp.GPSpec(), list(fed)), rounds=2, callbacks=[Checkpointing(path)])
    assert load_checkpoint(path).client_memory is None  # the nodes' values: not this process's
    with pytest.raises(CheckpointError, match="holds none"):
        fit(fed, rounds=4, callbacks=[Checkpointing(path, every=None, resume=True)])


# -- the other doors ---------------------------------------------------------------------------------
def test_fedgp_predict_gives_each_owner_of_a_personal_model_its_own_values(tmp_path):
    """The command line reads a model folder of a fit with personal hyper-parameters (written as
    ``fedgp fit`` writes one) and predicts each owner's rows as the fitted result does. (``fedgp fit``
    itself has no ``--personal``; the scikit-learn estimator saves nothing of its own; ``FederatedBO``
    refuses ``personal``: tests/bo/test_federated.py.)"""
    from fedgp.cli import main
    from fedgp.data.table import read_owner_table
    from fedgp.layout import write_model_folder
    from fedgp.presets import make_spec
    from tests.test_cli import owners_frame

    owners_frame().to_csv(tmp_path / "data.csv", index=False)
    table = read_owner_table(tmp_path / "data.csv", group="owner", target="y")
    result = fedgp.fit(make_spec(d=2), table.federation(), PERSONAL, rounds=3, seed=0, callbacks=QUIET)
    columns = dict(group="owner", target="y", features=["x1", "x2"], owners=result.roster.ids,
                   data=str(tmp_path / "data.csv"), test_fraction=None, seed=0)  # fmt: skip
    write_model_folder(tmp_path / "m", result, columns)
    new = owners_frame(sizes=(2, 3, 1), seed=7).drop(columns="y")
    new.to_csv(tmp_path / "new.csv", index=False)
    argv = ["predict", str(tmp_path / "m"), str(tmp_path / "new.csv"), "--data", str(tmp_path / "data.csv")]
    assert main([*argv, "--out", str(tmp_path / "p"), "--quiet"]) == 0
    pred = pd.read_csv(tmp_path / "p" / "predictions.csv", dtype={"owner": str})
    noises = {float(v[NOISE]) for v in result.personal_values().values()}
    assert len(noises) == 3  # three owners, three noises: a shared value would not pass below
    for owner in ["north", "south", "007"]:
        rows = pred["owner"] == owner
        X = pred.loc[rows, ["x1", "x2"]].to_numpy()
        mean, var = result.predict(X, client=owner, observation_noise=True)
        np.testing.assert_allclose(pred.loc[rows, "mean"], mean.numpy(), rtol=1e-10)
        np.testing.assert_allclose(pred.loc[rows, "sd"], var.sqrt().numpy(), rtol=1e-10)


def test_the_scikit_learn_estimator_with_personal_values_saves_through_its_result(tmp_path):
    """``FederatedGPRegressor`` takes a strategy with personal hyper-parameters; it has no file of its
    own, and its ``result_`` saves them: the loaded model predicts each group as the estimator does."""
    from fedgp.sklearn import FederatedGPRegressor
    from tests.test_cli import owners_frame

    frame = owners_frame()
    X, y, groups = frame[["x1", "x2"]].to_numpy(), frame["y"].to_numpy(), frame["owner"].to_numpy()
    est = FederatedGPRegressor(strategy=PERSONAL, rounds=3, engine="sequential", stop=None).fit(X, y, groups)
    loaded = fedgp.load(est.result_.save(tmp_path / "model.fedgp"))
    mean, std = est.predict(X, groups, return_std=True)
    for owner in est.groups_:
        rows = groups == owner
        client = ClientData(X[rows], y[rows], id=owner)
        pred = loaded.posterior(X[rows], client)
        np.testing.assert_array_equal(pred.mean.numpy(), mean[rows])
        np.testing.assert_array_equal(pred.variance_y.sqrt().numpy(), std[rows])
