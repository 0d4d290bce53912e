"""FGPR recovers known hyper-parameters, matches centralised training, personalises."""

import numpy as np
import pytest
import torch

import fedgp
from fedgp.models import fit_mle
from fedgp.strategies import FGPR
from fedgp.synthetic import gp_federation, sin_personalisation

THETA = {
    "covar_module.outputscale": 2.0,
    "likelihood.noise_covar.noise": 0.1,
    "covar_module.base_kernel.lengthscale": [[0.3, 0.5]],
}
KEYS = ["covar_module.outputscale", "likelihood.noise_covar.noise"]


@pytest.fixture(scope="module")
def draws():
    return gp_federation(num_clients=20, n=250, d=2, theta=THETA, seed=0)


@pytest.fixture(scope="module")
def fgpr_run(draws):
    strategy = FGPR(local_steps=5, batch_size=64, lr=0.05)
    return fedgp.fit(draws.spec, draws.federation, strategy, rounds=100, seed=0, transforms=None)


def sq_error(row):
    return sum((row[k] - THETA[k]) ** 2 for k in KEYS)


def test_fgpr_recovers_outputscale_and_noise(fgpr_run):
    final = fgpr_run.state
    for k in KEYS:
        assert abs(float(final[k]) - THETA[k]) / THETA[k] < 0.25, k


def test_fgpr_error_at_round_R_is_a_quarter_of_round_5(fgpr_run):
    h = fgpr_run.history
    assert sq_error(h.iloc[-1]) <= 0.25 * sq_error(h.iloc[4])


def test_fgpr_agrees_with_centralised_training_on_the_same_likelihoods(fgpr_run, draws):
    central, _ = fit_mle(draws.spec, [(c.X, c.y) for c in draws.federation])
    for name in central:
        ours, theirs = fgpr_run.state[name], central[name]
        assert torch.allclose(ours, theirs, rtol=0.1), (name, ours, theirs)


def test_personalisation_sin_minus_sin():
    fed = sin_personalisation(n=100, n_test=50)
    result = fedgp.fit(fedgp.GPSpec(), fed, FGPR.authors(local_steps=5, batch_size=20, lr=0.1), rounds=60)
    per_client = result.evaluate()
    assert (per_client["rmse"] < 0.1).all()
    # the best single global mean function is f = 0: its RMSE is the RMS of sin, ~0.7
    best_global = [float(c.y_test.pow(2).mean().sqrt()) for c in fed]
    assert min(best_global) > 0.55
    # predictions are personal: same inputs, opposite answers
    X = torch.linspace(1, 9, 7, dtype=torch.float64)[:, None]
    m0, _ = result.predict(X, client="sin")
    m1, _ = result.predict(X, client="-sin")
    assert torch.allclose(m0, torch.sin(X[:, 0]), atol=0.05) and torch.allclose(m1, -m0, atol=1e-8)


@pytest.mark.parametrize("sampling", ["weighted", "uniform"])
def test_partial_participation_converges(draws, sampling):
    strategy = FGPR(local_steps=5, batch_size=64, lr=0.05, clients_per_round=5, sampling=sampling)
    result = fedgp.fit(draws.spec, draws.federation, strategy, rounds=80, seed=1, transforms=None)
    h = result.history
    assert sq_error(h.iloc[-1]) <= 0.25 * sq_error(h.iloc[4])
    for k in KEYS:
        assert abs(float(result.state[k]) - THETA[k]) / THETA[k] < 0.3, k


def test_sgd_inverse_t_and_raw_averaging_run_and_improve(draws):
    strategy = FGPR(
        local_steps=5, batch_size=64, optimizer="sgd", lr=2.0, average_space="raw", server_optimizer=None
    )
    result = fedgp.fit(draws.spec, draws.federation[:5], strategy, rounds=30, transforms=None)
    h = result.history
    assert h["train_nll"].iloc[-5:].mean() < h["train_nll"].iloc[0] - 0.2


def test_partial_participation_sampling_is_proportional_to_size():
    from fedgp.messages import ServerContext
    from fedgp.rng import generator
    from fedgp.strategies.base import sample_participants

    sizes = torch.tensor([10, 30, 60])
    ctx = ServerContext(None, sizes, sizes / sizes.sum(), [0, 1, 2], 0)
    counts = np.zeros(3)
    for r in range(400):
        chosen, w = sample_participants(ctx, 10, "weighted", generator(0, "configure", r))
        counts += np.bincount(chosen.numpy(), minlength=3)
        assert torch.allclose(w, torch.full((10,), 0.1, dtype=torch.float64))
    assert np.allclose(counts / counts.sum(), [0.1, 0.3, 0.6], atol=0.02)
