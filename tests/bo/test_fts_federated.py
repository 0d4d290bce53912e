"""FederatedFTS (issue 53, 4(b)): FTS on the hyper-parameters the federation learns, as federated BO
learns its own; FTS's prior mean; a non-RBF spec refused; a resumed loop goes on as the unbroken one."""

import gpytorch
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedgp import GPSpec
from fedgp.bo import FTS, BOCheckpoint, BOLoop, FederatedFTS, Owner
from fedgp.bo.synthetic import shared_prior_owners
from fedgp.errors import InputError
from fedgp.run.privacy import ClientDP
from fedgp.strategies import FGPR

pytest.importorskip("botorch")

SMALL = dict(features=30, target_features=40, candidates=64)


def spec():
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())
    return GPSpec(kernel=kernel, mean=gpytorch.means.ConstantMean())


def owners(shift: float = 0.0):
    return [
        Owner(o.id, lambda X, f=o.truth: f(X) + shift, o.bounds, optimum=o.optimum + shift)
        for o in shared_prior_owners(3, dim=1, lengthscale=0.2, seed=4)
    ]


def test_it_runs_fts_on_the_federations_hyper_parameters():
    method = FederatedFTS(spec(), FGPR(), rounds=2, initial_rounds=8, engine="sequential", **SMALL)
    loop = BOLoop(owners(), method, 2, seed=0).start()
    for iteration in (1, 2):
        state = {name: value.detach() for name, value in method.fit.result.state.items()}
        assert method.lengthscale == pytest.approx(float(state["covar_module.base_kernel.lengthscale"]))
        assert method.outputscale == pytest.approx(float(state["covar_module.outputscale"]))
        assert method.noise == pytest.approx(float(state["likelihood.noise_covar.noise"]))
        assert method.mean == pytest.approx(float(state["mean_module.raw_constant"]))
        given_fts = FTS(method.lengthscale, method.outputscale, method.noise, mean=method.mean, **SMALL)
        given_fts._draw_features(loop)
        given_fts._share(loop, iteration - 1)
        for mine, theirs in zip(method.propose(loop, iteration), given_fts.propose(loop, iteration)):
            assert torch.equal(mine, theirs)
        loop.step()
    assert loop.history[-1]["round"] == 8 + 2 * 2  # the fit warm-started: 2 rounds per iteration


@settings(max_examples=8, deadline=None)
@given(shift=st.floats(-50.0, 50.0))
def test_fts_with_a_prior_mean_is_fts_on_the_values_less_that_mean(shift):
    plain = BOLoop(owners(), FTS(0.2, **SMALL), 2, seed=3).run().owners
    moved = BOLoop(owners(shift), FTS(0.2, mean=shift, **SMALL), 2, seed=3).run().owners
    for a, b in zip(plain, moved):
        assert torch.allclose(a.X, b.X, atol=1e-6)


def test_a_kernel_without_random_fourier_features_here_and_client_dp_are_refused():
    matern = GPSpec(kernel=gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel()))
    with pytest.raises(InputError, match="must be an RBFKernel .* got ScaleKernel"):
        FederatedFTS(matern)
    with pytest.raises(InputError, match="not the weight draws"):
        FederatedFTS(spec(), ClientDP(FGPR(), noise=1.0))
    with pytest.raises(InputError, match="mean must be a finite number"):
        FTS(0.2, mean=float("nan"))


def test_a_resumed_loop_goes_on_as_the_unbroken_one(tmp_path):
    def make():
        return FederatedFTS(spec(), FGPR(), rounds=2, initial_rounds=6, engine="sequential", **SMALL)

    unbroken = BOLoop(owners(), make(), 4, seed=2).run()
    BOLoop(owners(), make(), 2, seed=2, callbacks=[BOCheckpoint(tmp_path / "run")]).run()
    resumed = BOLoop(owners(), make(), 4, seed=2, callbacks=[BOCheckpoint(tmp_path / "run")]).run()
    times = ["seconds_propose", "seconds_update"]
    pd.testing.assert_frame_equal(unbroken.history.drop(columns=times), resumed.history.drop(columns=times))
    for mine, theirs in zip(unbroken.owners, resumed.owners):
        assert torch.equal(mine.X, theirs.X)
