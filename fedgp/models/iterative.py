"""The exact posterior of a client too large for one n×n matrix: preconditioned conjugate gradients.

Above :data:`ITERATIVE_CLIENT_ROWS` training rows, or wherever the n×n matrix of
:mod:`fedgp.models.large` would not fit in the memory the machine has free, a client's posterior
solves its linear systems iteratively instead of factorising: (K + D) α = y − m(X) for the mean
and (K + D) W = K(X, X*) for the variances, all right-hand sides of a block of test points in one
run of conjugate gradients. Nothing of size n×n is ever held. The kernel is multiplied tile by
tile (:data:`TILE` rows at a time, the upper triangle only, since K is symmetric), so memory is
O(n · (:data:`PRECONDITIONER_RANK` + :data:`TEST_BLOCK`)): about 3.5 GB at n = 10⁵.

**Preconditioner.** A Nyström approximation of K on :data:`PRECONDITIONER_RANK` training rows
drawn without replacement (a fixed seed, so a prediction is reproducible), P = K_nm K_mm⁻¹ K_mn + D,
applied through the Woodbury identity: the randomised Nyström preconditioner of Frangella, Tropp &
Udell (2023). A smooth kernel's spectrum above the noise level is what the landmarks capture, so
CG needs a handful of iterations (the benchmark's client: 2–4 at n = 3·10⁴) where it would need
thousands unpreconditioned.

**Tolerance.** Every right-hand side is iterated until its residual is below
:data:`CG_TOLERANCE` (1e-10) of its own norm: the answer is the exact posterior to that tolerance,
not an approximation of the model. Measured against the Cholesky path (tests, and
``benchmarks/large_client.py``): means within about 1e-9 and variances within 1e-8 relative. A solve
that does not reach the tolerance in :data:`CG_MAX_ITERATIONS` raises :class:`ConvergenceError`
naming the client, rather than returning a looser answer.

Time is (iterations) × n² kernel evaluations and multiply-adds per right-hand side, so this bounds
memory, not the quadratic time. CG with a preconditioner and a tiled product is what GPyTorch does
at scale (Wang et al. 2019, "Exact Gaussian processes on a million data points"); its own solver
(``linear_operator.utils.linear_cg``) always runs at least 11 iterations and stops on the *mean*
residual of the right-hand sides, and its kernels materialise whole rows of K, hence the short
solver and the tiles here.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import gpytorch
import torch
from linear_operator.utils.cholesky import psd_safe_cholesky

from fedgp.errors import ConvergenceError
from fedgp.models.large import observed_variance, training_noise

__all__ = [
    "ITERATIVE_CLIENT_ROWS",
    "PRECONDITIONER_RANK",
    "CG_TOLERANCE",
    "CG_MAX_ITERATIONS",
    "TILE",
    "TEST_BLOCK",
    "kernel_tiles",
    "iterative_posterior",
]

#: Training rows above which a client's posterior is solved iteratively even if its matrix fits.
ITERATIVE_CLIENT_ROWS = 40_000
#: Landmark rows of the Nyström preconditioner (at most a quarter of the client's rows).
PRECONDITIONER_RANK = 2048
#: Relative residual every right-hand side must reach.
CG_TOLERANCE = 1e-10
#: Iterations after which an unconverged solve is an error.
CG_MAX_ITERATIONS = 1000
#: Rows and columns of one tile of K.
TILE = 512
#: Test points whose variances are solved in one run of CG.
TEST_BLOCK = 256

logger = logging.getLogger(__name__)

Tiles = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def kernel_tiles(kernel: gpytorch.kernels.Kernel, center: torch.Tensor) -> Tiles:
    """A function ``(A, B) -> K(A, B)`` (dense) for ``kernel``'s current hyper-parameters.

    GPyTorch's own RBF and Matérn kernels (optionally inside a ``ScaleKernel``, without
    ``active_dims``) are evaluated here in one small matrix product and one ``exp`` a tile, the same
    formulas as GPyTorch's (inputs centred and divided by the lengthscales) in fewer passes over the
    tile than calling the module; any other kernel is called as a module. ``center`` is the point inputs are
    centred on (the training inputs' mean), which changes nothing mathematically and keeps the
    squared distances free of cancellation."""
    scale, base = 1.0, kernel
    if type(kernel) is gpytorch.kernels.ScaleKernel:
        scale, base = kernel.outputscale.detach(), kernel.base_kernel
    fast = type(base) in (gpytorch.kernels.RBFKernel, gpytorch.kernels.MaternKernel)
    if not fast or base.active_dims is not None or base.lengthscale.shape[:-2]:
        return lambda A, B: kernel(A, B).to_dense()
    lengthscale = base.lengthscale.detach().reshape(1, -1)
    nu = getattr(base, "nu", None)

    def scaled(A: torch.Tensor, right: bool) -> torch.Tensor:
        """[Z, ‖Z‖², 1] or [−2Z, 1, ‖Z‖²] with Z = (A − center)/ℓ: their product is ‖Zᵃ − Zᵇ‖²."""
        Z = (A - center) / lengthscale
        norm, one = Z.pow(2).sum(-1, keepdim=True), torch.ones_like(Z[:, :1])
        return torch.cat([Z, norm, one] if right else [-2 * Z, one, norm], dim=-1)

    def tile(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        squared = torch.mm(scaled(A, False), scaled(B, True).T)
        if nu is None:  # RBF: exp(−‖Zᵃ − Zᵇ‖² / 2)
            out = squared.mul_(-0.5).exp_()
        else:
            r = squared.clamp_min_(0).sqrt_()
            out = torch.exp(-math.sqrt(2 * nu) * r)
            if nu == 1.5:
                out.mul_(r.mul(math.sqrt(3)).add_(1))
            elif nu == 2.5:
                out.mul_(r.mul(math.sqrt(5)).add_(1).add_(r.pow(2).mul_(5.0 / 3.0)))
        return out.mul_(scale)

    return tile


def _noisy_matmul(
    tiles: Tiles, X: torch.Tensor, noise: torch.Tensor
) -> Callable[[torch.Tensor], torch.Tensor]:
    """V ↦ (K(X, X) + diag(noise)) V, evaluating each tile of the upper triangle of K once."""
    n = X.shape[0]

    def matmul(V: torch.Tensor) -> torch.Tensor:
        out = noise[:, None] * V
        for i in range(0, n, TILE):
            for j in range(i, n, TILE):
                K = tiles(X[i : i + TILE], X[j : j + TILE])
                out[i : i + TILE].addmm_(K, V[j : j + TILE])
                if j > i:
                    out[j : j + TILE].addmm_(K.T, V[i : i + TILE])
        return out

    return matmul


def _nystrom_preconditioner(
    tiles: Tiles, X: torch.Tensor, noise: torch.Tensor
) -> Callable[[torch.Tensor], torch.Tensor]:
    """R ↦ P⁻¹ R for P = BᵀB + D, B = L⁻¹ K(X_m, X) with K(X_m, X_m) = L Lᵀ on m landmark rows:
    by Woodbury, P⁻¹ = D⁻¹ − D⁻¹ Bᵀ (I + B D⁻¹ Bᵀ)⁻¹ B D⁻¹, whose inner matrix is m×m and at least I."""
    n = X.shape[0]
    m = max(1, min(PRECONDITIONER_RANK, n // 4))
    landmarks = X[torch.randperm(n, generator=torch.Generator().manual_seed(0))[:m]]
    L = psd_safe_cholesky(tiles(landmarks, landmarks))
    B = torch.empty(m, n, dtype=X.dtype)
    inner = torch.eye(m, dtype=X.dtype)
    for j in range(0, n, TILE):
        B[:, j : j + TILE] = torch.linalg.solve_triangular(L, tiles(landmarks, X[j : j + TILE]), upper=False)
        inner.addmm_(B[:, j : j + TILE], (B[:, j : j + TILE] / noise[j : j + TILE]).T)
    inner_factor = torch.linalg.cholesky(inner)

    def apply(R: torch.Tensor) -> torch.Tensor:
        scaled = R / noise[:, None]
        return scaled - (B.T @ torch.cholesky_solve(B @ scaled, inner_factor)) / noise[:, None]

    return apply


def _conjugate_gradients(matmul, precondition, rhs: torch.Tensor, client) -> torch.Tensor:
    """Solve A X = ``rhs`` (columns independent) until every column's residual is below
    :data:`CG_TOLERANCE` of its norm."""
    x = torch.zeros_like(rhs)
    r = rhs.clone()
    tiny = torch.finfo(rhs.dtype).tiny
    norms = rhs.norm(dim=0).clamp_min(tiny)
    z = precondition(r)
    p = z.clone()
    rz = (r * z).sum(0)
    worst = float((r.norm(dim=0) / norms).max())
    iterations = 0
    while worst > CG_TOLERANCE:
        if iterations == CG_MAX_ITERATIONS:
            raise ConvergenceError(
                f"client {client!r}: conjugate gradients over {rhs.shape[0]:,} training rows reached a "
                f"relative residual of {worst:.1e}, not {CG_TOLERANCE:.0e}, in {CG_MAX_ITERATIONS} "
                "iterations; raise fedgp.models.iterative.CG_MAX_ITERATIONS or PRECONDITIONER_RANK, or "
                "check the noise level (a near-zero noise makes the system ill-conditioned)"
            )
        Ap = matmul(p)
        curvature = (p * Ap).sum(0)
        alpha = torch.where(curvature > 0, rz / curvature.clamp_min(tiny), 0.0)
        x.add_(alpha * p)
        r.sub_(alpha * Ap)
        worst = float((r.norm(dim=0) / norms).max())
        z = precondition(r)
        rz_next = (r * z).sum(0)
        p = z + torch.where(rz > 0, rz_next / rz.clamp_min(tiny), 0.0) * p
        rz = rz_next
        iterations += 1
    logger.info(
        "client %r: conjugate gradients on %d right-hand sides: %d iterations, relative residual %.1e",
        client,
        rhs.shape[1],
        iterations,
        worst,
    )
    return x


def iterative_posterior(
    model: gpytorch.models.ExactGP,
    X: torch.Tensor,
    y: torch.Tensor,
    X_new: torch.Tensor,
    client=None,
    full_cov: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(mean, variance of f, variance of y, joint covariance of f or None)`` at ``X_new`` of the
    exact posterior of ``model`` (hyper-parameters loaded) given ``(X, y)``, to :data:`CG_TOLERANCE`.

    A joint covariance keeps K(X, X*) and its solve for every test point: 16·n·len(X_new) bytes."""
    with torch.no_grad():
        tiles = kernel_tiles(model.covar_module, X.mean(0, keepdim=True))
        noise = training_noise(model, X)
        matmul = _noisy_matmul(tiles, X, noise)
        precondition = _nystrom_preconditioner(tiles, X, noise)
        residual = (y - model.mean_module(X))[:, None]
        means, variances, crosses, solves = [], [], [], []
        floor = gpytorch.settings.min_variance.value(X.dtype)  # GPyTorch's floor on a variance
        for start in range(0, max(X_new.shape[0], 1), TEST_BLOCK):
            Xb = X_new[start : start + TEST_BLOCK]
            cross = torch.cat([tiles(X[i : i + TILE], Xb) for i in range(0, X.shape[0], TILE)])  # (n, b)
            rhs = torch.cat([residual, cross], 1) if start == 0 else cross
            solved = _conjugate_gradients(matmul, precondition, rhs, client)
            if start == 0:
                alpha, solved = solved[:, 0], solved[:, 1:]
            means.append(model.mean_module(Xb) + cross.T @ alpha)
            prior = model.covar_module(Xb, diag=True)
            variances.append((prior - (cross * solved).sum(0)).clamp_min(floor))
            if full_cov:
                crosses.append(cross)
                solves.append(solved)
        mean, variance_f = torch.cat(means), torch.cat(variances)
        covariance = None
        if full_cov:
            covariance = model.covar_module(X_new).to_dense() - torch.cat(crosses, 1).T @ torch.cat(solves, 1)
            covariance = (covariance + covariance.T) / 2
    return mean, variance_f, observed_variance(model, mean, variance_f, X_new), covariance
