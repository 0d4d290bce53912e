"""Table 2 (NASA C-MAPSS): protocol invariants, the summary maths and the reproduced ranking."""

import numpy as np
import pandas as pd
import pytest

import fedgp.experiments.table2 as table2
from fedgp.experiments.registry import get_reproduction
from fedgp.experiments.table2 import CSV_COLUMNS, Table2Settings, reproduce, run_table2, summary_table
from tests.datasets.real import require_real_data

FD001 = ("cmapss/train_FD001.txt", "cmapss/test_FD001.txt", "cmapss/RUL_FD001.txt")


@pytest.fixture(scope="module")
def quick_run():
    """One quick-mode repeat on the real FD001 (shared by the tests below: it takes seconds)."""
    return run_table2(
        1, seed=3, settings=Table2Settings.quick(), root=require_real_data(*FD001), progress=False
    )


def test_summary_is_mean_over_repeats_of_engine_mean_and_engine_std():
    rows = []
    for repeat, values in enumerate(([0.1, 0.3], [0.2, 0.6])):
        for unit, v in enumerate(values):
            rows.append(
                {
                    "repeat": repeat,
                    "sensor": "s2",
                    "method": "FGPR",
                    "unit": unit,
                    "rmse": v,
                    "nll": v,
                    "coverage95": 1.0,
                }
            )
    table = summary_table(pd.DataFrame(rows))
    assert list(table.columns) == CSV_COLUMNS
    row = table.iloc[0]
    assert np.isclose(row["rmse_mean_x10"], 10 * np.mean([0.2, 0.4]))
    assert np.isclose(row["rmse_std_x10"], 10 * np.mean([0.1, 0.2]))  # population std across engines
    assert row["repeats"] == 2


def test_fgpr_beats_both_fedavg_baselines_on_both_sensors(quick_run):
    rmse = quick_run.summary().set_index(["sensor", "method"])["rmse_mean_x10"]
    for sensor in ("s2", "s7"):  # the paper's ranking: personalised FGPR beats both FedAvg baselines
        assert (
            rmse[sensor, "FGPR"] < rmse[sensor, "Polynomial"]
            and rmse[sensor, "FGPR"] < rmse[sensor, "Neural"]
        )


def test_every_method_predicts_the_same_halves_of_the_same_40_engines(quick_run):
    per = quick_run.rows
    assert per.groupby(["sensor", "method"]).size().eq(40).all()
    halves = per.pivot_table(index=["sensor", "unit"], columns="method", values="n_predicted")
    assert (halves.nunique(axis=1) == 1).all()
    units = per.groupby("sensor")["unit"].apply(frozenset)
    assert units["s2"] == units["s7"]  # one engine split per repeat, both sensors
    assert set(quick_run.details["poly_degree"]) <= set(quick_run.settings.degrees)
    assert per["coverage95"].between(0, 1).all()


def test_reproduce_writes_the_documented_files(tmp_path, monkeypatch, quick_run):
    monkeypatch.setattr(table2, "run_table2", lambda *args, **kwargs: quick_run)
    assert get_reproduction("table2") is reproduce
    paths = reproduce(repeats=1, out_dir=tmp_path, seed=0, quick=True, progress=False)
    assert [p.name for p in paths] == [
        "table2.csv",
        "table2_per_repeat.csv",
        "table2_details.csv",
        "table2.md",
    ]
    table = pd.read_csv(tmp_path / "table2.csv")
    assert list(table.columns) == CSV_COLUMNS and len(table) == 8
    assert set(table["method"]) == {"FGPR", "Polynomial", "Neural", "LocalGP"} and set(table["sensor"]) == {
        "s2",
        "s7",
    }
    assert "5.45 (0.01)" in (tmp_path / "table2.md").read_text()
