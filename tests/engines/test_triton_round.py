"""The Triton round (fedgp.engines.triton_round) computes what the CPU's fused round computes, to
1e-10 in float64: the CPU round's first calls in a fit are replayed through Triton's interpreter
(where no GPU is seen; tests/conftest.py sets TRITON_INTERPRET=1 then), over kernels, means,
constraints, optimisers, minibatch draws, unequal clients and several states per client. The kernel
also compiles for an H100/H200 (sm_90) without spilling registers: the interpreter does not check
what the GPU compiler will refuse."""

import os
import subprocess
import sys
import textwrap

import gpytorch
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fedgp
from fedgp import GPSpec
from fedgp.engines import compiled, fused, rounds
from fedgp.errors import InputError
from fedgp.strategies import FGPR, IFCA
from fedgp.strategies.local import SGD, Adam, LocalTraining
from fedgp.synthetic import gp_federation

triton_round = pytest.importorskip("fedgp.engines.triton_round")
pytestmark = [
    pytest.mark.skipif(not triton_round.available(), reason="triton is not installed"),
    pytest.mark.skipif(not compiled.available(), reason="numba (the CPU round) is not installed"),
]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOLERANCE = 1e-10


@pytest.fixture(scope="module")
def unequal():
    return gp_federation(num_clients=5, n=[12, 30, 45, 20, 70], d=3, n_test=4, seed=1)


@pytest.fixture
def cpu_rounds(monkeypatch):
    """The CPU fused round's calls in a fit: (arguments, results)."""
    seen = []
    original = fused.local_round

    def spy(*args, **kwargs):
        out = original(*args, **kwargs)
        seen.append((args, out))
        return out

    monkeypatch.setattr(fused, "local_round", spy)
    return seen


def replay(calls, limit=3):
    """Each recorded CPU round run again by the Triton round, on DEVICE; the largest differences."""
    assert calls, "the fit ran no fused round"
    worst = 0.0
    for args, (theta, loss, info) in calls[:limit]:
        layout, X, y, *rest = args
        ours = triton_round.local_round(layout, X.to(DEVICE), y.to(DEVICE), *rest)
        theta_t, loss_t, info_t = (t.cpu() for t in ours)
        assert np.array_equal(info_t.numpy(), info)
        scale = theta.abs().clamp_min(1.0)
        worst = max(worst, float(((theta_t - theta).abs() / scale).max()))
        assert torch.allclose(loss_t, loss, rtol=TOLERANCE, atol=TOLERANCE)
    return worst


@pytest.mark.parametrize(
    "strategy",
    [
        FGPR(local_steps=4, batch_size=16),
        FGPR(local_epochs=1, batch_size=16),  # unequal step counts
        FGPR(local_epochs=1, batch_size=16, optimizer=SGD(lr=0.5)),  # β/t on the global step
        FGPR(local_steps=3, batch_size=16, optimizer=SGD(lr=0.05, schedule="constant"), average_space="raw"),
        FGPR(local_steps=3, batch_size=24, prox_mu=0.3),
        FGPR(local_steps=2, batch_size=20, minibatch="nearest"),
        FGPR(local_steps=2, batch_size=40, optimizer=Adam(lr=0.1, betas=(0.8, 0.99), eps=1e-6)),
        IFCA(num_clusters=2, aggregation="model", local_steps=2, batch_size=12, restarts=2),
    ],
    ids=["adam", "epochs", "sgd-inverse-t", "sgd-constant", "prox", "nearest", "adam-m64", "ifca"],
)
def test_the_triton_round_replays_the_cpu_rounds(unequal, strategy, cpu_rounds):
    fedgp.fit(unequal.spec, unequal.federation, strategy, rounds=2, seed=3, engine=fedgp.engines.Batched())
    assert replay(cpu_rounds, limit=2) < TOLERANCE


@pytest.mark.parametrize(
    "spec",
    [
        GPSpec(kernel=gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel(nu=1.5, ard_num_dims=3))),
        GPSpec(kernel=gpytorch.kernels.MaternKernel(nu=2.5), mean=gpytorch.means.ConstantMean()),
        GPSpec(
            kernel=gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=3)),
            likelihood=gpytorch.likelihoods.GaussianLikelihood(
                noise_constraint=gpytorch.constraints.GreaterThan(0.03)
            ),
            fixed=["covar_module.outputscale"],
            initial_values={"covar_module.outputscale": 2.0},
        ),
    ],
    ids=["matern32-ard", "matern52-constant-mean", "rbf-fixed-scale-bound"],
)
def test_kernels_means_constraints_and_fixed_parameters(unequal, spec, cpu_rounds):
    fedgp.fit(spec, unequal.federation, FGPR(local_steps=3, batch_size=12, lr=0.08), rounds=2, seed=5)
    assert replay(cpu_rounds, limit=2) < TOLERANCE


def test_the_engine_runs_it_and_agrees_with_the_sequential_engine(unequal, monkeypatch):
    """The batched engine with the Triton round chosen (as on a GPU) fits what the sequential engine
    fits (the engine contract) and what the CPU round fits (1e-10)."""
    strategy = FGPR(local_steps=3, batch_size=12)
    cpu = fedgp.fit(unequal.spec, unequal.federation, strategy, rounds=2, seed=4, engine="batched")
    sequential = fedgp.fit(unequal.spec, unequal.federation, strategy, rounds=2, seed=4, engine="sequential")
    choose = rounds.choose

    def on_triton(*args):
        layout, module = choose(*args)
        return layout, triton_round.__name__ if module is not None else None

    monkeypatch.setattr(rounds, "choose", on_triton)
    ours = fedgp.fit(unequal.spec, unequal.federation, strategy, rounds=2, seed=4, engine="batched")
    assert ours.engine.round_module == triton_round.__name__
    assert cpu.state.max_relative_difference(ours.state) < TOLERANCE
    assert sequential.state.max_relative_difference(ours.state) < 1e-8
    assert np.allclose(cpu.history["train_nll"], ours.history["train_nll"], rtol=TOLERANCE, atol=0)


def test_a_gpu_engine_chooses_the_triton_round_and_says_why_not(unequal, monkeypatch):
    """The choice a CUDA engine makes (checked here without a GPU): Triton's round where it applies;
    without triton, fused=True names what is missing."""

    class GP:
        compiled = False  # the CPU's compiled step is off on a GPU

    cuda = torch.device("cuda")
    layout, module = rounds.choose(unequal.spec, cuda, GP(), torch.float64, None)
    assert module == triton_round.__name__ and layout.names == fused.layout(unequal.spec).names
    monkeypatch.setattr(rounds.importlib.util, "find_spec", lambda name: None)
    assert rounds.choose(unequal.spec, cuda, GP(), torch.float64, None) == (None, None)
    with pytest.raises(InputError, match="needs Triton"):
        rounds.choose(unequal.spec, cuda, GP(), torch.float64, True)


def test_a_failed_factorisation_is_reported_at_the_step_the_cpu_reports_it():
    """Duplicated inputs and a zero noise make K singular: both rounds flag the same rows at the
    same step (the engine then redoes the chunk step by step with GPyTorch's jitter)."""
    spec = GPSpec(
        likelihood=gpytorch.likelihoods.GaussianLikelihood(noise_constraint=gpytorch.constraints.Positive())
    )
    layout = fused.layout(spec)
    g = torch.Generator().manual_seed(0)
    X = torch.rand(8, 2, generator=g, dtype=torch.float64).repeat(2, 1)  # every point twice
    X = torch.cat([X, torch.rand(16, 2, generator=g, dtype=torch.float64)])  # a second, healthy client
    y = torch.randn(32, generator=g, dtype=torch.float64)
    theta = torch.zeros(2, len(layout.names), dtype=torch.float64)
    theta[:, layout.noise] = -800.0  # softplus(-800) = 0 in float64
    args = (
        layout, X, y, torch.tensor([0, 16]), torch.tensor([16, 16]), np.array([11, 12], dtype=np.uint64),
        torch.tensor([2, 2]), torch.tensor([16, 16]), None, torch.tensor([0, 1]), theta,
        LocalTraining(steps=2, batch_size=16, optimizer=Adam(lr=0.05)), 0,
    )  # fmt: skip
    _, _, info = fused.local_round(*args)
    assert info[0] == 1 and info[1] == 0
    _, _, info_t = triton_round.local_round(args[0], X.to(DEVICE), y.to(DEVICE), *args[3:])
    assert info_t.cpu().tolist() == info.tolist()


@settings(max_examples=6)
@given(
    d=st.integers(1, 4),
    m=st.integers(1, 20),
    steps=st.integers(1, 3),
    seed=st.integers(0, 2**31 - 1),
    nu=st.sampled_from([None, 1.5, 2.5]),
    ard=st.booleans(),
)
def test_random_cases_agree_with_the_cpu_round(d, m, steps, seed, nu, ard):
    """Random raw states (softplus inputs from -4 to 4), client sizes from m to 3m, any kernel."""
    dims = d if ard else None
    base = gpytorch.kernels.RBFKernel(ard_num_dims=dims) if nu is None else None
    base = base or gpytorch.kernels.MaternKernel(nu=nu, ard_num_dims=dims)
    spec = GPSpec(kernel=gpytorch.kernels.ScaleKernel(base))
    layout = fused.layout(spec)
    g = torch.Generator().manual_seed(seed)
    sizes = torch.randint(m, 3 * m + 1, (3,), generator=g)
    X = torch.rand(int(sizes.sum()), d, generator=g, dtype=torch.float64)
    y = torch.sin(4 * X.sum(1)) + 0.1 * torch.randn(len(X), generator=g, dtype=torch.float64)
    theta = 8 * torch.rand(3, sum(layout.widths), generator=g, dtype=torch.float64) - 4
    args = (
        layout, X, y, torch.cumsum(sizes, 0) - sizes, sizes, fused.minibatch_keys(seed, 1, torch.arange(3)),
        torch.full((3,), steps), torch.full((3,), m), None, torch.arange(3), theta,
        LocalTraining(steps=steps, batch_size=max(m, 2), optimizer=Adam(lr=0.05)), 1,
    )  # fmt: skip
    theta_c, loss_c, info_c = fused.local_round(*args)
    ours = triton_round.local_round(args[0], X.to(DEVICE), y.to(DEVICE), *args[3:])
    theta_t, loss_t, info_t = (t.cpu() for t in ours)
    assert info_t.tolist() == info_c.tolist()
    if not info_c.any():
        assert torch.allclose(theta_t, theta_c, rtol=TOLERANCE, atol=TOLERANCE)
        assert torch.allclose(loss_t, loss_c, rtol=TOLERANCE, atol=TOLERANCE)


def test_cpu_tensors_need_the_interpreter():
    code = textwrap.dedent(
        """
        import os; os.environ.pop("TRITON_INTERPRET", None)
        from fedgp.engines import triton_round
        from fedgp.errors import InputError
        try:
            triton_round.kernel("cpu")
        except InputError as err:
            print("refused:", err)
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert "refused: the Triton round runs on a CUDA device" in out.stdout


def test_it_compiles_for_an_h100_without_spilling_registers():
    """Triton's compiler and ptxas, run here for sm_90 (H100/H200) in a process without the
    interpreter: every kernel variant compiles, and none spills more than a few values to local
    memory (with too few warps for M = 64 it spills 288-520 bytes: device-memory traffic in the
    innermost loop)."""
    code = textwrap.dedent(
        """
        import pathlib, subprocess, tempfile, triton
        from fedgp.engines import triton_round
        tool = pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        for m, nu, draw, opt in [(32, 0, True, 0), (32, 1, False, 1), (64, 2, True, 2), (16, 0, True, 0)]:
            k = triton_round.compile_for(90, m, 5, 8, nu, draw, opt)
            path = pathlib.Path(tempfile.mkdtemp()) / "round.cubin"
            path.write_bytes(k.asm["cubin"])
            usage = subprocess.run([str(tool), "-res-usage", str(path)], capture_output=True, text=True,
                                   check=True).stdout.strip().splitlines()[-1]
            print(m, nu, draw, opt, usage)
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 4, out.stdout + out.stderr
    for line in lines:  # a stack frame of a few bytes is a spill or two (triton 3.6 at M = 64: 8 bytes)
        assert int(line.split("STACK:")[1].split()[0]) <= 64 and " LOCAL:0 " in line, line
