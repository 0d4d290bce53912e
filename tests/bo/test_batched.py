"""All owners' proposals in one BoTorch optimisation: the same models, points as good as one owner at
a time, each in its own box."""

import gpytorch
import pytest
import torch

import fedgp
from fedgp.bo import BOLoop, FederatedBO, Owner, acquisition_seed, shared_prior_owners
from fedgp.bo.batched import batched_model, propose_all
from fedgp.errors import InputError
from fedgp.strategies import FGPR

pytest.importorskip("botorch")


def spec():
    return fedgp.GPSpec(kernel=gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()))


@pytest.fixture(scope="module")
def started():
    owners = shared_prior_owners(5, seed=10)
    owners[1].bounds = torch.tensor([[0.2, 0.5], [0.6, 0.9]], dtype=torch.float64)  # a box of its own
    owners[3].bounds = torch.tensor([[0.0, 0.0], [0.3, 1.0]], dtype=torch.float64)
    method = FederatedBO(spec(), FGPR(), rounds=2, initial_rounds=100)
    BOLoop(owners, method, 1, initial=10, seed=0).start()
    return owners, method


def test_batched_model_is_every_owners_to_botorch_model(started):
    owners, method = started
    model = batched_model(method.result, owners)
    Xs = torch.rand(7, 2, dtype=torch.float64)
    batch = model.posterior(Xs.expand(len(owners), 7, 2))
    for k in range(len(owners)):
        one = method.model(k).posterior(Xs)
        torch.testing.assert_close(batch.mean[k], one.mean, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(batch.variance[k], one.variance, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", ["qlogei", "qucb"])
def test_batched_points_are_as_good_as_one_owner_at_a_time(started, kind):
    from botorch.acquisition.analytic import LogExpectedImprovement, UpperConfidenceBound

    owners, method = started
    acquisition = method.acquisition.__class__(kind)
    together = propose_all(acquisition, batched_model(method.result, owners), owners, seed=3)
    for k, owner in enumerate(owners):
        alone, _ = acquisition.propose(method.model(k), owner.y, owner.bounds, acquisition_seed(0, k, 1))
        model = method.model(k)
        judge = (
            LogExpectedImprovement(model, best_f=owner.y.max())
            if kind == "qlogei"
            else UpperConfidenceBound(model, beta=acquisition.beta)
        )
        x = together[k]
        assert ((x >= owner.bounds[0]) & (x <= owner.bounds[1])).all()
        assert float(judge(x.unsqueeze(0))) >= float(judge(alone.unsqueeze(0))) - 1e-2


def test_batched_proposals_in_the_loop_and_their_limits():
    owners = shared_prior_owners(3, seed=11)
    method = FederatedBO(spec(), FGPR(), rounds=2, initial_rounds=30, batch_proposals=True)
    h = BOLoop(owners, method, 2, initial=6, seed=0).run().history
    assert (h.groupby("owner")["evaluations"].max() == 8).all()
    with pytest.raises(InputError, match="batch_proposals.*'ts'"):
        FederatedBO(spec(), acquisition="ts", batch_proposals=True)
    uneven = shared_prior_owners(2, seed=11)
    uneven[1] = Owner("late", uneven[1].objective, uneven[1].bounds, X=torch.rand(5, 2), y=torch.randn(5))
    method = FederatedBO(spec(), FGPR(), rounds=1, initial_rounds=5, batch_proposals=True)
    with pytest.raises(InputError, match="as many points"):
        BOLoop(uneven, method, 1, initial=3).run()
