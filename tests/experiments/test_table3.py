"""Table 3 (SARCOS): the reduced protocol end to end, labelled as such, with the expected ceiling."""

import pandas as pd
import pytest

import fedgp.experiments.table3 as table3
from fedgp.experiments.registry import get_reproduction
from fedgp.experiments.table3 import CSV_COLUMNS, METHODS, Table3Settings, reproduce, run_table3
from tests.datasets.real import require_real_data


@pytest.fixture(scope="module")
def quick_run():
    """One quick-mode repeat, output 1, both partitions, on the real test file."""
    root = require_real_data("sarcos/sarcos_inv_test.mat")
    return run_table3(1, seed=5, settings=Table3Settings.quick(), root=root, progress=False)


def test_every_method_scores_every_device_on_the_same_rows(quick_run):
    per = quick_run.rows
    assert per.groupby(["partition", "method"]).size().eq(25).all()
    same = per.pivot_table(index=["partition", "device"], columns="method", values="n_test").nunique(axis=1)
    assert (same == 1).all()
    assert set(per["n_train"]) <= {159, 160} and per["protocol"].eq("reduced").all()
    assert set(quick_run.details["ditto_lam"]) <= set(quick_run.settings.ditto["lam"])


def test_pooling_beats_each_device_alone_on_iid_devices(quick_run):
    rmse = quick_run.summary().set_index(["partition", "method"])["rmse_mean_x10"]
    assert rmse["iid", "CentralGP"] < rmse["iid", "LocalGP"]


def test_reproduce_writes_reduced_protocol_tables(tmp_path, monkeypatch, quick_run):
    monkeypatch.setattr(table3, "run_table3", lambda *args, **kwargs: quick_run)
    assert get_reproduction("table3") is reproduce
    reproduce(repeats=1, out_dir=tmp_path, seed=0, quick=True, progress=False, n_jobs=1)
    table = pd.read_csv(tmp_path / "table3.csv")
    assert list(table.columns) == CSV_COLUMNS
    assert set(table["method"]) == set(METHODS) and set(table["partition"]) == {"iid", "contiguous"}
    assert set(table["protocol"]) == {"reduced"} and set(table["output"]) == {1}
    assert "protocol: reduced" in (tmp_path / "table3.md").read_text()
