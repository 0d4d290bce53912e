"""Compiled exact-GP minibatch steps for many clients at once (CPU, numba).

Why by hand: with minibatches of M ≈ 32 points the batched engine's tensor path spends about half
of each step in LAPACK calls made once per 32×32 matrix (``potrf``, ``potri``: a few microseconds
each, one after another, however many cores there are) and most of the rest in a dozen passes over
``(B, M, M)`` tensors. No maintained library offers a batched small-matrix Cholesky on the CPU that
vectorises *across* matrices (MKL's "compact" LAPACK does, but PyTorch does not expose it). Here
compiled code does a whole step for a tile of :data:`TILE` clients at a time, with the tile as the
innermost (SIMD) dimension: Gram matrix, Cholesky, inverse, log-determinant, α = K⁻¹r, the per-point
NLL and its gradients, all in cache (:func:`tile_nll`).

Two entry points use it. :func:`stationary_nll` is one step (what
:class:`~fedgp.engines.batched.StationaryGram` followed by :class:`~fedgp.engines.batched.GaussianNLL`
compute; tests hold the two to 1e-12 and to GPyTorch). :mod:`fedgp.engines.fused` runs a whole
local round (minibatch draws, parameter transforms, optimiser) per tile on top of it.

Threads: the compiled functions release the GIL and take a range of tiles; :func:`run_tiles` splits
the tiles over ``torch.get_num_threads()`` Python threads (never more than the CPUs the process
may use: :mod:`fedgp.engines.cpus`). numba's own thread pools (``parallel=True``)
are not used: its OpenMP layer shares the OpenMP runtime with torch and left torch's thread count
raised after a call (``torch.set_num_threads(1)`` became 2), which made the torch work that followed
in the same process several times slower (benchmarks/thread_interference.py). Every tile's numbers
depend on that tile's clients alone, so results do not depend on the number of threads.

The batched engine uses these when numba is installed (``pip install 'fedgp-gpytorch[fast]'``), the inputs
are CPU tensors of at most :data:`MAX_POINTS` points, and the kernel is RBF or Matérn-3/2, -5/2. When a
row's Cholesky fails, :func:`stationary_nll` returns ``None`` and the engine redoes the call on the
tensor path, which has GPyTorch's jitter retries and names the failing client.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from fedgp.engines import cpus, deadline
from fedgp.engines.cpus import default_threads

try:  # optional dependency: the tensor path is used without it
    import numba
except ImportError:  # pragma: no cover - exercised only where numba is absent
    numba = None

__all__ = ["available", "stationary_nll", "run_tiles", "kernels", "MAX_POINTS", "NU_CODES", "TILE"]

#: Largest minibatch (points per client) the compiled step takes; above it LAPACK's blocked
#: algorithms win and the ``(M, M, tile)`` work arrays stop fitting in cache.
MAX_POINTS = 64
#: Clients per tile: the SIMD width of the innermost loops (8 float64 = one AVX-512 or two AVX2
#: registers).
TILE = 8
#: Kernel codes of the compiled functions.
NU_CODES = {None: 0, 1.5: 1, 2.5: 2}
_LOG_2PI = math.log(2 * math.pi)
#: Floating-point licences of the compiled arithmetic: contraction to FMA and reassociation, but
#: not ``nnan``/``ninf`` (the Cholesky's ``not v > 0`` test must see a NaN).
FASTMATH = {"contract", "reassoc", "nsz"}


def available() -> bool:
    """Whether the compiled steps can run here (numba importable)."""
    return numba is not None


# The GP step of one tile, written once per lane: a line with ``@`` stands for TILE lines, ``@`` replaced
# by 0, 1, ... (see _lanes_function). Per-lane scalars (``c@``) keep the accumulators in registers,
# where LLVM's SLP vectoriser packs the lanes into one SIMD instruction; loops over ``for b in
# range(TILE)`` with an accumulator array instead compile to scalar code (the compiler cannot rule
# out that the array aliases the matrices), about 4x slower.
_TILE_NLL = """
def tile_nll(z, rr, valid, nf, sv, nv, M, d, nu_code, need_grad, L, U, E, out, al, gz):
    # One exact-GP NLL (and its gradients) for the T clients of a tile, lanes side by side.
    # z (M, d, T) scaled inputs, rr (M, T) residuals, valid (M, T) 1/0 per point (a prefix of each
    # lane; padded points must have z = rr = 0), nf (T) points per lane (>= 1), sv, nv (T)
    # outputscale and noise variance. Scratch L, U, E (>= M, >= M, T). Writes out (4, T): loss,
    # first failing Cholesky column + 1 (0 if none), d/ds, d/dnoise; al (M, T) alpha = K^-1 r;
    # with need_grad, gz (M, d, T) d/dz.
    logdet = np.zeros(TILE, dtype=z.dtype)
    bad = np.zeros(TILE, dtype=z.dtype)
    acc = np.empty(TILE, dtype=z.dtype)
    bits = np.empty(TILE, dtype=np.int64)
    scale = bits.view(np.float64)
    s@ = sv[@]
    n@ = nv[@]
    # Gram matrix K = s k(D) + noise I (lower triangle), padded rows/columns = identity
    for i in range(M):
        v@ = valid[i, @]
        for j in range(i):
            c@ = 0.0
            for a in range(d):
                t@ = z[i, a, @] - z[j, a, @]
                c@ += t@ * t@
            if nu_code == 0:  # RBF: k = exp(-D/2), dk/dD = -k/2 (E not needed)
                x@ = -0.5 * c@
            else:  # Matern: q = sqrt(2 nu D), k = poly(q) e^-q
                q@ = np.sqrt((3.0 if nu_code == 1 else 5.0) * c@)
                x@ = -q@
            # e^x for x <= 0, vectorised (libm's exp is a call per number, the Gram's largest cost):
            # x = k ln2 + r (Cody-Waite), e^r by its Taylor series to r^12/12! (|r| <= ln2/2: error
            # below 2e-16), 2^k written into the exponent bits. x is clamped at -708 (e^x < 4e-308,
            # 2^k still a normal number) rather than the result selected: a per-lane select after
            # the exponent bits kept the vectoriser off the loop (the tile 1.2-1.3x slower)
            x@ = max(x@, -708.0)
            k@ = np.floor(x@ * 1.4426950408889634 + 0.5)
            r@ = (x@ - k@ * 6.93147180369123816490e-01) - k@ * 1.90821492927058770002e-10
            e@ = 1.0 / 479001600.0
            e@ = e@ * r@ + 1.0 / 39916800.0
            e@ = e@ * r@ + 1.0 / 3628800.0
            e@ = e@ * r@ + 1.0 / 362880.0
            e@ = e@ * r@ + 1.0 / 40320.0
            e@ = e@ * r@ + 1.0 / 5040.0
            e@ = e@ * r@ + 1.0 / 720.0
            e@ = e@ * r@ + 1.0 / 120.0
            e@ = e@ * r@ + 1.0 / 24.0
            e@ = e@ * r@ + 1.0 / 6.0
            e@ = e@ * r@ + 0.5
            e@ = e@ * r@ + 1.0
            e@ = e@ * r@ + 1.0
            bits[@] = np.int64(k@ + 1023.0) << 52
            e@ = e@ * scale[@] * v@
            if nu_code == 0:
                u@ = e@
            elif nu_code == 1:  # Matern-3/2: k = (1 + q) e^-q, dk/dD = -(3/2) e^-q
                u@ = (1.0 + q@) * e@
                E[i, j, @] = -1.5 * e@
            else:  # Matern-5/2: k = (1 + q + q^2/3) e^-q, dk/dD = -(5/6)(1 + q) e^-q
                u@ = (1.0 + q@ + q@ * q@ / 3.0) * e@
                E[i, j, @] = -(5.0 / 6.0) * (1.0 + q@) * e@
            U[i, j, @] = u@
            L[i, j, @] = s@ * u@
        L[i, i, @] = v@ * (s@ + n@) + (1.0 - v@)
    # Cholesky K = LL^T in place (lower), and log|K|
    for j in range(M):
        c@ = L[j, j, @]
        for k in range(j):
            c@ -= L[j, k, @] * L[j, k, @]
        acc[@] = c@
        for b in range(TILE):
            v = acc[b]
            if not v > 0.0:
                if bad[b] == 0.0:
                    bad[b] = j + 1.0
                v = 1.0
            root = np.sqrt(v)
            L[j, j, b] = root
            logdet[b] += 2.0 * np.log(root)
        for i in range(j + 1, M):
            c@ = L[i, j, @]
            for k in range(j):
                c@ -= L[i, k, @] * L[j, k, @]
            L[i, j, @] = c@ / L[j, j, @]
    # L^-1 in place, row by row: row i needs rows < i of the inverse and its own row of L from
    # column j on, so no entry depends on one just written (column by column, each entry waited
    # for the one above it: benchmarks/tile_kernel.py --sections)
    for i in range(M):
        L[i, i, @] = 1.0 / L[i, i, @]
        for j in range(i):
            c@ = L[i, j, @] * L[j, j, @]
            for k in range(j + 1, i):
                c@ += L[i, k, @] * L[k, j, @]
            L[i, j, @] = -c@ * L[i, i, @]
    # K^-1 = L^-T L^-1 in place (lower triangle; row i needs rows >= i only, as LAPACK's lauum)
    for i in range(M):
        for j in range(i + 1):
            c@ = 0.0
            for k in range(i, M):
                c@ += L[k, i, @] * L[k, j, @]
            L[i, j, @] = c@
    # alpha = K^-1 r, the quadratic form and the loss
    p@ = 0.0
    for i in range(M):
        c@ = 0.0
        for j in range(i + 1):
            c@ += L[i, j, @] * rr[j, @]
        for j in range(i + 1, M):
            c@ += L[j, i, @] * rr[j, @]
        al[i, @] = c@
        p@ += rr[i, @] * c@
    out[0, @] = 0.5 * (p@ + logdet[@] + nf[@] * _LOG_2PI) / nf[@]
    out[1, @] = bad[@]
    if not need_grad:
        return
    # Gradients of the per-point NLL: W = dL/dK = (K^-1 - alpha alpha^T) / (2n), symmetric;
    # d/dnoise = tr W, d/ds = sum W*k, d/dz_i = sum_j 4 W_ij s k'(D_ij) (z_i - z_j), d/dr = alpha/n.
    h@ = 0.5 / nf[@]
    g@ = 0.0
    m@ = 0.0
    for i in range(M):
        for a in range(d):
            gz[i, a, @] = 0.0
    for i in range(M):
        w@ = h@ * (L[i, i, @] - al[i, @] * al[i, @]) * valid[i, @]
        m@ += w@
        g@ += w@
        for j in range(i):
            w@ = h@ * (L[i, j, @] - al[i, @] * al[j, @])
            g@ += 2.0 * w@ * U[i, j, @]
            if nu_code == 0:
                f@ = -2.0 * w@ * s@ * U[i, j, @]
            else:
                f@ = 4.0 * w@ * s@ * E[i, j, @]
            for a in range(d):
                t@ = f@ * (z[i, a, @] - z[j, a, @])
                gz[i, a, @] += t@
                gz[j, a, @] -= t@
    out[2, @] = g@
    out[3, @] = m@
"""


def _lanes_function(name: str, template: str, jit):
    """Compile ``template`` (one function) with each line holding ``@`` written out once per lane.

    The function lives in this module (its globals are this module's, its code is attributed to
    this file), so numba's on-disk cache works for it as for the functions written out here."""
    lines = []
    for line in template.splitlines():
        lines += [line.replace("@", str(b)) for b in range(TILE)] if "@" in line else [line]
    scope = globals()
    exec(compile("\n".join(lines), __file__, "exec"), scope)  # noqa: S102 - our own template, no input
    return jit(scope.pop(name))


@contextlib.contextmanager
def lane_vectorization():
    """numba's code generation for the lane-unrolled functions while they are compiled: LLVM's
    superword-level vectoriser on (numba leaves it off; it packs the lanes into SIMD registers) and
    its loop vectoriser off. Left on, the loop vectoriser vectorises the triangular loops over k
    (``c@ += L[i, k, @] * L[k, j, @]``) instead, with gathers and shuffles across rows: the whole
    tile took 1.5-1.8x as long (``benchmarks/tile_kernel.py``). Compilation happens on a first call, so
    calls into them run inside this."""
    previous = numba.config.SLP_VECTORIZE, numba.config.LOOP_VECTORIZE
    numba.config.SLP_VECTORIZE, numba.config.LOOP_VECTORIZE = 1, 0
    try:
        yield
    finally:
        numba.config.SLP_VECTORIZE, numba.config.LOOP_VECTORIZE = previous


#: What :class:`_StepKernels` compiles, as module globals (set there) so that numba's cache of
#: ``step`` hits.
_tile_nll = _scratch = None


class _StepKernels:
    """The compiled functions, built on first use so that importing this module never needs numba."""

    def __init__(self):
        T = TILE
        jit = numba.njit(fastmath=FASTMATH, cache=True, error_model="numpy", nogil=True)

        tile_nll = _lanes_function("tile_nll", _TILE_NLL, jit)

        @jit
        def scratch(M, d, like):  # pragma: no cover
            """One thread's work arrays for tiles of up to M points in d dimensions (dtype of ``like``):
            L, U, E, out, al, gz as :func:`tile_nll` takes them, then z, rr, valid, nf, sv, nv."""
            dt = like.dtype
            return (
                np.empty((M, M, T), dtype=dt),
                np.empty((M, M, T), dtype=dt),
                np.empty((M, M, T), dtype=dt),
                np.empty((4, T), dtype=dt),
                np.empty((M, T), dtype=dt),
                np.empty((M, d, T), dtype=dt),
                np.empty((M, d, T), dtype=dt),
                np.empty((M, T), dtype=dt),
                np.empty((M, T), dtype=dt),
                np.empty(T, dtype=dt),
                np.empty(T, dtype=dt),
                np.empty(T, dtype=dt),
            )

        # module globals, not closure variables, for step: numba's cache keys a closure by its captured
        # values, and a compiled function pickles differently in every process (fedgp.engines.fused)
        globals().update(_tile_nll=tile_nll, _scratch=scratch)

        @jit
        def step(
            Z, s, noise, r, n_valid, nu_code, need_grad, loss, gZ, gs, gnoise, gr, info, t0, t1
        ):  # pragma: no cover
            """Tiles [t0, t1) of one minibatch step: Z (B, M, d) inputs divided by the lengthscales;
            s, noise (B,); r (B, M) residuals y - m(x); n_valid (B,) points used per row (a prefix;
            the rest of K is replaced by the identity)."""
            B, M, d = Z.shape
            L, U, E, out, al, gz, z, rr, valid, nf, sv, nv = _scratch(M, d, Z)
            for t in range(t0, t1):
                b0 = t * T
                nb = min(T, B - b0)
                z[:] = 0.0
                rr[:] = 0.0
                valid[:] = 0.0
                sv[:] = 1.0
                nv[:] = 1.0
                nf[:] = 1.0
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
                _tile_nll(z, rr, valid, nf, sv, nv, M, d, nu_code, need_grad, L, U, E, out, al, gz)
                for bb in range(nb):
                    b = b0 + bb
                    loss[b] = out[0, bb]
                    info[b] = int(out[1, bb])
                    if need_grad:
                        gs[b] = out[2, bb]
                        gnoise[b] = out[3, bb]
                        for i in range(M):
                            gr[b, i] = al[i, bb] / nf[bb]
                            for a in range(d):
                                gZ[b, i, a] = gz[i, a, bb]

        self.tile_nll = tile_nll
        self.scratch = scratch
        self.step = step


def cached_with(dispatcher, *modules) -> None:
    """Make numba's on-disk cache of ``dispatcher`` go stale when any of ``modules``' source files
    changes, not only the file that defines it.

    numba stamps a cached function with its own file's modification time and size only; a compiled
    function it calls from another file is compiled *into* it, so after an edit of that other file
    the cache kept serving the old code (seen: the fused round in fused.py kept compiled.py's old
    GP step, silently). Call before the first call (numba reads the index then). numba has no
    public hook for this; its index's stamp is extended here, and a numba without that attribute
    is left as it is."""
    index = getattr(getattr(dispatcher, "_cache", None), "_cache_file", None)
    if index is None or not hasattr(index, "_source_stamp"):  # pragma: no cover - another numba
        return
    stamps = []
    for module in modules:
        st = os.stat(module.__file__)
        stamps.append((st.st_mtime, st.st_size))
    index._source_stamp = (index._source_stamp, *stamps)


def once(build):
    """``build()`` on the first call of the returned function (thread-safe), its result thereafter:
    compiled functions are compiled, or loaded from numba's cache, when first needed."""
    lock, built = threading.Lock(), []

    def get():
        with lock:
            if not built:
                built.append(build())
        return built[0]

    return get


_build_kernels = once(lambda: _StepKernels())


def kernels() -> _StepKernels:
    """The compiled functions of this module, compiled (or loaded from numba's cache) on first use;
    thread-safe."""
    return _build_kernels()


_POOL: ThreadPoolExecutor | None = None
#: (compiled function, argument dtypes) that have finished a call, so are compiled, in this process.
_RAN: set = set()
_POOL_LOCK = threading.Lock()


def _pool(workers: int) -> ThreadPoolExecutor:
    """Worker threads for :func:`run_tiles`; idle ones block on a queue (they never spin)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL._max_workers < workers:
            if _POOL is not None:
                _POOL.shutdown(wait=True)
            _POOL = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fedgp-tiles")
    return _POOL


def run_tiles(fn, n_tiles: int, *args, threads: int | None = None, pieces_per_thread: int = 8) -> None:
    """``fn(*args, t0, t1)`` over contiguous pieces of ``range(n_tiles)``, on ``threads`` threads
    (default :func:`fedgp.engines.cpus.default_threads`: torch's thread count, as the user set it,
    bounded by the CPUs this process may use).

    ``fn`` must be a compiled function that releases the GIL; the calling thread works too. Each
    thread takes the next piece when it is done with one, so a thread slowed down by other
    processes holds the others up by one piece at most. A tile's numbers do not depend on which
    thread runs it, or with which other tiles."""
    threads = max(1, min(cpus.contention.threads(default_threads()) if threads is None else threads, n_tiles))
    # A first call with these types compiles: the engine's time, not the clients' (fedgp.engines.deadline).
    key = (fn, *(getattr(a, "dtype", None) for a in args))
    with lane_vectorization(), contextlib.nullcontext() if key in _RAN else deadline.not_counted():
        _run_tiles(fn, n_tiles, args, threads, pieces_per_thread)
    _RAN.add(key)


def _run_tiles(fn, n_tiles: int, args: tuple, threads: int, pieces_per_thread: int) -> None:
    if threads == 1:
        fn(*args, 0, n_tiles)
        return
    count = min(n_tiles, threads * pieces_per_thread)
    bounds = [n_tiles * i // count for i in range(count + 1)]
    queue = iter(range(count))
    lock = threading.Lock()
    spent = []  # (CPU time, wall time) of each thread: how much of the call it ran (cpus.Contention)

    def work():
        cpu, wall = time.thread_time(), time.perf_counter()
        while True:
            with lock:
                i = next(queue, None)
            if i is None:
                spent.append((time.thread_time() - cpu, time.perf_counter() - wall))
                return
            fn(*args, bounds[i], bounds[i + 1])

    futures = [_pool(threads - 1).submit(work) for _ in range(threads - 1)]
    work()
    for future in futures:
        future.result()
    wall = sum(w for _, w in spent)
    if wall > 0:
        cpus.contention.record(threads, sum(c for c, _ in spent) / wall)


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
    step = kernels().step
    B, M, d = Z.shape
    need_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (Z, s, noise, r))
    dtype = Z.dtype
    arrays = [t.detach().to(dtype).contiguous().numpy() for t in (Z, s, noise, r)]
    loss = np.empty(B, dtype=arrays[0].dtype)
    gZ, gs, gnoise, gr = (np.empty(shape, dtype=loss.dtype) for shape in ((B, M, d), (B,), (B,), (B, M)))
    info = np.empty(B, dtype=np.int64)
    n = n_valid.to(torch.int64).contiguous().numpy()
    run_tiles(
        step, (B + TILE - 1) // TILE, *arrays, n, NU_CODES[nu], need_grad, loss, gZ, gs, gnoise, gr, info
    )
    if info.any():
        return None
    loss_t = torch.from_numpy(loss)
    if not need_grad:
        return loss_t
    grads = [torch.from_numpy(g) for g in (gZ, gs, gnoise, gr)]
    return _PrecomputedNLL.apply(Z, s, noise, r, loss_t, *grads)
