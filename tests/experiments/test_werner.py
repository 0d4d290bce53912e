"""The three Werner-paper experiments at a tiny scale: what they compute, and the authors' numbers
where they are exact."""

import pandas as pd
import pytest

from fedgp.experiments import robust_fgpr as rf
from fedgp.experiments import werner_gp as wgp
from fedgp.experiments import werner_synthetic as ws
from fedgp.experiments.registry import REPRODUCTIONS


def test_the_three_reproductions_are_registered():
    assert {"werner-synthetic", "werner-gp", "robust-fgpr"} <= set(REPRODUCTIONS)


def test_synthetic_ground_truth_step_is_the_authors_to_their_printed_digits():
    # the authors' script in float64 logs "E=0 loss=0.50418790" for the ground-truth solver (seed 0);
    # their float32 run logs 0.50418043
    curves = ws.synthetic_study(seeds=[0], epochs=2)
    first = curves[curves["updates"] == 1].set_index("method")["error"]
    assert first["ground_truth"] == pytest.approx(0.50418790, abs=5e-9)
    start = curves[curves["updates"] == 0]["error"]
    assert start.nunique() == 1  # every method starts at the authors' oracle start
    summary = ws.summary(curves, epochs=(0, 1))
    assert set(summary["method"]) == {"fc", "ground_truth", "local"}


def test_werner_gp_study_and_criteria():
    table = wgp.werner_gp_study(
        seeds=[0], rounds=3, qs=(0.2,), scenarios=("clean", "large"), kernel_variant=False
    )
    assert set(table["method"]) == {"fedavg", "fc_q0.2", "local", "oracle"}
    assert (table.query("scenario == 'large'")["participants"] == 40).all()
    assert (
        table.query("scenario == 'large' and method == 'fedavg'")["rmse"].iloc[0] > 1e3
    )  # it diverges at once
    crit = wgp.criteria(table)
    assert "2: large: fedavg > 1.2 clean" in crit and bool(crit["2: large: fedavg > 1.2 clean"].iloc[0])


def test_werner_gp_criteria_by_hand():
    rows = [
        ("local", "clean", 1.0), ("oracle", "clean", 0.1), ("fedavg", "clean", 2.0), ("fedavg", "flip", 2.2),
        ("fc_q0.2", "clean", 0.24), ("fc_q0.2", "flip", 0.37),
    ]  # fmt: skip
    table = pd.DataFrame([{"seed": 0, "method": m, "scenario": s, "rmse": r} for m, s, r in rows])
    crit = wgp.criteria(table).iloc[0]
    assert crit["1: fc ≤ 0.6 local"] and crit["1: fc ≤ 0.4 fedavg"]
    assert not crit["2: flip: fc ≤ 1.5 fc clean"]  # 0.37 > 0.36
    assert not crit["2: flip: fedavg > 1.2 clean"]  # 2.2 = 1.1 × 2.0
    assert crit["3: clean: fc ≤ 2.5 oracle"] and not crit["3: flip: fc ≤ 2.5 oracle"]


def test_robust_fgpr_grid_and_criteria():
    table = rf.robust_fgpr_study(
        seeds=[0],
        rounds=2,
        n=20,
        attack_names=("clean", "gaussian"),
        aggregator_names=("mean", "krum", "median"),
    )
    g = rf.grid(table)
    assert list(g.index) == ["mean", "median", "krum"] and list(g.columns) == ["clean", "gaussian"]
    assert g.loc["mean", "gaussian"] > 1e4 and g.loc["krum", "gaussian"] < 10
    crit = rf.criteria(table).set_index("attack")
    assert crit.loc["gaussian", "mean_ratio"] > 1e4
    assert (table["attackers"] == [0, 0, 0, 5, 5, 5]).all()
    per_seed = rf.seed_criteria(table).iloc[0]
    assert per_seed["gaussian: mean > 1000 clean"] and per_seed["gaussian: robust ≤ 1.5 clean"]


def test_a_run_whose_every_loss_overflowed_is_recorded_as_diverged_and_other_failures_raise():
    from fedgp.errors import RoundFailedError
    from fedgp.synthetic import bump_federation

    data = bump_federation(clusters=2, clients_per_cluster=2, n=3, n_test=0, extra=1, seed=0)
    err = RoundFailedError(
        "round 666 (train): 0 of 5 clients replied, fewer than the 1 required; the round was not applied. "
        "Failed: 0: invalid reply: field 'loss' is not finite (NaN or inf)",
        {i: "invalid reply: field 'loss' is not finite (NaN or inf)" for i in range(5)},
    )
    row = wgp._diverged(err, data)
    assert row["diverged_round"] == 666 and row["rmse"] == float("inf") and row["honest"] == 4
    with pytest.raises(RoundFailedError, match="0 of 5"):
        wgp._diverged(RoundFailedError("round 3 (train): 0 of 5 clients replied", {0: "sabotaged"}), data)
    table = pd.DataFrame(
        [
            {"seed": 0, "method": m, "scenario": s, "rmse": r}
            for m, s, r in [
                ("local", "clean", 1.0), ("oracle", "clean", 0.1), ("fedavg", "clean", 1.0),
                ("fedavg", "large", float("inf")), ("fc_q0.2", "clean", 0.2), ("fc_q0.2", "large", 0.2),
            ]
        ]
    )  # fmt: skip
    assert wgp.criteria(table).iloc[0]["2: large: fedavg > 1.2 clean"]  # divergence counts as a rise
