"""The exact posterior of a client with many rows, in the memory of one n×n matrix.

GPyTorch's exact prediction (:func:`fedgp.models.posterior.predict_with_model`) holds several n×n
matrices at once (the kernel, its noisy copy, the Cholesky factor and their temporaries): 20.7 GB
of peak memory at n = 30,000. Above :data:`LARGE_CLIENT_ROWS` training rows a client's posterior is
computed here instead, and it is the same exact Cholesky posterior, equal to GPyTorch's to
round-off (tests: 1e-9 relative): the noisy training covariance is written block by block into one
n×n float64 buffer and factorised in place by a blocked Cholesky on torch's BLAS (torch's
``cholesky`` allocates a second n×n output), with GPyTorch's jitter retries; the test points go
through in blocks. Peak memory is n²·8 bytes plus O(n · :data:`BLOCK`) (7.2 GB at n = 30,000);
time is the factor's n³/3 multiply-adds plus n² per test point.

This bounds memory, not the cubic time, and an n×n matrix must fit: above
:data:`~fedgp.models.iterative.ITERATIVE_CLIENT_ROWS` rows, or where the matrix would not fit in the
memory the machine has free (:func:`fits_in_memory`; n = 10⁵ needs 80 GB), the posterior is solved
by preconditioned conjugate gradients instead (:mod:`fedgp.models.iterative`).
"""

from __future__ import annotations

import warnings

import gpytorch
import numpy as np
import scipy.linalg
import torch
from linear_operator.operators import DiagLinearOperator
from linear_operator.utils.errors import NotPSDError
from threadpoolctl import threadpool_limits

from fedgp.errors import InputError
from fedgp.models.objective import CHOLESKY_JITTER, CHOLESKY_MAX_TRIES

__all__ = [
    "LARGE_CLIENT_ROWS",
    "BLOCK",
    "large_posterior",
    "matrix_bytes",
    "fits_in_memory",
    "observed_variance",
    "training_noise",
]

#: Training rows above which a client's posterior is computed by :func:`large_posterior`.
LARGE_CLIENT_ROWS = 4096
#: Rows of the kernel (training rows, test points) evaluated at a time.
BLOCK = 1024


def matrix_bytes(n: int) -> int:
    """The memory of one n×n float64 matrix: what :func:`large_posterior` needs beyond O(n)."""
    return 8 * n * n


def _available_bytes() -> int | None:
    """The memory the machine has free (psutil, else Linux's ``MemAvailable``), or ``None``."""
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        pass
    try:
        with open("/proc/meminfo") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def fits_in_memory(n: int) -> bool:
    """Whether one n×n float64 matrix fits in 90 % of the memory the machine has free (True where
    that cannot be read)."""
    free = _available_bytes()
    return free is None or matrix_bytes(n) <= 0.9 * free


def one_blas_thread() -> threadpool_limits:
    """SciPy's OpenBLAS on one thread, for the triangular solves. Its multithreaded ``dpotrf`` crashed
    the process (SIGSEGV) at n = 30,000 on a 2-core machine (OpenBLAS 0.3.30 as SciPy bundles it; the
    class of fault of OpenMathLib/OpenBLAS#1413 and #2821, in the threaded SYRK), which is why the factor
    itself is torch's; its other routines run on one thread as a precaution (they cost O(n²) a column)."""
    return threadpool_limits(limits=1, user_api="blas")


def training_noise(model, X: torch.Tensor) -> torch.Tensor:
    """The likelihood's noise variance at each training row, (n,): one value repeated, or a
    known-noise likelihood's own."""
    n = X.shape[0]
    return model.likelihood.noise_covar(X, shape=torch.Size([n])).diagonal().expand(n).contiguous()


def _noisy_covariance(model, X: torch.Tensor, out: torch.Tensor, jitter: float) -> None:
    """K(X, X) + the likelihood's noise (+ ``jitter``) on the diagonal, written into ``out`` by blocks
    of rows."""
    n = X.shape[0]
    for start in range(0, n, BLOCK):
        out[start : start + BLOCK] = model.covar_module(X[start : start + BLOCK], X).to_dense()
    out.diagonal().add_(training_noise(model, X) + jitter)


def _cholesky_in_place(A: torch.Tensor) -> int:
    """Overwrite the lower triangle of the symmetric ``A`` with its Cholesky factor L; 0 on success,
    else the (1-based) row where a pivot was not positive.

    Right-looking and blocked: factor a diagonal block, solve the panel below it, subtract the panel's
    outer product from the lower triangle of the trailing matrix block by block (``addmm_`` on views
    of ``A``, so torch's BLAS writes in place). Written here because LAPACK's in-place ``potrf`` is
    not reachable from torch (``torch.linalg.cholesky`` allocates its output) and SciPy's threaded
    one crashed (:func:`one_blas_thread`); the extra memory is one panel, n × :data:`BLOCK`."""
    n = A.shape[0]
    for k in range(0, n, BLOCK):
        e = min(k + BLOCK, n)
        L, info = torch.linalg.cholesky_ex(A[k:e, k:e])
        if info != 0 or not bool(torch.isfinite(L.diagonal()).all()):
            return k + max(int(info), 1)
        A[k:e, k:e] = L
        if e == n:
            break
        panel = torch.linalg.solve_triangular(L, A[e:, k:e].T, upper=False).T
        A[e:, k:e] = panel
        for j in range(e, n, BLOCK):
            je = min(j + BLOCK, n)
            A[j:je, e:je].addmm_(panel[j - e : je - e], panel[: je - e].T, alpha=-1.0)
    return 0


def _factor_in_place(model, X: torch.Tensor, client) -> np.ndarray:
    """The Cholesky factor of the noisy covariance, in one n×n buffer: returned as the upper factor U
    (Fortran order, UᵀU = K + σ²I), which is the lower factor L = Uᵀ of the C-ordered buffer."""
    n = X.shape[0]
    if not fits_in_memory(n):
        raise InputError(
            f"client {client!r}: its exact posterior over {n:,} training rows needs one {n}×{n} matrix, "
            f"{matrix_bytes(n) / 2**30:.1f} GiB, and this machine has {_available_bytes() / 2**30:.1f} "
            "GiB free; use fedgp.models.iterative.iterative_posterior (conjugate gradients, O(n) "
            "memory), which fedgp's prediction chooses by itself in this case"
        )
    buffer = torch.empty(n, n, dtype=torch.float64)
    jitter = 0.0
    for attempt in range(CHOLESKY_MAX_TRIES + 1):
        _noisy_covariance(model, X, buffer, jitter)
        row = _cholesky_in_place(buffer)
        if row == 0:
            return buffer.numpy().T
        jitter = CHOLESKY_JITTER * 10**attempt
    raise NotPSDError(
        f"{n}×{n} covariance not positive definite (pivot {row} after {CHOLESKY_MAX_TRIES} jitters)"
    )


def large_posterior(
    model: gpytorch.models.ExactGP,
    X: torch.Tensor,
    y: torch.Tensor,
    X_new: torch.Tensor,
    client=None,
    full_cov: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(mean, variance of f, variance of y, joint covariance of f or None)`` at ``X_new`` of the
    exact posterior of ``model`` (hyper-parameters loaded, float64) given ``(X, y)``.

    A factorisation that fails after the jitter retries raises GPyTorch's ``NotPSDError`` (the caller's
    :func:`~fedgp.models.objective.factorization_guard` names the client)."""
    with torch.no_grad():
        upper = _factor_in_place(model, X, client)
        residual = (y - model.mean_module(X)).numpy()
        with one_blas_thread():
            z = scipy.linalg.solve_triangular(upper, residual, trans="T", check_finite=False)
            alpha = torch.from_numpy(scipy.linalg.solve_triangular(upper, z, check_finite=False))
        means, variances, whitened = [], [], []
        floor = gpytorch.settings.min_variance.value(torch.float64)  # GPyTorch's floor on a variance
        for start in range(0, X_new.shape[0], BLOCK):
            Xb = X_new[start : start + BLOCK]
            cross = model.covar_module(X, Xb).to_dense()  # (n, b)
            means.append(model.mean_module(Xb) + cross.T @ alpha)
            # V = L⁻¹ K(X, Xb): the posterior covariance is K(Xb, Xb) − VᵀV
            with one_blas_thread():
                V = scipy.linalg.solve_triangular(upper, cross.numpy(), trans="T", check_finite=False)
            V = torch.from_numpy(V)
            prior = model.covar_module(Xb, diag=True)
            variances.append((prior - V.pow(2).sum(0)).clamp_min(floor))
            if full_cov:
                whitened.append(V)
        mean, variance_f = torch.cat(means), torch.cat(variances)
        covariance = None
        if full_cov:
            V = torch.cat(whitened, dim=1)
            covariance = model.covar_module(X_new).to_dense() - V.T @ V
    return mean, variance_f, observed_variance(model, mean, variance_f, X_new), covariance


def observed_variance(
    model, mean: torch.Tensor, variance_f: torch.Tensor, X_new: torch.Tensor
) -> torch.Tensor:
    """The variance of a new y at ``X_new`` from f's: through the likelihood, as GPyTorch predicts it
    (a known-noise likelihood has no noise at new points, as in ``predict_with_model``)."""
    latent = gpytorch.distributions.MultivariateNormal(mean, DiagLinearOperator(variance_f))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", gpytorch.utils.warnings.GPInputWarning)
        return model.likelihood(latent, X_new).variance
