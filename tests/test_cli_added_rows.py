"""Rows an owner added after ``fedgp fit``: ``fedgp predict --data DATA.csv --data MORE.csv`` conditions
each owner on all its rows in every table, with the model folder's hyper-parameters and transforms —
what ``FitResult.update`` gives in Python (issue 54, item 2)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import fedgp
from fedgp.cli import main
from fedgp.data.table import read_owner_table
from fedgp.presets import make_spec
from fedgp.strategies import FGPR
from tests.test_cli import fit_cli, owners_frame


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
