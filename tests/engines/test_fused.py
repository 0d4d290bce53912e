"""The fused local round (fedgp.engines.fused) computes what the sequential engine and the
step-by-step batched path compute, draws the same minibatches, falls back where it does not apply,
and gives the same numbers on any number of threads."""

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import gpytorch
import numpy as np
import pytest
import torch

import fedgp
from fedgp import GPSpec
from fedgp.engines import compiled, fused
from fedgp.engines.batched import BatchedEngine
from fedgp.rng import client_keys, client_uniform, uniform_minibatches
from fedgp.strategies import FGPR, IFCA
from fedgp.strategies.local import SGD, Adam
from fedgp.synthetic import gp_federation

pytestmark = pytest.mark.skipif(not compiled.available(), reason="numba is not installed")

RTOL = 1e-8


def run(spec, fed, strategy, rounds=3, engine="batched", **options):
    if engine == "batched":
        engine = fedgp.engines.Batched(**options)
    return fedgp.fit(spec, fed, strategy, rounds=rounds, seed=3, engine=engine)


@pytest.fixture(scope="module")
def unequal():
    return gp_federation(num_clients=11, n=[12, 30, 45, 70, 18, 90, 25, 9, 33, 64, 41], d=3, n_test=4, seed=1)


@pytest.fixture
def calls(monkeypatch):
    """Counts the fused rounds actually run (and not abandoned for the step-by-step path)."""
    seen = {"fused": 0, "stepwise": 0}
    original = fused.local_round

    def spy(*args, **kwargs):
        seen["fused"] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(fused, "local_round", spy)
    original_step = BatchedEngine.ops

    def ops(self, clients, rnd):
        out = original_step(self, clients, rnd)
        stepwise = type(out)._train_stepwise

        def counted(*args, **kwargs):
            seen["stepwise"] += 1
            return stepwise(out, *args, **kwargs)

        out._train_stepwise = counted
        return out

    monkeypatch.setattr(BatchedEngine, "ops", ops)
    return seen


@pytest.mark.parametrize(
    "strategy",
    [
        FGPR(local_steps=5, batch_size=16),
        FGPR(local_epochs=1, batch_size=16),  # unequal step counts
        FGPR(local_epochs=1, batch_size=16, optimizer=SGD(lr=0.5)),  # β/t on the global step
        FGPR(local_steps=3, batch_size=16, optimizer=SGD(lr=0.05, schedule="constant"), average_space="raw"),
        FGPR(local_steps=3, batch_size=24, clients_per_round=6, sampling="weighted", prox_mu=0.3),
        FGPR(local_epochs=2, batch_size=20, minibatch="nearest"),
        FGPR(local_steps=4, batch_size=64, optimizer=Adam(lr=0.1, betas=(0.8, 0.99), eps=1e-6)),
        IFCA(num_clusters=2, aggregation="model", local_epochs=1, batch_size=16, restarts=2),
    ],
    ids=[
        "adam",
        "epochs",
        "sgd-inverse-t",
        "sgd-constant-raw",
        "partial-prox",
        "nearest",
        "adam-m64",
        "ifca",
    ],
)
def test_fused_round_equals_sequential_and_stepwise(unequal, strategy, calls):
    seq = run(unequal.spec, unequal.federation, strategy, engine="sequential")
    stepwise = run(unequal.spec, unequal.federation, strategy, fused=False, chunk_size=5)
    assert calls["fused"] == 0 and calls["stepwise"] > 0
    stepwise_rounds = calls["stepwise"]
    ours = run(unequal.spec, unequal.federation, strategy, fused=True, chunk_size=5)
    assert calls["fused"] > 0 and calls["stepwise"] == stepwise_rounds  # every round ran fused
    assert seq.state.max_relative_difference(ours.state) < RTOL
    assert stepwise.state.max_relative_difference(ours.state) < 1e-10
    assert np.allclose(seq.history["train_nll"], ours.history["train_nll"], rtol=RTOL, atol=1e-12)


@pytest.mark.parametrize(
    "spec",
    [
        GPSpec(kernel=gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel(nu=1.5, ard_num_dims=2))),
        GPSpec(kernel=gpytorch.kernels.MaternKernel(nu=2.5), mean=gpytorch.means.ConstantMean()),
        GPSpec(
            kernel=gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=2)),
            likelihood=gpytorch.likelihoods.GaussianLikelihood(
                noise_constraint=gpytorch.constraints.GreaterThan(0.03)
            ),
            fixed=["covar_module.outputscale"],
            initial_values={"covar_module.outputscale": 2.0},
        ),
    ],
    ids=["matern32-ard", "matern52-constant-mean", "rbf-fixed-scale-bound"],
)
def test_kernels_means_constraints_and_fixed_parameters(spec, calls):
    draws = gp_federation(num_clients=9, n=[20, 33, 15, 40, 28, 19, 50, 22, 31], d=2, seed=5)
    strategy = FGPR(local_epochs=1, batch_size=12, lr=0.08)
    seq = run(spec, draws.federation, strategy, engine="sequential")
    ours = run(spec, draws.federation, strategy, fused=True)
    assert calls["fused"] > 0 and calls["stepwise"] == 0
    assert seq.state.max_relative_difference(ours.state) < RTOL
    if "covar_module.outputscale" not in spec.trainable_names and "covar_module.outputscale" in spec.names:
        assert torch.equal(ours.state["covar_module.outputscale"], torch.tensor(2.0, dtype=torch.float64))


def test_the_compiled_draw_is_fedgp_rng_bit_for_bit():
    draw = fused.kernels().draw_uniform
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(2, 500))
        m = int(rng.integers(1, min(n, 64) + 1))
        s, steps, key = int(rng.integers(0, 6)), 6, int(rng.integers(0, 10**6))
        u = client_uniform(7, "minibatch", 3, [key], (steps, m))[0]
        expected = uniform_minibatches(u, torch.full((steps,), n), m)[s]
        out, top = np.empty(m, dtype=np.int64), np.empty(m, dtype=np.int64)
        draw(client_keys(7, "minibatch", 3, [key])[0], n, m, s, out, top)
        assert np.array_equal(out, expected.numpy())


@pytest.mark.parametrize(
    "spec,why",
    [
        (GPSpec(kernel=gpytorch.kernels.ScaleKernel(gpytorch.kernels.PeriodicKernel())), "RBF or Matérn"),
        (
            GPSpec(kernel=gpytorch.kernels.RBFKernel(lengthscale_prior=gpytorch.priors.GammaPrior(3.0, 6.0))),
            "priors",
        ),
        (GPSpec(dtype=torch.float32), "float64"),
        (GPSpec(mean=gpytorch.means.LinearMean(2)), "ZeroMean or ConstantMean"),
        (
            GPSpec(
                likelihood=gpytorch.likelihoods.GaussianLikelihood(
                    noise_constraint=gpytorch.constraints.Interval(1e-4, 1.0)
                )
            ),
            "softplus",
        ),
    ],
    ids=["periodic", "prior", "float32", "linear-mean", "interval"],
)
def test_unsupported_specs_fall_back_to_the_stepwise_path(spec, why, calls):
    draws = gp_federation(num_clients=4, n=[20, 14, 25, 18], d=2, seed=2)
    assert why in fused.layout(spec)
    engine = BatchedEngine(spec, draws.federation, 0)
    assert engine.fused is None
    with pytest.raises(ValueError, match="fused=True: the fused local round cannot run here"):
        BatchedEngine(spec, draws.federation, 0, fused=True)
    strategy = FGPR(local_steps=3, batch_size=8, lr=0.02)
    seq = run(spec, draws.federation, strategy, engine="sequential", rounds=2)
    ours = run(spec, draws.federation, strategy, rounds=2)
    assert calls["fused"] == 0 and calls["stepwise"] > 0
    assert seq.state.max_relative_difference(ours.state) < (1e-8 if spec.dtype == torch.float64 else 1e-4)


def test_rounds_it_cannot_run_fall_back(calls):
    """Minibatches over 64 points and float32 minibatches take the step-by-step path."""
    draws = gp_federation(num_clients=3, n=[90, 100, 80], d=2, seed=3)
    strategy = FGPR(local_steps=2, batch_size=70)
    seq = run(draws.spec, draws.federation, strategy, engine="sequential", rounds=2)
    ours = run(draws.spec, draws.federation, strategy, rounds=2)
    assert calls["fused"] == 0 and calls["stepwise"] > 0
    assert seq.state.max_relative_difference(ours.state) < RTOL
    assert BatchedEngine(draws.spec, draws.federation, 0, minibatch_dtype=torch.float32).fused is None
    assert BatchedEngine(draws.spec, draws.federation, 0, compiled=False).fused is None


def test_a_failed_cholesky_redoes_the_round_step_by_step_with_jitter(calls):
    """Duplicated inputs, an outputscale of 1e6 and a noise of 1e-11 need GPyTorch's jitter: the fused round
    reports the failure and the chunk is redone on the step-by-step path, which adds it (as the
    sequential engine does), with that path's numbers exactly. One local step: what a second step
    from a matrix of condition 1e17 meets depends on the rounding of the first (the last bits of a
    Cholesky's pivots), which the test is not about."""
    g = torch.Generator().manual_seed(0)
    clients = []
    for i in range(3):
        X = torch.rand(6, 1, generator=g, dtype=torch.float64).repeat(3, 1)
        clients.append(fedgp.data.ClientData(X, torch.randn(18, generator=g, dtype=torch.float64), id=i))
    fed = fedgp.data.Federation(clients)
    spec = GPSpec(
        likelihood=gpytorch.likelihoods.GaussianLikelihood(
            noise_constraint=gpytorch.constraints.GreaterThan(1e-12)
        ),
        initial_values={"likelihood.noise_covar.noise": 1e-11, "covar_module.outputscale": 1e6},
    )
    strategy = FGPR(local_steps=1, batch_size=12, lr=1e-3)
    kwargs = {"transforms": None}
    ours = fedgp.fit(spec, fed, strategy, engine="batched", rounds=1, seed=3, **kwargs)
    assert calls["fused"] == 1 and calls["stepwise"] == 1
    stepwise = fedgp.fit(
        spec, fed, strategy, engine=fedgp.engines.Batched(fused=False), rounds=1, seed=3, **kwargs
    )
    assert calls["fused"] == 1 and calls["stepwise"] == 2
    for key in ours.state:
        assert torch.equal(ours.state[key], stepwise.state[key])


def test_same_numbers_on_one_or_two_threads(unequal):
    """Each tile's numbers depend on its own clients only: the split over threads changes nothing."""
    strategy = IFCA(num_clusters=2, aggregation="model", local_epochs=1, batch_size=16, restarts=2)
    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            results.append(run(unequal.spec, unequal.federation, strategy, fused=True))
    finally:
        torch.set_num_threads(before)
    for other in results[1:]:
        for key in results[0].state:
            assert torch.equal(results[0].state[key], other.state[key])


def test_run_tiles_covers_every_tile_once_on_any_number_of_threads():
    seen = []

    def record(t0, t1):
        seen.extend(range(t0, t1))

    for threads in (1, 2, 3, 8, 50):
        seen.clear()
        compiled.run_tiles(record, 13, threads=threads)
        assert sorted(seen) == list(range(13))


def test_a_batched_fit_leaves_the_thread_settings_and_no_thread_pool_behind():
    """After a batched fit, torch's thread count is what the user set and numba's own (OpenMP) pool
    was never started: nothing keeps running or changes the torch work that follows. Checked in a
    fresh process, where nothing else has started numba's pool."""
    code = textwrap.dedent(
        """
        import torch
        torch.set_num_threads(1)
        import fedgp, numba
        from numba.np.ufunc import parallel
        draws = fedgp.synthetic.gp_federation(num_clients=20, n=40, d=2, seed=0)
        for threads in (1, 2):
            torch.set_num_threads(threads)
            fedgp.fit(draws.spec, draws.federation, fedgp.strategies.FGPR(local_steps=2, batch_size=16),
                      rounds=2, engine=fedgp.engines.Batched(chunk_size=8))  # 1 thread: fused; 2: tiles
            ifca = fedgp.strategies.IFCA(num_clusters=2, lr=0.05, gradient_batch_size=16)  # the compiled step
            fedgp.fit(draws.spec, draws.federation, ifca, rounds=1, engine="batched")
            assert torch.get_num_threads() == threads, torch.get_num_threads()
        assert not parallel._is_initialized, "numba's parallel pool was started"
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]


def test_the_compiled_round_closes_over_no_compiled_function():
    """numba keys a cached closure by its captured values, and a compiled function pickles
    differently in every process: a round that closed over one missed numba's on-disk cache and was
    compiled again in every process (about 3 s each)."""
    import numba

    captured = [cell.cell_contents for cell in fused.kernels().local_round.py_func.__closure__ or ()]
    assert captured  # the constants it does capture (the tile width)
    assert not any(isinstance(value, numba.core.dispatcher.Dispatcher) for value in captured)


def test_the_compiled_step_closes_over_no_compiled_function():
    """As the round: the step-by-step path's compiled step hits numba's cache in a new process."""
    import numba

    captured = [cell.cell_contents for cell in compiled.kernels().step.py_func.__closure__ or ()]
    assert not any(isinstance(value, numba.core.dispatcher.Dispatcher) for value in captured)


def test_an_edit_of_the_gp_step_reaches_the_cached_round(tmp_path):
    """The fused round (fused.py) has compiled.py's GP step compiled into it; numba stamps a cache
    with the defining file only, so after an edit of compiled.py alone the cached round kept the
    old step (silently). Here, in a copy of the package: a round cached, compiled.py's loss halved,
    and a new process must see the halved loss; a third process hits the cache (writes nothing)."""
    package = tmp_path / "fedgp"
    shutil.copytree(Path(fedgp.__file__).parent, package, ignore=shutil.ignore_patterns("__pycache__"))
    code = textwrap.dedent(
        """
        import json, sys, torch
        sys.path.insert(0, sys.argv[1])
        import fedgp
        from fedgp.engines import fused
        from fedgp.strategies.local import LocalTraining
        assert fedgp.__file__.startswith(sys.argv[1]), fedgp.__file__
        layout = fused.layout(fedgp.GPSpec())
        X = torch.rand(40, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        theta = torch.zeros(2, sum(layout.widths), dtype=torch.float64)
        _, loss, _ = fused.local_round(
            layout, X, torch.sin(3 * X.sum(1)), torch.tensor([0, 20]), torch.tensor([20, 20]),
            fused.minibatch_keys(0, 0, torch.arange(2)), torch.tensor([2, 2]), torch.tensor([8, 8]), None,
            torch.arange(2), theta, LocalTraining(steps=2, batch_size=8), 0,
        )
        print(json.dumps(loss.tolist()))
        """
    )

    def loss():
        run = [sys.executable, "-c", code, str(tmp_path)]
        out = subprocess.run(run, capture_output=True, text=True, timeout=600, check=True)
        return np.array(json.loads(out.stdout.strip().splitlines()[-1]))

    def cache_files():
        files = (package / "engines" / "__pycache__").glob("fused*local_round*")
        return {p.name: p.stat().st_mtime_ns for p in files}

    before = loss()
    step = package / "engines" / "compiled.py"
    source = step.read_text()
    assert source.count("    out[0, @] = 0.5 * (p@") == 1
    step.write_text(source.replace("    out[0, @] = 0.5 * (p@", "    out[0, @] = 0.25 * (p@"))
    assert np.allclose(loss(), before / 2, rtol=1e-14)
    written = cache_files()
    assert written and np.allclose(loss(), before / 2, rtol=1e-14)
    assert cache_files() == written
