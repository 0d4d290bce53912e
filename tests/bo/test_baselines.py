"""The baselines in the same harness: local BO (BoTorch refitted per owner) and FTS."""

import pytest
import torch

from fedgp.bo import FTS, BOLoop, LocalBO, shared_prior_owners
from fedgp.bo.fts import own_probability
from fedgp.errors import InputError

pytest.importorskip("botorch")


def test_fts_mixing_probability_follows_the_papers_schedule():
    assert own_probability(1) == own_probability(2) == 0.75
    assert own_probability(3) == pytest.approx(8 / 9)


def test_fts_shares_one_weight_draw_per_agent_and_stays_in_the_box():
    owners = shared_prior_owners(3, seed=4)
    method = FTS(0.15, features=40, target_features=60, candidates=200)
    h = BOLoop(owners, method, 3, initial=4, seed=2).run().history
    assert [w.shape for w in method.shared_weights] == [torch.Size([40])] * 3
    assert set(h["method"]) == {"fts"} and (h.groupby("owner")["evaluations"].max() == 7).all()
    for o in owners:
        assert ((o.X >= 0) & (o.X <= 1)).all()


def test_fts_maximises_the_draw_it_chose():
    """With one agent FTS Thompson-samples its own posterior: on a noise-free owner whose draw is
    pinned by many points, the proposal is near the function's maximiser."""
    (owner,) = shared_prior_owners(1, seed=5, noise=1e-6)
    grid = torch.cartesian_prod(*[torch.linspace(0, 1, 21, dtype=torch.float64)] * 2)
    owner.X, owner.y = grid, owner.truth(grid)
    method = FTS(0.15, noise=1e-6, features=400, target_features=2000)
    loop = BOLoop([owner], method, 1, initial=1).start()
    loop.step()
    assert float(owner.truth(owner.X[-1:])) > owner.optimum - 0.05


def test_local_bo_runs_in_the_harness():
    owners = shared_prior_owners(2, seed=6)
    h = BOLoop(owners, LocalBO("qucb"), 2, initial=5, seed=0).run().history
    assert set(h["method"]) == {"local"} and len(h) == 6
    assert (h.groupby("owner")["best_observed"].diff().dropna() >= 0).all()


def test_fts_refuses_bad_hyper_parameters():
    with pytest.raises(InputError, match="lengthscale"):
        FTS(0.0)
