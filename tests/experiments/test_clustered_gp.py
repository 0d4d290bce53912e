"""Clustered FGPR against single FGPR on a mixture of GP populations; k = 1 is FGPR."""

import numpy as np

from fedgp.experiments.clustered_gp import POPULATIONS, clustered_fgpr_study, per_client_summary
from fedgp.experiments.registry import get_reproduction


def test_clustered_fgpr_beats_single_fgpr_per_client_and_reduces_to_it_with_one_cluster():
    per_client = clustered_fgpr_study(
        seeds=[0],
        populations=POPULATIONS[:2],
        clients_per_population=4,
        n=40,
        n_test=20,
        rounds=25,
        restarts=2,
    )
    nll = per_client.pivot(index="client", columns="method", values="nll")
    assert (nll["clustered_fgpr"] < nll["fgpr"]).mean() >= 0.75, nll
    assert nll["clustered_fgpr"].mean() < nll["fgpr"].mean() - 0.2
    assert np.allclose(nll["clustered_fgpr_k1"], nll["fgpr"], rtol=1e-9)
    summary = per_client_summary(per_client).set_index("method")
    assert summary.loc["clustered_fgpr", "clients_nll_below_fgpr"] >= 6


def test_the_three_reproductions_are_registered():
    for name in ("mixed-regression", "ifca-synthetic", "clustered-gp"):
        assert callable(get_reproduction(name))
