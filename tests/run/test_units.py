"""The history in the data's units is written from the run's kept states (``history.attrs["states"]``),
not parsed back from column names: the states are the history's columns, they survive pandas, a
checkpoint and a saved file, and a file saved before they were kept gives the same table."""

from __future__ import annotations

import copy
import warnings

import gpytorch
import numpy as np
import pandas as pd
import pytest
import torch

import fedgp
from fedgp.messages.container import pack, seal
from fedgp.models.state import HyperState
from fedgp.run.saved import _references
from fedgp.run.units import RoundStates, history_in_data_units, state_columns, table_in_data_units
from fedgp.strategies import FGPR, IFCA
from fedgp.transforms import DataTransform, Standardize, Transforms
from tests.export.test_file_bounds import refused, reseal
from tests.export.test_saved import _read

QUIET = [fedgp.run.Progress(False)]
NOISE, LENGTHSCALE = "likelihood.noise_covar.noise", "covar_module.base_kernel.lengthscale"


@pytest.fixture(scope="module")
def runs():
    draws = fedgp.synthetic.gp_federation(num_clients=4, n=16, d=2, seed=0, n_test=4)
    fed = fedgp.data.Federation(
        [
            c.derived(X=c.X * 30 - 7, y=50 * c.y + 200, X_test=c.X_test * 30 - 7, y_test=50 * c.y_test + 200)
            for c in draws.federation
        ]
    )
    spec = fedgp.GPSpec(
        kernel=gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=2)),
        mean=gpytorch.means.ConstantMean(),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {
            "fgpr": fedgp.fit(spec, fed, FGPR(local_steps=2), rounds=3, callbacks=QUIET),
            "ifca": fedgp.fit(spec, fed, IFCA(num_clusters=2), rounds=2, callbacks=QUIET),
            "local": fedgp.fit(
                spec,
                fed,
                FGPR(),
                rounds=2,
                callbacks=QUIET,
                transforms=Transforms(outcome=Standardize(local=True)),
            ),
        }


def test_the_kept_states_are_the_histories_state_columns(runs):
    for name, result in runs.items():
        kept = result.history.attrs["states"]
        assert kept.rounds == tuple(result.history["round"]), name
        for position in range(len(kept.rounds)):
            state = kept.state(position)
            for column, (j, param, i) in state_columns(state).items():
                value = state[param] if j is None else state[param][j]
                assert float(value.reshape(-1)[i]) == result.history[column].iloc[position], (name, column)
        assert kept.state(len(kept.rounds) - 1).allclose(result.state, rtol=0.0)
        assert (
            RoundStates.from_columns(result.history, result.spec.event_shapes) == kept
        )  # the old column path


def test_the_table_maps_the_kept_states_with_untransform(runs):
    result = runs["fgpr"]
    t = result.transform
    table, units = history_in_data_units(result, ["u", "v"])
    s, o, b = float(t.y_scale), float(t.y_offset), t.x_scale
    np.testing.assert_allclose(table[NOISE], result.history[NOISE] * s * s, rtol=1e-14)
    np.testing.assert_allclose(
        table["mean_module.constant"], o + s * result.history["mean_module.raw_constant"], rtol=1e-14
    )
    for i, f in enumerate("uv"):
        np.testing.assert_allclose(
            table[f"{LENGTHSCALE}[{f}]"], result.history[f"{LENGTHSCALE}[{i}]"] * float(b[i]), rtol=1e-14
        )
        assert units[f"{LENGTHSCALE}[{f}]"] == f"{f}'s units"
    assert units[NOISE] == "the target's units squared" and "train_nll (standardised y)" in table
    last = t.untransform(result.state)
    assert table[NOISE].iloc[-1] == float(last[NOISE][0])
    # The kept states, not the columns: a history whose state columns were overwritten keeps its table.
    scrambled = result.history.copy()
    scrambled[NOISE] = -1.0
    again, _ = table_in_data_units(scrambled, result.history.attrs["states"], t, ["u", "v"])
    pd.testing.assert_series_equal(again[NOISE], table[NOISE])
    named = history_in_data_units(result)[0]  # the result's feature names, else x1, x2, ...
    assert named[f"{LENGTHSCALE}[x2]"].tolist() == table[f"{LENGTHSCALE}[v]"].tolist()


def test_per_owner_standardisation_clusters_and_no_transform():
    """With each owner's own standardisation no value in y's units exists: those columns keep the
    model's units and say so; lengthscales (one x map for everyone) still convert; a clustered
    strategy's ``j/`` columns convert per cluster; without transforms nothing changes but the names.
    The same table from kept states and from the columns alone."""
    history = pd.DataFrame(
        {
            "round": [1, 2],
            "train_nll": [1.0, 0.9],
            "0/likelihood.noise_covar.noise": [0.5, 0.4],
            "0/covar_module.base_kernel.lengthscale": [0.2, 0.3],  # one, shared by both features
            "1/likelihood.noise_covar.noise": [0.6, 0.7],
            "1/covar_module.base_kernel.lengthscale": [1.0, 2.0],
            "size/0": [2, 3],
        }
    )
    events = {NOISE: torch.Size([1]), LENGTHSCALE: torch.Size([1, 1])}
    noise = torch.tensor([[0.5, 0.6], [0.4, 0.7]], dtype=torch.float64).reshape(2, 2, 1)
    ls = torch.tensor([[0.2, 1.0], [0.3, 2.0]], dtype=torch.float64).reshape(2, 2, 1, 1)
    kept = RoundStates([1, 2], HyperState({NOISE: noise, LENGTHSCALE: ls}, events))
    assert RoundStates.from_columns(history, events) == kept
    x_map = dict(x_offset=torch.tensor([0.0, -8.0]), x_scale=torch.tensor([4.0, 16.0]))
    local, units = table_in_data_units(history, kept, DataTransform(**x_map, y_local=True), ["u", "v"])
    assert list(local.columns) == [
        "round",
        "train_nll (each owner's standardised y)",
        "0/likelihood.noise_covar.noise (each owner's standardised y)",
        "0/covar_module.base_kernel.lengthscale[u]",
        "0/covar_module.base_kernel.lengthscale[v]",
        "1/likelihood.noise_covar.noise (each owner's standardised y)",
        "1/covar_module.base_kernel.lengthscale[u]",
        "1/covar_module.base_kernel.lengthscale[v]",
        "size/0",
    ]
    assert local["1/covar_module.base_kernel.lengthscale[v]"].tolist() == [16.0, 32.0]
    assert local["0/likelihood.noise_covar.noise (each owner's standardised y)"].tolist() == [0.5, 0.4]
    assert units["0/covar_module.base_kernel.lengthscale[u]"] == "u's units"
    fixed = DataTransform(**x_map, y_offset=torch.tensor(10.0), y_scale=torch.tensor(3.0))
    converted, _ = table_in_data_units(history, kept, fixed, ["u", "v"])
    np.testing.assert_allclose(converted["1/likelihood.noise_covar.noise"], [5.4, 6.3])
    same, units = table_in_data_units(history, kept, DataTransform(), ["u", "v"])
    assert same["train_nll"].tolist() == [1.0, 0.9]
    assert same["0/likelihood.noise_covar.noise"].tolist() == [0.5, 0.4]
    assert same["0/covar_module.base_kernel.lengthscale[v]"].tolist() == [0.2, 0.3]
    later = table_in_data_units(history.iloc[1:], kept, fixed, ["u", "v"])[0]  # rows found by round
    assert (
        later["1/likelihood.noise_covar.noise"].tolist()
        == converted["1/likelihood.noise_covar.noise"].tolist()[1:]
    )


def test_kept_states_are_a_value_pandas_can_copy_and_compare(runs):
    history = runs["fgpr"].history
    kept = history.attrs["states"]
    assert copy.deepcopy(kept) is kept and history["round"].attrs["states"] is kept
    both = pd.concat([history, history])  # pandas compares the attrs: a bool, not a tensor
    assert both.attrs.get("states") is kept
    assert pd.concat([history, runs["ifca"].history]).attrs == {}
    assert "3 rounds" in repr(kept)
    with pytest.raises(AttributeError):
        kept.rounds = ()


def test_states_are_saved_and_a_file_without_them_gives_the_same_table(runs, tmp_path):
    for name, result in runs.items():
        loaded = fedgp.load(result.save(tmp_path / f"{name}.fedgp"))
        assert loaded.history.attrs["states"] == result.history.attrs["states"], name
        pd.testing.assert_frame_equal(history_in_data_units(loaded)[0], history_in_data_units(result)[0])
    header, tensors = _read(runs["ifca"].save(tmp_path / "r.fedgp"))
    assert header["history_states"] is not None
    kept = set(_references(header.pop("history_states")))  # what a fedgp before kept states wrote
    tensors = {k: v for k, v in tensors.items() if k not in kept}  # (same format version)
    (tmp_path / "old.fedgp").write_bytes(seal(pack("fit-result", 4, header, tensors)))
    old = fedgp.load(tmp_path / "old.fedgp")
    assert "states" not in old.history.attrs
    pd.testing.assert_frame_equal(history_in_data_units(old)[0], history_in_data_units(runs["ifca"])[0])


@pytest.mark.parametrize(
    "edit, phrase",
    [
        (lambda h: h["history_states"].update(rounds="1"), "history_states.rounds must be a list"),
        (lambda h: h["history_states"].update(rounds=[1, 2, 3, 4]), "4 rounds but states of batch"),
        (lambda h: h["history_states"].update(rounds=[7, 8, 9]), "rounds the history does not hold"),
        (lambda h: h["history_states"].update(states=[1]), "HyperState"),
        (lambda h: h["history_attrs"].update(states={}), "history_attrs holds 'states'"),
    ],
)
def test_crafted_states_are_refused_naming_the_field(runs, tmp_path, edit, phrase):
    saved = runs["fgpr"].save(tmp_path / "r.fedgp")
    refused(reseal(saved, tmp_path / "crafted.fedgp", header_fn=edit), phrase)


def test_a_resumed_run_keeps_every_rounds_state(tmp_path):
    draws = fedgp.synthetic.gp_federation(num_clients=3, n=12, d=2, seed=2)

    def fit(rounds, cb):
        return fedgp.fit(
            draws.spec, draws.federation, FGPR(), rounds=rounds, seed=3, stop=None, callbacks=[*QUIET, cb]
        )

    path = tmp_path / "run.ckpt"
    full = fedgp.fit(draws.spec, draws.federation, FGPR(), rounds=4, seed=3, stop=None, callbacks=QUIET)
    fit(2, fedgp.run.Checkpointing(path))
    resumed = fit(4, fedgp.run.Checkpointing(path, every=None, resume=True))
    assert resumed.history.attrs["states"] == full.history.attrs["states"]
    assert resumed.history.attrs["states"].rounds == (1, 2, 3, 4)
