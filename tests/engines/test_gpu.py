"""The batched engine's tensor path on a CUDA GPU (issue 18 part 5): RBF and Matérn, float64 and
float32, held to the sequential engine on the CPU. Skipped, with the reason, where no GPU is seen;
``benchmarks/gpu_batched.py`` measures its speed."""

import gpytorch
import pytest
import torch

import fedgp
from fedgp import GPSpec
from fedgp.engines.batched import GPU_CHUNK_SIZE
from fedgp.strategies import FGPR
from fedgp.synthetic import gp_federation

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none seen by torch)")

KERNELS = {
    "rbf": lambda: gpytorch.kernels.RBFKernel(ard_num_dims=3),
    "matern52": lambda: gpytorch.kernels.MaternKernel(nu=2.5, ard_num_dims=3),
    "matern12": lambda: gpytorch.kernels.MaternKernel(nu=0.5, ard_num_dims=3),
}
# float64: the same arithmetic as the CPU engines up to rounding; float32: rounding of ~1e-7 per
# operation, compounded over 4 rounds of 3 Adam steps (the CPU's own float32 agrees with float64 to 1e-3).
TOLERANCE = {torch.float64: 1e-8, torch.float32: 1e-3}


@pytest.fixture(scope="module")
def draws():
    return gp_federation(num_clients=6, n=[20, 30, 25, 40, 33, 18], d=3, n_test=6, seed=0)


def fit_on(device, kernel, dtype, federation, engine="batched"):
    spec = GPSpec(kernel=gpytorch.kernels.ScaleKernel(KERNELS[kernel]()), dtype=dtype)
    return fedgp.fit(
        spec,
        federation,
        FGPR(local_steps=3, batch_size=16),
        engine=fedgp.engines.Batched(device=device) if engine == "batched" else engine,
        rounds=4,
        seed=2,
    )


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_gpu_tensor_path_matches_the_sequential_engine(draws, kernel, dtype):
    gpu = fit_on("cuda", kernel, dtype, draws.federation)
    assert gpu.engine.X.is_cuda and all(v.dtype == dtype for v in gpu.state.values())
    assert gpu.engine.chunk_size == GPU_CHUNK_SIZE  # a GPU's default: large chunks
    reference = fit_on("cpu", kernel, torch.float64, draws.federation, engine="sequential")
    to64 = gpu.state.map(lambda v, e: v.double())
    assert to64.max_relative_difference(reference.state) < TOLERANCE[dtype]
    mean, var = gpu.predict(draws.federation[0].X_test, client=0)
    ref_mean, ref_var = reference.predict(draws.federation[0].X_test, client=0)
    assert mean.device.type == "cpu"  # predictions come back to the caller's side
    assert torch.allclose(mean.double(), ref_mean, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])
    assert torch.allclose(var.double(), ref_var, rtol=TOLERANCE[dtype])


def test_the_triton_round_runs_on_the_gpu_and_matches_the_cpu_round(draws):
    """float64 RBF/Matérn on a GPU with triton: the whole local round is one Triton program per client
    (fedgp.engines.triton_round), 1e-10 from the CPU's fused round (issue 34)."""
    triton_round = pytest.importorskip("fedgp.engines.triton_round")
    if not triton_round.available():
        pytest.skip("triton is not installed")
    for kernel in ("rbf", "matern52"):
        gpu = fit_on("cuda", kernel, torch.float64, draws.federation)
        assert gpu.engine.round_module == triton_round.__name__
        cpu = fit_on("cpu", kernel, torch.float64, draws.federation)
        assert cpu.state.max_relative_difference(gpu.state) < 1e-10
