"""Issue 33: FGPR's default reaches the optimum of its own objective on owners that differ, and
recovers θ* as well as the pooled MLE; the yardstick itself is an optimum."""

import math
import os

import numpy as np
import pytest
import torch

import fedgp
from fedgp.experiments import convergence as C
from fedgp.strategies import FGPR
from fedgp.synthetic import gp_federation


def test_the_central_optimum_is_a_stationary_point_above_every_other_state():
    draws = gp_federation(num_clients=4, n=[15, 30, 45, 60], d=1, seed=0)
    clients = list(draws.federation)
    spec = draws.spec
    best, value = C.central_optimum(spec, clients, restarts=3)
    assert value == pytest.approx(C.summed_log_likelihood(spec, best, clients), rel=1e-12)
    # The raw gradient of the summed log likelihood vanishes there ...
    model = spec.build()
    spec.load(model, best)
    loss = sum(fedgp.models.objective.minibatch_nll(model, c.X, c.y, prior_weight=0.0) * c.n for c in clients)
    grads = torch.autograd.grad(loss, [p for p in model.parameters() if p.requires_grad])
    assert max(float(g.abs().max()) for g in grads) < 1e-4
    # ... and no other state is higher: the truth, the start, a nudge in each direction.
    raw = spec.to_raw(best)
    for other in (draws.truth, spec.initial_state()):
        assert C.summed_log_likelihood(spec, other, clients) <= value
    for name in raw:
        for step in (-0.05, 0.05):
            moved = dict(raw.items())
            moved[name] = raw[name] + step
            nudged = spec.from_raw(fedgp.models.HyperState(moved, spec.event_shapes))
            assert C.summed_log_likelihood(spec, nudged, clients) < value


def test_the_default_recovers_theta_as_well_as_the_pooled_mle():
    """Item 6, small: 12 owners x 50 points of one GP; the full 50 x 100 figure is in
    results/benchmarks/fgpr_heterogeneous.md."""
    frame = C.theta_recovery(FGPR(), num_clients=12, n=50, rounds=150)
    assert (frame["error_ratio"] <= 1.5).all(), frame
    assert np.allclose(frame["federated"], frame["pooled_mle"], rtol=0.03), frame


def test_on_owners_100x_apart_the_default_reaches_the_optimum_and_the_authors_settings_do_not():
    """Grunfeld's 11 firms (statsmodels' copy; dev installs have it): the issue's own case."""
    if os.environ.get("CI") != "true":  # make test installs it: in CI its absence is a failure
        pytest.importorskip("statsmodels")
    federation = C.grunfeld(seed=0)
    default = C.convergence_run(fedgp.GPSpec(), federation, FGPR(), rounds=60)
    authors = C.convergence_run(fedgp.GPSpec(), federation, FGPR.authors(), rounds=60)
    assert default["gap_per_owner"] < 1.0 and default["coverage_mean"] >= 0.88
    assert authors["gap_per_owner"] > 1.0  # Adam restarted every round settles away from it (1.27)
    assert "each client's own" in default["transforms"]  # 'auto' saw the owners' scales apart
    assert math.isfinite(default["rounds_to_1_nat"]) and default["rounds_to_1_nat"] <= 60
