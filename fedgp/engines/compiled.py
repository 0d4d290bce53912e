"""One compiled loop for a whole exact-GP minibatch step of many clients (CPU, numba).

Why by hand: with minibatches of M ≈ 32 points the batched engine's tensor path spends about half
of each step in LAPACK calls made once per 32×32 matrix (``potrf``, ``potri``: a few microseconds
each, one after another, however many cores there are) and most of the rest in a dozen passes over
``(B, M, M)`` tensors. No maintained library offers a batched small-matrix Cholesky on the CPU that
vectorises *across* matrices (MKL's "compact" LAPACK does, but PyTorch does not expose it). Here one
compiled function does the whole step for a tile of clients at a time, with the tile as the
innermost (SIMD) dimension: Gram matrix, Cholesky, inverse, log-determinant, α = K⁻¹r, the per-point
NLL and its gradients, all in cache; tiles run in parallel on as many threads as torch is allowed.

It computes what :class:`~fedgp.engines.batched.StationaryGram` followed by
:class:`~fedgp.engines.batched.GaussianNLL` compute (tests hold the two to 1e-12 and to GPyTorch).
The batched engine uses it when numba is installed (``pip install 'fedgp[fast]'``), the inputs are
CPU tensors of at most :data:`MAX_POINTS` points, and the kernel is RBF or Matérn-3/2, -5/2. When a
row's Cholesky fails, :func:`stationary_nll` returns ``None`` and the engine redoes the call on the
tensor path, which has GPyTorch's jitter retries and names the failing client.
"""

from __future__ import annotations

import math

import numpy as np
import torch

try:  # optional dependency: the tensor path is used without it
    import numba
except ImportError:  # pragma: no cover - exercised only where numba is absent
    numba = None

__all__ = ["available", "stationary_nll", "MAX_POINTS", "NU_CODES"]

#: Largest minibatch (points per client) the fused step takes; above it LAPACK's blocked
#: algorithms win and the ``(M, M, tile)`` work arrays stop fitting in cache.
MAX_POINTS = 64
#: Clients per tile: the SIMD width of the innermost loops (8 float64 = two AVX2 registers).
TILE = 8
#: Kernel codes of the compiled function.
NU_CODES = {None: 0, 1.5: 1, 2.5: 2}
_LOG_2PI = math.log(2 * math.pi)


def available() -> bool:
    """Whether the fused step can run here (numba importable)."""
    return numba is not None


def _build():
    """The compiled step. A factory so that importing this module never needs numba."""
    T = TILE
    LOG_2PI = _LOG_2PI

    @numba.njit(fastmath=True, inline="always")
    def reduced(L, acc, i, j):  # pragma: no cover
        """acc = L[i, j] − Σ_{k<j} L[i, k] L[j, k] across the tile: one step of the Cholesky."""
        for b in range(T):
            acc[b] = L[i, j, b]
        for k in range(j):
            for b in range(T):
                acc[b] -= L[i, k, b] * L[j, k, b]

    @numba.njit(fastmath=True, parallel=True, cache=True, error_model="numpy")
    def step(Z, s, noise, r, n_valid, nu_code, need_grad, loss, gZ, gs, gnoise, gr, info):  # pragma: no cover
        # Z (B, M, d) inputs divided by the lengthscales; s, noise (B,); r (B, M) residuals y - m(x);
        # n_valid (B,) points used per row (a prefix; the rest of K is replaced by the identity).
        B, M, d = Z.shape
        dt = Z.dtype
        for t in numba.prange((B + T - 1) // T):
            b0 = t * T
            nb = min(T, B - b0)
            # Lower triangles only; every entry read is written first (no zeroing: it costs as much
            # as the Cholesky at M = 32).
            L = np.empty((M, M, T), dtype=dt)  # K, then its Cholesky factor, then L⁻¹
            U = np.empty((M, M, T), dtype=dt)  # unit-scale kernel k(D)
            E = np.empty((M, M, T), dtype=dt)  # dk/dD
            Ki = np.empty((M, M, T), dtype=dt)  # K⁻¹
            z = np.zeros((M, d, T), dtype=dt)
            rr = np.zeros((M, T), dtype=dt)
            al = np.zeros((M, T), dtype=dt)
            valid = np.zeros((M, T), dtype=dt)
            acc = np.zeros(T, dtype=dt)
            logdet = np.zeros(T, dtype=dt)
            bad = np.zeros(T, dtype=np.int64)
            sv = np.ones(T, dtype=dt)
            nv = np.ones(T, dtype=dt)
            nf = np.ones(T, dtype=dt)
            for bb in range(nb):
                b = b0 + bb
                nf[bb] = n_valid[b]
                sv[bb] = s[b]
                nv[bb] = noise[b]
                for i in range(n_valid[b]):
                    valid[i, bb] = 1.0
                    rr[i, bb] = r[b, i]
                    for a in range(d):
                        z[i, a, bb] = Z[b, i, a]
            # Gram matrix K = s·k(D) + σ²I, padded rows/columns = identity
            for i in range(M):
                for j in range(i):
                    for b in range(T):
                        acc[b] = 0.0
                    for a in range(d):
                        for b in range(T):
                            diff = z[i, a, b] - z[j, a, b]
                            acc[b] += diff * diff
                    if nu_code == 0:  # RBF: k = exp(-D/2)
                        for b in range(T):
                            u = np.exp(-0.5 * acc[b]) * valid[i, b]
                            U[i, j, b] = u
                            E[i, j, b] = -0.5 * u
                    elif nu_code == 1:  # Matérn-3/2: q = √(3D), k = (1 + q) e^{-q}
                        for b in range(T):
                            q = np.sqrt(3.0 * acc[b])
                            ex = np.exp(-q) * valid[i, b]
                            U[i, j, b] = (1.0 + q) * ex
                            E[i, j, b] = -1.5 * ex
                    else:  # Matérn-5/2: q = √(5D), k = (1 + q + q²/3) e^{-q}
                        for b in range(T):
                            q = np.sqrt(5.0 * acc[b])
                            ex = np.exp(-q) * valid[i, b]
                            U[i, j, b] = (1.0 + q + q * q / 3.0) * ex
                            E[i, j, b] = -(5.0 / 6.0) * (1.0 + q) * ex
                    for b in range(T):
                        L[i, j, b] = sv[b] * U[i, j, b]
                for b in range(T):
                    U[i, i, b] = 1.0
                    L[i, i, b] = valid[i, b] * (sv[b] + nv[b]) + (1.0 - valid[i, b])
            # Cholesky K = LLᵀ in place (lower), and log|K|
            for j in range(M):
                reduced(L, acc, j, j)
                for b in range(T):
                    v = acc[b]
                    if not v > 0.0:
                        if bad[b] == 0:
                            bad[b] = j + 1
                        v = 1.0
                    root = np.sqrt(v)
                    L[j, j, b] = root
                    logdet[b] += 2.0 * np.log(root)
                for i in range(j + 1, M):
                    reduced(L, acc, i, j)
                    for b in range(T):
                        L[i, j, b] = acc[b] / L[j, j, b]
            # L⁻¹ in place, column by column
            for j in range(M):
                for b in range(T):
                    L[j, j, b] = 1.0 / L[j, j, b]
                for i in range(j + 1, M):
                    for b in range(T):
                        acc[b] = L[i, j, b] * L[j, j, b]
                    for k in range(j + 1, i):
                        for b in range(T):
                            acc[b] += L[i, k, b] * L[k, j, b]
                    for b in range(T):
                        L[i, j, b] = -acc[b] / L[i, i, b]
            # K⁻¹ = L⁻ᵀL⁻¹ (lower triangle), then α = K⁻¹r
            for i in range(M):
                for j in range(i + 1):
                    for b in range(T):
                        acc[b] = 0.0
                    for k in range(i, M):
                        for b in range(T):
                            acc[b] += L[k, i, b] * L[k, j, b]
                    for b in range(T):
                        Ki[i, j, b] = acc[b]
            for i in range(M):
                for b in range(T):
                    acc[b] = 0.0
                for j in range(i + 1):
                    for b in range(T):
                        acc[b] += Ki[i, j, b] * rr[j, b]
                for j in range(i + 1, M):
                    for b in range(T):
                        acc[b] += Ki[j, i, b] * rr[j, b]
                for b in range(T):
                    al[i, b] = acc[b]
            quad = np.zeros(T, dtype=dt)
            for i in range(M):
                for b in range(T):
                    quad[b] += rr[i, b] * al[i, b]
            for bb in range(nb):
                b = b0 + bb
                loss[b] = 0.5 * (quad[bb] + logdet[bb] + nf[bb] * LOG_2PI) / nf[bb]
                info[b] = bad[bb]
            if not need_grad:
                continue
            # Gradients of the per-point NLL: W = ∂/∂K = (K⁻¹ − ααᵀ) / (2n), symmetric;
            # ∂/∂σ² = tr W, ∂/∂s = Σ W∘k, ∂/∂z_i = Σ_j 4 W_ij s k'(D_ij) (z_i − z_j), ∂/∂r = α/n.
            g_s = np.zeros(T, dtype=dt)
            g_n = np.zeros(T, dtype=dt)
            gz = np.zeros((M, d, T), dtype=dt)
            half_over_n = np.zeros(T, dtype=dt)
            for b in range(T):
                half_over_n[b] = 0.5 / nf[b]
            for i in range(M):
                for b in range(T):
                    w = half_over_n[b] * (Ki[i, i, b] - al[i, b] * al[i, b]) * valid[i, b]
                    g_n[b] += w
                    g_s[b] += w
                for j in range(i):
                    for b in range(T):
                        w = half_over_n[b] * (Ki[i, j, b] - al[i, b] * al[j, b])
                        g_s[b] += 2.0 * w * U[i, j, b]
                        acc[b] = 4.0 * w * sv[b] * E[i, j, b]
                    for a in range(d):
                        for b in range(T):
                            g = acc[b] * (z[i, a, b] - z[j, a, b])
                            gz[i, a, b] += g
                            gz[j, a, b] -= g
            for bb in range(nb):
                b = b0 + bb
                gs[b] = g_s[bb]
                gnoise[b] = g_n[bb]
                for i in range(M):
                    gr[b, i] = al[i, bb] / nf[bb]
                    for a in range(d):
                        gZ[b, i, a] = gz[i, a, bb]

    return step


_STEP = None


def _compiled():
    global _STEP
    if _STEP is None:
        _STEP = _build()
    return _STEP


class _PrecomputedNLL(torch.autograd.Function):
    """Hands the fused step's gradients to autograd (they were computed with the loss)."""

    @staticmethod
    def forward(ctx, Z, s, noise, r, loss, gZ, gs, gnoise, gr):
        ctx.save_for_backward(gZ, gs, gnoise, gr)
        return loss.clone()

    @staticmethod
    def backward(ctx, grad):
        gZ, gs, gnoise, gr = ctx.saved_tensors
        return (
            grad.reshape(-1, 1, 1) * gZ,
            grad * gs,
            grad * gnoise,
            grad.reshape(-1, 1) * gr,
            None,
            None,
            None,
            None,
            None,
        )


def stationary_nll(
    Z: torch.Tensor,
    s: torch.Tensor,
    noise: torch.Tensor,
    r: torch.Tensor,
    n_valid: torch.Tensor,
    nu: float | None,
) -> torch.Tensor | None:
    """Per-row ``-log p(r | Z) / n`` for ``K = s·k(Z) + σ²I``, differentiable in Z, s, noise and r.

    Args:
        Z: ``(B, M, d)`` inputs divided by the lengthscales. s, noise: ``(B,)`` outputscales and
            noise variances. r: ``(B, M)`` residuals ``y − m(X)``. n_valid: ``(B,)`` number of
            points in each row (the first ``n_valid`` of M; the rest are padding). nu: ``None``
            (RBF), 1.5 or 2.5 (Matérn).

    Returns ``None`` if any row's matrix is not numerically positive definite.
    """
    step = _compiled()
    B, M, d = Z.shape
    need_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (Z, s, noise, r))
    dtype = Z.dtype
    arrays = [t.detach().to(dtype).contiguous().numpy() for t in (Z, s, noise, r)]
    loss = np.empty(B, dtype=arrays[0].dtype)
    gZ, gs, gnoise, gr = (np.empty(shape, dtype=loss.dtype) for shape in ((B, M, d), (B,), (B,), (B, M)))
    info = np.empty(B, dtype=np.int64)
    threads = numba.get_num_threads()
    numba.set_num_threads(max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS)))
    try:
        step(
            *arrays,
            n_valid.to(torch.int64).contiguous().numpy(),
            NU_CODES[nu],
            need_grad,
            loss,
            gZ,
            gs,
            gnoise,
            gr,
            info,
        )
    finally:
        numba.set_num_threads(threads)
    if info.any():
        return None
    loss_t = torch.from_numpy(loss)
    if not need_grad:
        return loss_t
    grads = [torch.from_numpy(g) for g in (gZ, gs, gnoise, gr)]
    return _PrecomputedNLL.apply(Z, s, noise, r, loss_t, *grads)
