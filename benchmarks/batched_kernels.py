"""Why the batched engine is built the way it is: the alternatives, timed side by side.

    .venv/bin/python benchmarks/batched_kernels.py                # B = 1,000 clients, M = 32, d = 5
    .venv/bin/python benchmarks/batched_kernels.py --compile      # also torch.compile (slow to compile)

One local step of B clients (forward + backward of the per-point exact NLL, RBF-ARD kernel), done
five ways, each timed as the median of 15 runs, with 1 and 2 torch threads:

1. ``gpytorch_batch``: GPyTorch batch mode — one ``ExactGP`` with ``batch_shape=[B]`` modules,
   ``ExactMarginalLogLikelihood``, ``loss.sum().backward()`` (the documented way to train many
   independent GPs at once);
2. ``autograd_chol``: GPyTorch's kernel ``forward`` on batched parameters, autograd through
   ``torch.linalg.cholesky`` and ``solve_triangular``;
3. ``fused_trsm_f64``: the fused ``StationaryGram`` with an NLL that forms the triangular inverse
   L⁻¹ (``solve_triangular``) and K⁻¹ = L⁻ᵀL⁻¹ by a batched matmul (the engine's first version);
4. ``fused_f64``: what the engine does — the fused ``StationaryGram`` and ``GaussianNLL``, which
   forms K⁻¹ by ``torch.cholesky_inverse`` and has an elementwise backward, float64;
5. ``fused_f32``: (4) in float32 (``fedgp.engines.Batched(minibatch_dtype=torch.float32)``);
6. ``compiled_gram`` (``--compile``): (4) with the Gram forward compiled by ``torch.compile``.

Prints milliseconds per step and the speed-up over GPyTorch batch mode, and writes
results/benchmarks/batched_kernels.csv (``threads, case, ms_per_step, speedup_vs_gpytorch_batch``).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from pathlib import Path

import gpytorch
import torch

from fedgp.engines.tensor_gp import BatchedGP, GaussianNLL, StationaryGram, cholesky
from fedgp.synthetic.draws import gp_spec

ROOT = Path(__file__).resolve().parents[1]


class TriangularInverseNLL(torch.autograd.Function):
    """The alternative to ``GaussianNLL``: K⁻¹ as L⁻ᵀL⁻¹ from a triangular solve against I."""

    @staticmethod
    def forward(ctx, K, r, n, client_ids):
        L = cholesky(K, client_ids)
        eye = torch.eye(K.shape[-1], dtype=K.dtype).expand_as(K)
        L_inv = torch.linalg.solve_triangular(L, eye, upper=False)
        beta = (L_inv @ r.unsqueeze(-1)).squeeze(-1)
        logdet = 2 * torch.log(torch.diagonal(L, dim1=-2, dim2=-1)).sum(-1)
        ctx.save_for_backward(L_inv, beta, n)
        return 0.5 * ((beta * beta).sum(-1) + logdet + n * math.log(2 * math.pi)) / n

    @staticmethod
    def backward(ctx, grad):
        L_inv, beta, n = ctx.saved_tensors
        scale = (grad / n).reshape(-1, 1)
        alpha = (L_inv.transpose(-1, -2) @ beta.unsqueeze(-1)).squeeze(-1)
        half_c = (0.5 * scale).unsqueeze(-1)
        grad_K = torch.baddbmm(
            L_inv.transpose(-1, -2) @ (L_inv * half_c),
            (alpha * half_c.squeeze(-1)).unsqueeze(-1),
            alpha.unsqueeze(-2),
            alpha=-1.0,
        )
        return grad_K, scale * alpha, None, None


def timed(fn, repeats: int = 15) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--m", type=int, default=32)
    parser.add_argument("--d", type=int, default=5)
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--out", default=str(ROOT / "results" / "benchmarks" / "batched_kernels.csv"))
    args = parser.parse_args()
    B, M, d = args.clients, args.m, args.d
    g = torch.Generator().manual_seed(0)
    X = torch.rand(B, M, d, generator=g, dtype=torch.float64)
    y = torch.randn(B, M, generator=g, dtype=torch.float64)
    spec = gp_spec(d, "rbf")
    gp = BatchedGP(spec)
    raw0 = {k: v.expand(B, *v.shape).clone() for k, v in spec.to_raw(spec.initial_state()).items()}
    ids = list(range(B))

    def leaves(dtype=torch.float64):
        return {k: v.to(dtype).requires_grad_() for k, v in raw0.items()}

    # 1. GPyTorch batch mode
    class BatchGP(gpytorch.models.ExactGP):
        def __init__(self):
            likelihood = gpytorch.likelihoods.GaussianLikelihood(batch_shape=torch.Size([B]))
            super().__init__(X, y, likelihood)
            self.mean_module = gpytorch.means.ZeroMean(batch_shape=torch.Size([B]))
            self.covar_module = gpytorch.kernels.ScaleKernel(
                gpytorch.kernels.RBFKernel(ard_num_dims=d, batch_shape=torch.Size([B])),
                batch_shape=torch.Size([B]),
            )

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))

    batch_model = BatchGP().double()
    batch_model.train()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(batch_model.likelihood, batch_model)

    def gpytorch_batch():
        batch_model.zero_grad()
        with gpytorch.settings.max_cholesky_size(10**9):
            (-mll(batch_model(X), y)).sum().backward()

    # 2. autograd through Cholesky with GPyTorch's kernel forward
    def autograd_chol():
        raw = leaves()
        K = gp.kernel(raw, X, X) + gp.noise_variance(raw).reshape(-1, 1, 1) * torch.eye(M, dtype=X.dtype)
        L = torch.linalg.cholesky(K)
        alpha = torch.linalg.solve_triangular(L, y.unsqueeze(-1), upper=False).squeeze(-1)
        loss = (
            0.5 * ((alpha * alpha).sum(-1) + 2 * torch.log(torch.diagonal(L, dim1=-2, dim2=-1)).sum(-1)) / M
        )
        torch.autograd.grad(loss.sum(), list(raw.values()))

    # 3. fused Gram, triangular-inverse NLL
    n_rows = torch.full((B,), float(M), dtype=X.dtype)

    def fused_trsm():
        raw = leaves()
        loss = TriangularInverseNLL.apply(gp.train_covariance(raw, X, None), y, n_rows, ids)
        torch.autograd.grad(loss.sum(), list(raw.values()))

    # 4./5. the engine's fused path
    def fused(dtype):
        Xd, yd = X.to(dtype), y.to(dtype)

        def step():
            raw = leaves(dtype)
            torch.autograd.grad(gp.nll(raw, Xd, yd, None, ids).sum(), list(raw.values()))

        return step

    cases = {
        "gpytorch_batch": gpytorch_batch,
        "autograd_chol": autograd_chol,
        "fused_trsm_f64": fused_trsm,
        "fused_f64": fused(torch.float64),
        "fused_f32": fused(torch.float32),
    }

    if args.compile:
        compiled = torch.compile(
            StationaryGram.forward.__func__
            if hasattr(StationaryGram.forward, "__func__")
            else StationaryGram.forward
        )

        class CompiledGram(StationaryGram):
            @staticmethod
            def forward(ctx, Z, outputscale, noise, nu):
                return compiled(ctx, Z, outputscale, noise, nu)

        def compiled_gram():
            raw = leaves()
            ls = spec.param("covar_module.base_kernel.lengthscale").transform(
                raw["covar_module.base_kernel.lengthscale"]
            )
            s = spec.param("covar_module.outputscale").transform(raw["covar_module.outputscale"])
            K = CompiledGram.apply(X / ls, s, gp.noise_variance(raw), None)
            loss = GaussianNLL.apply(K, y, torch.full((B,), float(M), dtype=X.dtype), ids)
            torch.autograd.grad(loss.sum(), list(raw.values()))

        start = time.perf_counter()
        compiled_gram()
        print(f"torch.compile: first call (compilation) took {time.perf_counter() - start:.1f} s")
        cases["compiled_gram"] = compiled_gram

    print(f"one local step of B={B} clients, M={M}, d={d}, RBF-ARD; median ms (speed-up vs gpytorch_batch)")
    rows = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        results = {name: timed(fn) for name, fn in cases.items()}
        base = results["gpytorch_batch"]
        line = ", ".join(f"{name} {ms:.1f} ({base / ms:.1f}x)" for name, ms in results.items())
        print(f"threads={threads}: {line}")
        rows += [(threads, name, ms, base / ms) for name, ms in results.items()]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as f:
        f.write("threads,case,ms_per_step,speedup_vs_gpytorch_batch\n")
        f.writelines(f"{t},{name},{ms:.4g},{speedup:.4g}\n" for t, name, ms, speedup in rows)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
