"""The batched engine's multi-output (Hadamard) path computes what the sequential engine computes (1e-10):
per-client marginal likelihood and gradients, a whole FGPR fit round by round, personalised predictions;
on ICM and LMC, one noise or one per output, owners of different sizes holding different outputs."""

import re
import warnings

import gpytorch
import pandas as pd
import pytest
import torch
from gpytorch.kernels import ScaleKernel
from hypothesis import given, settings
from hypothesis import strategies as st

import fedgp
from fedgp.data import Federation
from fedgp.data.outputs import outputs_client
from fedgp.engines.batched import BatchedEngine, BatchedOps, batched_path_reason
from fedgp.engines.hadamard_gp import MULTI_OUTPUT_NOT_FUSED, HadamardBatchedGP
from fedgp.engines.sequential import SequentialOps
from fedgp.errors import InputError
from fedgp.messages import Task
from fedgp.models.multioutput import MultiOutputSpec, output_rows
from fedgp.models.state import HyperState
from fedgp.strategies import FGPR

TOL = 1e-10
T = 3


def _owners(sizes, held, seed=0, n_test=4):
    """Owners of ``sizes`` inputs (1 feature); owner k observes output t at a row with probability
    ``held[k][t]`` (0: it never holds t); test rows are every output at ``n_test`` other inputs."""
    clients = []
    for k, n in enumerate(sizes):
        g = torch.Generator().manual_seed(1000 * seed + k)
        X = torch.rand(n + n_test, 1, generator=g, dtype=torch.float64)
        f = torch.sin(5 * X)
        Y = torch.cat([f, -0.8 * f + 0.3 * X, torch.cos(3 * X)], 1)[:, :T]
        Y = Y + 0.1 * torch.randn(Y.shape, generator=g, dtype=torch.float64)
        train = Y[:n].clone()
        keep = torch.rand(n, T, generator=g, dtype=torch.float64) < torch.tensor(held[k], dtype=torch.float64)
        keep[:2, int(torch.nonzero(torch.tensor(held[k]))[0])] = True  # at least two rows
        train[~keep] = float("nan")
        clients.append(outputs_client(X[:n], train, id=f"owner-{k}", X_test=X[n:], Y_test=Y[n:]))
    return Federation(clients)


SPECS = {
    "icm": lambda: MultiOutputSpec(outputs=T, rank=1),
    "icm-output-noise": lambda: MultiOutputSpec(outputs=T, rank=2, output_noise=True),
    "lmc": lambda: MultiOutputSpec(
        [gpytorch.kernels.RBFKernel(), gpytorch.kernels.MaternKernel(nu=2.5)], outputs=T, rank=1
    ),
    "lmc-periodic-scaled": lambda: MultiOutputSpec(  # a GPyTorch forward, and a ScaleKernel's Gram
        [
            gpytorch.kernels.PeriodicKernel(),
            ScaleKernel(gpytorch.kernels.MaternKernel(nu=1.5)),
        ],
        outputs=T,
        rank=2,
    ),
    "icm-fixed-task-variances": lambda: MultiOutputSpec(outputs=T, fixed=("task_covar_module.var",)),
    "rank0-constant-mean": lambda: MultiOutputSpec(outputs=T, rank=0, mean=gpytorch.means.ConstantMean()),
}
SIZES = [6, 13, 9, 17, 4]
HELD = [(1, 1, 1), (1, 0, 1), (0, 1, 0.5), (0.5, 0.5, 0.5), (1, 0, 0)]  # owner 4 holds output 0 only


@pytest.fixture(scope="module")
def owners():
    return _owners(SIZES, HELD)


def _perturbed(spec, count, seed=0):
    """``count`` states around the spec's initial one, in raw space (each client its own)."""
    g = torch.Generator().manual_seed(seed)
    raw = spec.to_raw(spec.initial_state())
    return HyperState.stack(
        [
            spec.from_raw(raw.map(lambda v, e: v + 0.3 * torch.randn(v.shape, generator=g, dtype=v.dtype)))
            for _ in range(count)
        ]
    )


def _assert_engines_agree_on_gradients(spec, fed):
    spec = spec.for_data(fed)
    states = _perturbed(spec, len(fed))
    engine = BatchedEngine(spec, fed, 0, check=False, chunk_size=2)
    assert isinstance(engine.gp, HadamardBatchedGP)
    ops = BatchedOps(engine, torch.arange(len(fed)), 0)
    loss, grads = ops.gradient(states)
    nll = ops.nll(states)
    model = spec.build()
    for i, client in enumerate(fed):
        ref_loss, ref_grads = SequentialOps(spec, model, client, i, 0, 0).gradient(states.index(i).expand(1))
        assert torch.allclose(loss[i], ref_loss[0], rtol=TOL, atol=TOL)
        assert torch.allclose(nll[i], ref_loss[0], rtol=TOL, atol=TOL)
        for k in ref_grads:
            assert torch.allclose(grads[k][i], ref_grads[k][0], rtol=TOL, atol=TOL), k


@pytest.mark.parametrize("name", list(SPECS))
def test_per_client_likelihood_and_gradients_equal_the_sequential_engines(owners, name):
    _assert_engines_agree_on_gradients(SPECS[name](), owners)


@settings(max_examples=8, deadline=None)
@given(
    sizes=st.lists(st.integers(2, 12), min_size=1, max_size=4),
    held=st.lists(st.tuples(*[st.sampled_from([0.0, 0.5, 1.0])] * T), min_size=4, max_size=4),
    lmc=st.booleans(),
)
def test_any_sizes_and_subsets_of_outputs_give_the_sequential_gradients(sizes, held, lmc):
    held = [h if any(h) else (1.0, 0.0, 0.0) for h in held[: len(sizes)]]
    spec = SPECS["lmc" if lmc else "icm-output-noise"]()
    _assert_engines_agree_on_gradients(spec, _owners(sizes, held, seed=len(sizes), n_test=1))


@pytest.mark.parametrize("name", ["icm", "icm-output-noise", "lmc", "lmc-periodic-scaled"])
def test_an_fgpr_fit_equals_the_sequential_engines_round_by_round(owners, name):
    """State after every round (the history's columns) and the final state, to 1e-10; unequal step
    counts (local_epochs) and chunks that split the owners."""
    spec, strategy = SPECS[name](), FGPR(local_epochs=2, batch_size=5)
    seq = fedgp.fit(spec, owners, strategy, engine="sequential", rounds=3, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", fedgp.errors.FedGPWarning)  # no client-by-client fallback
        bat = fedgp.fit(spec, owners, strategy, engine=fedgp.engines.Batched(chunk_size=2), rounds=3, seed=1)
    assert seq.state.max_relative_difference(bat.state) < TOL
    a, b = seq.history.select_dtypes("number"), bat.history.select_dtypes("number")
    assert any(c.startswith("task_covar_module") for c in a.columns)
    pd.testing.assert_frame_equal(a, b, check_exact=False, rtol=TOL, atol=1e-12)


@pytest.mark.parametrize("name", ["icm-output-noise", "lmc"])
def test_personalised_predictions_equal_the_sequential_posterior(owners, name):
    spec = SPECS[name]()
    result = fedgp.fit(spec, owners, FGPR(local_steps=3), engine="sequential", rounds=2, transforms=None)
    engine = BatchedEngine(result.spec, owners, 0, chunk_size=2, memory_mb=0.01)
    X_new = output_rows(torch.linspace(0, 1, 4, dtype=torch.float64)[:, None], T)
    everyone = torch.arange(len(owners))
    shared, _ = result.strategy.configure_personal(result.server_state, result.context, everyone)
    for ops in engine.chunks(everyone, 0):
        states, _ = result.strategy.personal_state(ops, Task("evaluate", 0, shared))
        at_test, at_x = ops.predict(states), ops.predict(states, X_new, full_cov=True)
        for j, i in enumerate(ops.indices.tolist()):
            ref, ref_x = result.posterior(owners[i].X_test, i), result.posterior(X_new, i, full_cov=True)
            for ours, theirs in ((at_test[j], ref), (at_x[j], ref_x)):
                for field in ("mean", "variance_f", "variance_y"):
                    assert torch.allclose(getattr(ours, field), getattr(theirs, field), rtol=TOL, atol=TOL)
            assert torch.allclose(at_x[j].covariance_f, ref_x.covariance_f, rtol=TOL, atol=TOL)
    with pytest.raises(InputError, match="predict: X_new: output index 3"):
        ops.predict(states, output_rows(X_new[:2, :1], T + 1))  # rows asking for a 4th output of 3


def test_what_the_multi_output_path_cannot_run_is_refused_or_run_client_by_client(owners):
    spec = SPECS["icm"]()
    with pytest.raises(InputError, match="compiled=True cannot run a multi-output"):
        BatchedEngine(spec, owners, 0, compiled=True)
    with pytest.raises(InputError, match="fused=True.*" + re.escape(MULTI_OUTPUT_NOT_FUSED)):
        BatchedEngine(spec, owners, 0, fused=True)
    # a likelihood the Hadamard tensor path does not model: the sequential engine's numbers, client by client
    other = MultiOutputSpec(outputs=T, likelihood=gpytorch.likelihoods.GaussianLikelihoodWithMissingObs())
    with pytest.warns(fedgp.errors.FedGPWarning, match="client by client.*GaussianLikelihoodWithMissingObs"):
        assert BatchedEngine(other, owners, 0).gp is None
    strategy = FGPR(local_steps=2, batch_size=5)
    seq = fedgp.fit(other, owners, strategy, engine="sequential", rounds=2, seed=0)
    bat = fedgp.fit(other, owners, strategy, engine="batched", rounds=2, seed=0)
    assert seq.state.max_relative_difference(bat.state) < TOL


def test_engine_auto_picks_the_batched_engine_for_a_multi_output_spec(owners):
    """The engine's self-check against GPyTorch passes for ICM and LMC (before, ``auto`` chose the
    sequential engine: the batched one would have run client by client)."""
    for name in ("icm", "lmc"):
        spec = SPECS[name]()
        assert batched_path_reason(spec.for_data(owners), owners.n_features) is None
        assert isinstance(fedgp.engines.auto_engine(spec, list(owners)), fedgp.engines.Batched)


def test_float32_minibatches_stay_close_to_float64(owners):
    """The Hadamard path in float32 minibatches (states and optimiser stay float64)."""
    spec, strategy = SPECS["icm-output-noise"](), FGPR(local_steps=3, batch_size=8)
    exact = fedgp.fit(spec, owners, strategy, engine="sequential", rounds=2, seed=0)
    single = fedgp.engines.Batched(minibatch_dtype=torch.float32)
    approx = fedgp.fit(spec, owners, strategy, engine=single, rounds=2, seed=0)
    assert approx.state["task_covar_module.covar_factor"].dtype == torch.float64
    assert exact.state.max_relative_difference(approx.state) < 1e-3
