"""``fedgp reproduce privacy``'s parts on a small scale: the cost rows and the membership attack."""

import math

import numpy as np

from fedgp.experiments.privacy import membership_attack, privacy_cost


def test_the_cost_table_has_a_row_per_epsilon_with_the_calibrated_noise():
    cost = privacy_cost(ks=(60,), epsilons=(2.0, math.inf), rounds=3, n=20, n_test=5, cmapss_root="")
    assert list(cost["epsilon"]) == [2.0, math.inf]
    assert cost.loc[0, "noise_multiplier"] > 0 and cost.loc[1, "noise_multiplier"] == 0
    assert 0 < cost.loc[0, "epsilon_spent"] <= 2.0
    assert np.isfinite(cost[["test_rmse", "test_nll", "coverage95", "theta_error"]].to_numpy()).all()


def test_without_dp_the_attack_reads_the_outlier_from_one_reply():
    attack = membership_attack(trials=24, epsilons=(math.inf,), rounds=2).set_index("attacker_sees")
    assert attack.loc["client 0's reply", "attack_accuracy"] >= 0.75
    assert (attack["dp_bound"] == 1.0).all() and len(attack) == 2
