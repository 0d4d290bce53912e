"""Rows an owner added after ``fedgp fit``: ``fedgp predict --data DATA.csv --data MORE.csv`` conditions
each owner on all its rows in every table, with the model folder's hyper-parameters and transforms —
what ``FitResult.update`` gives in Python (issue 54, item 2)."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
import torch

import fedgp
from fedgp.cli import main
from fedgp.data.table import read_owner_table
from fedgp.presets import make_spec
from fedgp.strategies import FGPR
from tests.test_cli import ROUNDS, fit_cli, owners_frame


@pytest.fixture
def fitted(tmp_path):
    data = tmp_path / "data.csv"
    owners_frame((10, 12, 9), 0).to_csv(data, index=False)
    assert fit_cli(data, tmp_path / "m") == 0
    return data


def test_predict_conditions_each_owner_on_its_rows_in_every_table(fitted, tmp_path):
    # rows added since, their columns in another order
    more = owners_frame((0, 4, 2), 5)[["y", "owner", "x2", "x1"]]
    more.to_csv(tmp_path / "more.csv", index=False)
    new = owners_frame((2, 3, 1), 7).drop(columns="y")
    new.to_csv(tmp_path / "new.csv", index=False)
    argv = ["predict", str(tmp_path / "m"), str(tmp_path / "new.csv"), "--data", str(fitted)]
    assert main([*argv, "--data", str(tmp_path / "more.csv"), "--out", str(tmp_path / "p"), "--quiet"]) == 0
    pred = pd.read_csv(tmp_path / "p" / "predictions.csv", dtype={"owner": str})
    assert pred.groupby("owner")["conditioned_on"].first().to_dict() == {"north": 10, "south": 16, "007": 11}

    # The same in Python: fit, then each owner adds its rows with update.
    result = fedgp.fit(
        make_spec(d=2), read_owner_table(fitted, group="owner", target="y").federation(), FGPR(), 3
    )
    for owner, rows in more.groupby("owner"):
        result.update(owner, rows[["x1", "x2"]].to_numpy(), rows["y"].to_numpy())
    for owner in ["north", "south", "007"]:
        at = pred["owner"] == owner
        mean, var = result.predict(
            pred.loc[at, ["x1", "x2"]].to_numpy(), client=owner, observation_noise=True
        )
        np.testing.assert_allclose(pred.loc[at, "mean"], mean.numpy(), rtol=1e-9)
        np.testing.assert_allclose(pred.loc[at, "sd"], np.sqrt(var.numpy()), rtol=1e-9)


def test_a_table_of_added_rows_is_checked_and_named(fitted, tmp_path, capsys):
    owners_frame((0, 2, 0), 5).drop(columns="y").to_csv(tmp_path / "more.csv", index=False)
    owners_frame((1, 1, 1), 7).drop(columns="y").to_csv(tmp_path / "new.csv", index=False)
    argv = ["predict", str(tmp_path / "m"), str(tmp_path / "new.csv"), "--data", str(fitted), "--data"]
    assert main([*argv, str(tmp_path / "more.csv"), "--out", str(tmp_path / "p")]) != 0
    err = capsys.readouterr().err
    assert "more.csv: no column 'y'" in err and "\n" not in err.strip()
    (tmp_path / "new.csv").write_text("x1,x2,owner\n1,2,west\n")
    (tmp_path / "more.csv").write_text("x1,x2,owner,y\n1,2,north,50\n")
    assert main([*argv, str(tmp_path / "more.csv"), "--out", str(tmp_path / "q")]) != 0
    assert (
        f"owner 'west' (line 2) has no rows in {fitted}, {tmp_path / 'more.csv'}" in capsys.readouterr().err
    )


def test_fit_warm_starts_from_a_model_folder_on_every_table(fitted, tmp_path, capsys):
    more = owners_frame((0, 4, 2), 5)
    more.to_csv(tmp_path / "more.csv", index=False)
    capsys.readouterr()
    argv = ["fit", str(fitted), str(tmp_path / "more.csv"), "--target", "y", "--group", "owner", "--quiet"]
    assert main([*argv, *ROUNDS, "--out", str(tmp_path / "m2"), "--warm-start", str(tmp_path / "m")]) == 0
    assert "3 owners, 37 rows to train on" in capsys.readouterr().out  # both tables

    # The same in Python: the first model's state as the start, the owners' rows of both tables.
    first = fedgp.load(tmp_path / "m" / "model.fedgp")
    rows = pd.concat([pd.read_csv(fitted, dtype={"owner": str}), more], ignore_index=True)
    rows.to_csv(tmp_path / "both.csv", index=False)
    grown = read_owner_table(tmp_path / "both.csv", group="owner", target="y").federation()
    assert grown.sizes.tolist() == [10, 16, 11]
    again = fedgp.fit(first.warm_spec(), grown, FGPR(), 3)
    continued = fedgp.load(tmp_path / "m2" / "model.fedgp")
    assert continued.roster.sizes.tolist() == [10, 16, 11]
    for name, value in again.state.items():
        torch.testing.assert_close(continued.state[name], value, rtol=1e-10, atol=0)
    cold = fedgp.fit(make_spec(d=2), grown, FGPR(), 3)  # not the state a cold start reaches
    assert not torch.allclose(
        cold.state["likelihood.noise_covar.noise"], again.state["likelihood.noise_covar.noise"]
    )


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--kernel", "matern12"], "--warm-start .*: --kernel cannot be given with it"),
        (
            ["--features", "x1"],
            "the model was fitted to target 'y' from features \\['x1', 'x2'\\], this table's are",
        ),
        ([], "not a folder written by fedgp fit"),
    ],
)
def test_a_warm_start_that_cannot_continue_is_one_line(fitted, tmp_path, capsys, extra, message):
    model = tmp_path / ("elsewhere" if not extra else "m")
    (tmp_path / "elsewhere").mkdir()
    assert fit_cli(fitted, tmp_path / "m2", "--warm-start", str(model), *extra) != 0
    err = capsys.readouterr().err.strip()
    assert re.search(message, err) and "\n" not in err
