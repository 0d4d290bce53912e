"""IFCA's synthetic experiment: success probability rises with the separation R."""

from fedgp.experiments.ifca_synthetic import success_table, success_vs_separation, trial


def test_success_probability_increases_with_separation():
    rows = success_vs_separation(
        2,
        d=100,
        m=100,
        n=10,
        sigmas=(0.1,),
        rs=(0.05, 0.25),
        trials=range(4),
        lrs=(0.1,),
        inits=10,
        rounds=150,
    )
    table = success_table(rows, ["R"]).set_index("R")["success"]
    assert table[0.25] >= 0.75 and table[0.25] > table[0.05], table
    assert (rows["best_dist"] >= rows["best_dist_nearest"] - 1e-12).all()  # matching can only cost


def test_a_trial_reports_the_best_over_initialisations_and_step_sizes():
    row = trial(2, d=10, m=20, n=20, sigma=0.1, r=1.0, seed=0, lrs=(0.1, 0.5), inits=2, rounds=100)
    assert row["best_dist"] == min(row["best_dist_lr0.1"], row["best_dist_lr0.5"])
    assert row["success"] == (row["best_dist"] <= 0.6 * 0.1 + 1e-3)
