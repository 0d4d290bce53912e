"""The one maximum-likelihood loop: failed attempts skipped and recorded, best or first kept."""

from functools import partial

import numpy as np
import pytest
import torch
from linear_operator.utils.errors import NanError, NotPSDError

from fedgp.errors import MLEError
from fedgp.models import fit_mle, maximize_likelihood, total_nll
from fedgp.models.mle import adam, lbfgs, perturbed_starts
from fedgp.synthetic import gp_spec


def _data(seed=0, n=30):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, 1, dtype=torch.float64, generator=g) * 5
    return X, torch.sin(X[:, 0]) + 0.1 * torch.randn(n, dtype=torch.float64, generator=g)


def _failing(error):
    def run(params, loss):
        raise error

    return run


def test_failed_attempts_are_skipped_and_the_best_of_the_rest_wins():
    spec = gp_spec(1, "rbf", ard=False)
    data = [_data(0), _data(1)]
    start = spec.to_raw(spec.initial_state())
    starts = [start, *perturbed_starts(spec, start, 3, seed=0, scale=1.0)]
    fits = [maximize_likelihood(spec, data, [(s, lbfgs)]) for s in starts]
    attempts = [(starts[0], _failing(NotPSDError("x"))), (starts[1], _failing(NanError("y")))]
    got = maximize_likelihood(spec, data, attempts + [(s, lbfgs) for s in starts[2:]])
    best = min(fits[2:], key=lambda f: f.value)
    assert got.value == best.value and got.attempt == 2 + fits[2:].index(best)
    assert [f.split(":")[0] for f in got.failures] == ["attempt 0", "attempt 1"]
    # the value is the per-point NLL of the summed likelihoods
    assert got.value == pytest.approx(total_nll(spec, got.state, data), rel=1e-12)
    with pytest.raises(MLEError, match="every MLE attempt failed"):
        maximize_likelihood(spec, data, attempts)


def test_first_success_stops_the_fallback_chain_and_nan_states_count_as_failures():
    spec = gp_spec(1, "rbf", ard=False)
    data = [_data(2)]
    start = spec.to_raw(spec.initial_state())
    chain = [(start, partial(lbfgs, max_iter=50)), (start, partial(adam, steps=20))]
    assert maximize_likelihood(spec, data, chain, first_success=True).attempt == 0

    def infinite_lengthscale(params, loss):  # a finite NLL (a constant kernel) from a non-finite state
        with torch.no_grad():
            params[-1].fill_(float("inf"))

    fit = maximize_likelihood(spec, data, [(start, infinite_lengthscale), *chain[1:]], first_success=True)
    assert fit.attempt == 1 and "non-finite" in fit.failures[0]
    assert np.isfinite(fit.value)
    assert spec.params[-1].name == "covar_module.base_kernel.lengthscale"


def test_fit_mle_skips_a_restart_that_fails():
    spec = gp_spec(1, "matern32", ard=False)
    data = [_data(3)]
    real, calls = torch.optim.LBFGS.step, []

    def second_fails(self, closure):
        calls.append(1)
        if len(calls) == 2:
            raise NanError("cholesky_cpu: NaN")
        return real(self, closure)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.optim.LBFGS, "step", second_fails)
        state, value = fit_mle(spec, data, restarts=2, seed=1, max_iter=50)
    assert len(calls) == 3 and np.isfinite(value)
    assert value == pytest.approx(total_nll(spec, state, data), rel=1e-12)
