"""Two-phase on unbalanced clusters: the data-share labels, the per-cluster matching, and the study's
finding in small (the paper's weighting leaves the small cluster behind at 400 rounds; weighting within
clusters carries it to the oracle, and the stopping rule ends the run there)."""

import numpy as np
import pandas as pd
import pytest

from fedgp.cli import main
from fedgp.data import skewed_sizes
from fedgp.experiments.two_phase_unbalanced import matched_errors, run_seed, summarize
from fedgp.synthetic import gaussian_mixed_regression


def test_data_share_labels_give_each_cluster_its_share_of_the_data():
    sizes = skewed_sizes(200, 10, 200, "pareto", seed=3, pareto_shape=1.5)
    shares = (0.04, 0.16, 0.3, 0.5)
    mr = gaussian_mixed_regression(k=4, d=3, sizes=sizes, shares=shares, labels="data_shares", seed=3)
    labels = mr.labels.numpy()
    held = np.array([sizes[labels == j].sum() for j in range(4)]) / sizes.sum()
    assert np.allclose(held, shares, atol=0.01)
    # with i.i.d. labels the same shares are the clients' probabilities, not the data's
    iid = gaussian_mixed_regression(k=4, d=3, sizes=sizes, shares=shares, seed=3).labels.numpy()
    assert not np.allclose(
        np.array([sizes[iid == j].sum() for j in range(4)]) / sizes.sum(), shares, atol=0.01
    )
    with pytest.raises(ValueError, match="'data_shares'"):
        gaussian_mixed_regression(k=2, d=3, sizes=[5] * 4, labels="by-size")


def test_matched_errors_follow_the_best_matching():
    truths = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    estimates = truths[[2, 0, 1]] + np.array([[0.1, 0.0], [0.0, 0.2], [0.3, 0.0]])
    assert np.allclose(matched_errors(estimates, truths), [0.2, 0.3, 0.1])


def test_the_paper_weighting_lags_on_the_small_cluster_and_the_cluster_weighting_reaches_the_oracle():
    methods = ("two_phase", "two_phase_cluster", "oracle_cluster")
    curves, finals = run_seed(0, methods, budget=400, clients=60, d=10)
    table = summarize(finals).set_index(["method", "cluster"])
    small, large = 0, 3
    assert finals.loc[finals["cluster"] == small, "data_share"].iloc[0] < 0.05
    # the paper's n_i/N weighting at its 400 rounds: the big clusters are there, the small one is not
    assert table.loc[("two_phase", large), "within_1_2x_at_400"] == 1
    assert table.loc[("two_phase", small), "within_1_2x_at_400"] == 0
    assert table.loc[("two_phase", small), "rule_met"] == 0  # and the rule says so
    # weighted within clusters: every cluster reaches the oracle's error and the rule stops it there
    cluster = table.loc["two_phase_cluster"]
    assert (cluster["rule_met"] == 1).all() and (cluster["median_stop_round"] < 400).all()
    assert np.allclose(cluster["median_final_over_oracle"], 1.0, atol=1e-3)
    assert cluster.loc[small, "median_rounds_to_oracle"] < 100
    assert set(curves.columns) == {"seed", "method", "round", "cluster", "error"}


def test_reproduce_writes_the_study(tmp_path):
    out = tmp_path / "out"
    assert main(["reproduce", "two-phase-unbalanced", "--quick", "--repeats", "1", "--out", str(out)]) == 0
    finals = pd.read_csv(out / "two_phase_unbalanced.csv")
    assert set(finals["method"]) == {"two_phase", "two_phase_cluster", "oracle", "oracle_cluster"}
    assert "QUICK MODE" in (out / "two_phase_unbalanced.md").read_text()
    assert (out / "two_phase_unbalanced_curves.csv").exists()
