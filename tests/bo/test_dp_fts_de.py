"""DP-FTS-DE against its closed forms: the server's noise, clipping and weights, as the authors' code."""

import math

import numpy as np
import pytest
import torch

from fedgp.bo import DPFTSDE, BOLoop, shared_prior_owners
from fedgp.bo.dp_fts_de import cell_of, de_weights, private_cells

pytest.importorskip("botorch")


def test_de_weights_follow_the_authors_schedule():
    assignment = np.arange(29) % 4
    first = de_weights(assignment, 4, 0, 16, 1, 10, 30)
    np.testing.assert_allclose(first.sum(axis=1), 1.0)
    assert first[0, 0] / first[0, 1] == pytest.approx(math.exp(15))  # agent 0 is in cell 0, agent 1 is not
    middle = de_weights(assignment, 4, 10 + 15, 16, 1, 10, 30)
    assert middle[0, 0] / middle[0, 1] == pytest.approx(math.exp(np.linspace(16, 1, 30)[15] - 1))
    np.testing.assert_allclose(de_weights(assignment, 4, 60, 16, 1, 10, 30), 1 / 29)


def test_released_noise_has_the_papers_standard_deviation():
    """Zero draws: every released coordinate is noise of sd max_n φ_{i,n} · z S / q."""
    weights = de_weights(np.arange(29) % 4, 4, 0, 16, 1, 10, 30)
    released = private_cells(
        torch.zeros(29, 20000, dtype=torch.float64), weights, 0.35, 22.0, 1.0, np.random.default_rng(0)
    )
    expected = weights.max(axis=1) * 1.0 * 22.0 / 0.35
    np.testing.assert_allclose(released.std(dim=1).numpy(), expected, rtol=0.03)


def test_each_sampled_draw_is_clipped_to_s_over_root_p():
    draws = torch.zeros(5, 3, dtype=torch.float64)
    draws[2] = torch.tensor([300.0, 400.0, 0.0])  # norm 500
    weights = de_weights(np.arange(5) % 4, 4, 0, 16, 1, 10, 30)
    released = private_cells(draws, weights, 1.0, 22.0, 0.0, np.random.default_rng(0))
    expected = torch.as_tensor(weights[:, 2:3]) * draws[2] / 500 * 22.0 / 2  # S / √P with P = 4
    torch.testing.assert_close(released, expected)


def test_cells_are_the_authors_grid():
    bounds = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=torch.float64)
    X = torch.tensor([[0.1, 0.1], [0.1, 0.9], [0.9, 0.1], [0.9, 0.9], [1.0, 1.0]], dtype=torch.float64)
    assert cell_of(X, bounds, 2).tolist() == [0, 1, 2, 3, 3]


def test_dp_fts_de_runs_in_the_harness():
    owners = shared_prior_owners(4, seed=7)
    method = DPFTSDE(0.15, features=50, target_features=60, candidates=200)
    h = BOLoop(owners, method, 2, initial=4, seed=1).run().history
    assert method.cells.shape == (4, 50) and set(h["method"]) == {"dp-fts-de"}
    assert (h.groupby("owner")["evaluations"].max() == 6).all()


@pytest.mark.parametrize("z", [1.0, 2.5])
def test_epsilon_is_dp_accountings_for_every_release_so_far(z):
    """A release at the start and after each iteration, each the Poisson-sampled Gaussian mechanism:
    the history's ε is dp-accounting's RDP accountant's for that many, computed here with the library."""
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    owners = shared_prior_owners(3, seed=2)
    method = DPFTSDE(0.15, q=0.35, z=z, delta=1e-5, features=20, target_features=20, candidates=50)
    h = BOLoop(owners, method, 3, initial=3, seed=0).run().history
    per_iteration = h.groupby("iteration")["epsilon"].first()
    for iteration, epsilon in per_iteration.items():
        accountant = RdpAccountant()
        event = dp_accounting.PoissonSampledDpEvent(0.35, dp_accounting.GaussianDpEvent(z))
        accountant.compose(dp_accounting.SelfComposedDpEvent(event, iteration + 1))
        assert epsilon == pytest.approx(accountant.get_epsilon(1e-5), rel=1e-9)
    assert per_iteration.is_monotonic_increasing
    plain = DPFTSDE(0.15, private=False, features=20, target_features=20, candidates=50)
    assert "epsilon" not in BOLoop(shared_prior_owners(3, seed=2), plain, 1, initial=3).run().history
    with pytest.raises(Exception, match="delta"):
        DPFTSDE(0.15, delta=0.0)
