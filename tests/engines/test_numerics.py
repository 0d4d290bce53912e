"""Numerics that must not depend on the engine: inputs far from the origin, a tiny noise floor.

Stationary kernels are translation-invariant, so X = 1e8 + U(0, 1) is the same problem as U(0, 1);
every engine path (sequential GPyTorch, batched tensor path, batched compiled step) must solve it
and agree. A ``GreaterThan(1e-12)`` noise constraint is a legitimate likelihood: the batched
engine's self-check must accept it and every path must give the same result.
"""

import warnings

import gpytorch
import numpy as np
import pytest
import torch

import fedgp
from fedgp.data import ClientData, Federation
from fedgp.engines import compiled as compiled_step
from fedgp.engines.batched import BatchedEngine, check_against_gpytorch
from fedgp.errors import UnsupportedSpec
from fedgp.strategies import FGPR

PATHS = [fedgp.engines.Sequential(), fedgp.engines.Batched(compiled=False)]
if compiled_step.available():
    PATHS.append(fedgp.engines.Batched(compiled=True))


def _federation(offset: float, seed: int = 0) -> Federation:
    rng = np.random.default_rng(seed)
    clients = []
    for i, n in enumerate((20, 15, 12)):
        X = rng.uniform(size=(n, 2))
        y = np.sin(6 * X[:, 0]) + X[:, 1] + 0.1 * rng.normal(size=n)
        Xt = rng.uniform(size=(5, 2))
        yt = np.sin(6 * Xt[:, 0]) + Xt[:, 1]
        clients.append(ClientData(offset + X, y, id=f"c{i}", X_test=offset + Xt, y_test=yt))
    return Federation(clients)


def _run_every_path(spec, fed):
    out = []
    for engine in PATHS:
        result = fedgp.fit(
            spec, fed, FGPR(local_steps=4, batch_size=8), rounds=3,
            engine=engine, seed=1, transforms=None,  # the raw numerics
        )  # fmt: skip
        mean, var = result.predict(fed.by_id("c1").X_test, client="c1")
        out.append((result.state, mean, var, result.evaluate()[["rmse", "nll"]].to_numpy()))
    return out


def _agree(results, rtol):
    (state0, mean0, var0, eval0), *rest = results
    for state, mean, var, evaluation in rest:
        assert state.allclose(state0, rtol=rtol, atol=0.0)
        torch.testing.assert_close(mean, mean0, rtol=rtol, atol=1e-10)
        torch.testing.assert_close(var, var0, rtol=rtol, atol=1e-10)
        np.testing.assert_allclose(evaluation, eval0, rtol=rtol)


def test_inputs_far_from_the_origin_give_the_same_result_on_every_path():
    spec = fedgp.GPSpec(gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=2)))
    far = _run_every_path(spec, _federation(1e8))
    # GPyTorch divides by the lengthscale before it centres, so its scaled inputs carry an error of
    # about ulp(1e8) / ℓ ≈ 3e-8; the batched paths centre first (exact) and agree with each other.
    _agree(far, rtol=1e-6)
    _agree(far[1:], rtol=1e-10)
    # and it is the problem at the origin, to the precision with which 1e8 + u is stored (~1e-8)
    near = _run_every_path(spec, _federation(0.0))
    assert far[0][0].allclose(near[0][0], rtol=1e-5)


@pytest.mark.parametrize("nu", [None, 2.5])
def test_a_tiny_noise_floor_passes_the_self_check_and_agrees_on_every_path(nu):
    base = gpytorch.kernels.RBFKernel() if nu is None else gpytorch.kernels.MaternKernel(nu=nu)
    spec = fedgp.GPSpec(
        gpytorch.kernels.ScaleKernel(base),
        likelihood=gpytorch.likelihoods.GaussianLikelihood(
            noise_constraint=gpytorch.constraints.GreaterThan(1e-12)
        ),
        initial_values={"likelihood.noise_covar.noise": 1e-8},
    )
    for options in ({"compiled": False}, {"compiled": True} if compiled_step.available() else {}):
        check_against_gpytorch(spec, **options)  # raised "priors, active_dims ..." before
    fed = _federation(0.0)
    BatchedEngine(spec, fed, 0)  # the engine's own construction runs the check
    _agree(_run_every_path(spec, fed), rtol=1e-6)


class _FirstRowKernel(gpytorch.kernels.Kernel):
    """An RBF kernel that reads only the first of a batch of lengthscales: right for one client,
    wrong for every other client of a parameter batch."""

    has_lengthscale = True

    def forward(self, x1, x2, diag=False, **params):
        ls = self.lengthscale.reshape(-1)[0]
        return torch.exp(-0.5 * self.covar_dist(x1 / ls, x2 / ls, square_dist=True, diag=diag))


def test_the_self_check_names_what_differs_and_why():
    spec = fedgp.GPSpec(gpytorch.kernels.ScaleKernel(_FirstRowKernel()))
    message = (
        r"does not reproduce GPyTorch for this spec: the NLL, .*lengthscale differ on a well-conditioned"
    )
    with pytest.raises(UnsupportedSpec, match=message):
        check_against_gpytorch(spec)
    with pytest.warns(UserWarning, match=message):  # the engine falls back to GPyTorch and says why
        BatchedEngine(spec, _federation(0.0), 0)


def _duplicated_inputs(seed: int) -> Federation:
    """benchmarks/ill_conditioned.py's clients with every input twice: K is singular but for σ²."""
    rng = np.random.default_rng(seed)
    clients = []
    for i, n in enumerate((20, 15, 12)):
        X = np.concatenate([rng.uniform(size=((n + 1) // 2, 2))] * 2)[:n]
        clients.append(ClientData(X, np.sin(6 * X[:, 0]) + X[:, 1] + 0.1 * rng.normal(size=n), id=f"c{i}"))
    return Federation(clients)


def _parting(floor: float, strategy: FGPR, rounds: int, seeds=range(5)) -> dict[str, float]:
    """Per engine path, the largest relative difference of its final state from sequential's over
    ``seeds``, on duplicated inputs under a ``GreaterThan(floor)`` noise constraint."""
    spec = fedgp.GPSpec(
        gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()),
        likelihood=gpytorch.likelihoods.GaussianLikelihood(
            noise_constraint=gpytorch.constraints.GreaterThan(floor)
        ),
        initial_values={"likelihood.noise_covar.noise": max(1e-8, 10 * floor)},
    )
    worst: dict[str, float] = {}
    for seed in seeds:
        fed = _duplicated_inputs(seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a client-round that fails on one path is the point
            reference, *others = (
                fedgp.fit(
                    spec,
                    fed,
                    strategy,
                    rounds=rounds,
                    engine=engine,
                    seed=1,
                    transforms=None,
                    callbacks=[fedgp.run.Progress(False)],
                ).state  # fmt: skip
                for engine in PATHS
            )
        for engine, state in zip(PATHS[1:], others):
            name = f"compiled={engine.compiled}"
            gap = max(float(((state[k] - reference[k]).abs() / reference[k].abs()).max()) for k in reference)
            worst[name] = max(worst.get(name, 0.0), gap)
    return worst


SMALL = FGPR(local_steps=4, batch_size=8)


def test_duplicated_inputs_at_the_default_noise_floor_agree_to_1e_8():
    """docs/guarantees.md, 'How far the engines agree': the 1e-8 holds for duplicated inputs at the
    default noise floor (measured 4e-12)."""
    for strategy, rounds in ((SMALL, 3), (FGPR(), 5)):
        assert max(_parting(1e-4, strategy, rounds).values()) < 1e-8


def test_duplicated_inputs_under_a_tiny_noise_floor_part_within_the_documented_bounds():
    """docs/guarantees.md: under a 1e-12 floor FGPR() parts by under 1e-3 (measured 9.1e-5); with
    4 steps of 8 points the plain SGD step throws the lengthscale to 1e-35 and the paths part by
    under 1 (measured 0.65 tensor, 0.011 compiled). Issue 51 measured 1.6e-6 to 4.5e-6."""
    assert max(_parting(1e-12, FGPR(), 5).values()) < 1e-3
    for floor in (1e-6, 1e-8, 1e-12):
        assert max(_parting(floor, SMALL, 3).values()) < 1
