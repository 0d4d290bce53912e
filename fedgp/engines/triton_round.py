"""A whole local round of many clients as one GPU program (Triton).

On a GPU the batched engine's tensor path runs each minibatch step as a few dozen batched kernels
(gathers, a batched Cholesky, triangular solves, autograd's backward, the optimiser), each reading
and writing ``(B, M, M)`` tensors in device memory: about 40 GFLOP/s on an H200, a fraction of the
device (results/benchmarks/gpu_batched.csv). Here one program per client row runs all E steps of
the round with its ``M × M`` matrices in registers: the minibatch draw (the SplitMix64 stream and
Floyd sampler of :mod:`fedgp.rng`, so every engine's minibatches), ``(x − x₀)/ℓ``, the Gram matrix,
its inverse and log-determinant, the NLL and its gradients, the chain rule through the softplus
constraints and Adam or SGD — what :mod:`fedgp.engines.fused` computes on the CPU, and held to it
to 1e-10 by the tests.

The matrix is inverted by sweeping its pivots in turn (Gauss–Jordan on a symmetric positive
definite matrix, the "sweep operator" of regression software), not by a Cholesky factor and two
triangular solves: one pass of M rank-one updates of the whole register tile gives K⁻¹ and the
log-determinant (the product of the pivots, which are the Cholesky factor's squared diagonal).
Written by hand because no library has a small-matrix GP step that runs inside one GPU program;
Triton is the closest well-kept tool for writing one.

It applies where the fused CPU round applies (:func:`fedgp.engines.fused.layout` and
:func:`~fedgp.engines.fused.unsupported`: RBF/Matérn, softplus constraints, float64, Adam or SGD,
minibatches of at most 64 points). With ``pip install triton``, tensors on a CUDA device run the
compiled kernel; CPU tensors run it in Triton's interpreter (numpy, one program at a time: slow,
for tests on machines without a GPU; ``TRITON_INTERPRET=1`` must be set before triton is imported).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from fedgp.engines.fused import optimizer_settings
from fedgp.errors import InputError
from fedgp.rng import GOLDEN, MIX1, MIX2
from fedgp.strategies.local import LocalTraining

try:  # optional dependency: without it the GPU runs the tensor path
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where triton is absent
    triton = tl = None

__all__ = ["available", "local_round", "kernel", "launch_options"]


def available() -> bool:
    """Whether the Triton round can run here (triton importable)."""
    return triton is not None


def _round(
    X, y, offsets, sizes, keys, steps, batch, given, row_client, theta, consts, bias1, bias2_sqrt,
    softplus_col, lower, trainable, loss, info,
    d, P, S_given, M_given, ls0, nls, sc, ni, mi, rnd, lr, b1, b2, eps, prox_mu,
    NU: tl.constexpr, DRAW: tl.constexpr, OPT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_P: tl.constexpr,
):  # pragma: no cover - traced by Triton  # fmt: skip
    """One client row's local round: E steps of minibatch NLL gradient and optimiser update.

    Longer than the package's 80-line limit on purpose: one program whose registers hold the row's
    matrices from the first step to the last; Triton inlines helpers anyway, and a helper would be a
    second kernel-language function the interpreter and the compiler must both resolve."""
    r = tl.program_id(0).to(tl.int64)
    c = tl.load(row_client + r)
    n_steps = tl.load(steps + c)
    m = tl.load(batch + c)
    n_c = tl.load(sizes + c)
    base = tl.load(offsets + c)
    key = tl.load(keys + c).to(tl.uint64, bitcast=True)
    gold = tl.load(consts + 0).to(tl.uint64, bitcast=True)
    mix1 = tl.load(consts + 1).to(tl.uint64, bitcast=True)
    mix2 = tl.load(consts + 2).to(tl.uint64, bitcast=True)
    pts = tl.arange(0, BLOCK_M)
    ri = pts[:, None]
    ci = pts[None, :]
    fa = tl.arange(0, BLOCK_D)
    pc = tl.arange(0, BLOCK_P)
    pmask = pc < P
    th = tl.load(theta + r * P + pc, mask=pmask, other=0.0)
    start = th
    sp = tl.load(softplus_col + pc, mask=pmask, other=0) != 0
    low = tl.load(lower + pc, mask=pmask, other=0.0)
    learn = (tl.load(trainable + pc, mask=pmask, other=0) != 0) & pmask
    lscol = ls0 + tl.where(nls > 1, fa, 0)  # each feature's lengthscale column
    fvalid = fa < d
    point = pts < m
    inside = point[:, None] & fvalid[None, :]
    pair = point[:, None] & point[None, :] & (ri != ci)
    diag = (ri == ci) & point[:, None]
    nf = m.to(tl.float64)
    m_1 = tl.zeros((BLOCK_P,), dtype=tl.float64)
    m_2 = tl.zeros((BLOCK_P,), dtype=tl.float64)
    total = tl.sum(m_1)  # 0.0 in float64
    first_bad = n_steps * 0
    for s in range(0, n_steps):
        # the constraints' softplus (torch's: threshold 20) and its derivative; log1p by Goldberg's
        # formula (Triton has none its interpreter runs): softplus of a very negative raw value is tiny
        # but not 0, as on the CPU
        e = tl.exp(tl.minimum(th, 20.0))
        u1 = 1.0 + e
        log1p = tl.where(u1 == 1.0, e, tl.log(u1) * e / tl.where(u1 == 1.0, 1.0, u1 - 1.0))
        val = tl.where(sp, tl.where(th > 20.0, th, log1p) + low, th)
        dval = tl.where(sp, tl.where(th > 20.0, 1.0, e / (e + 1.0)), 1.0)
        sv = tl.where(sc >= 0, tl.sum(tl.where(pc == sc, val, 0.0)), 1.0)
        nv = tl.sum(tl.where(pc == ni, val, 0.0))
        shift = tl.sum(tl.where(pc == mi, val, 0.0))  # 0 without a ConstantMean (mi = -1)
        lsv = tl.sum(tl.where(pc[None, :] == lscol[:, None], val[None, :], 0.0), axis=1)
        lsv = tl.where(fvalid, lsv, 1.0)
        # the minibatch: Floyd's sampler on the client's SplitMix64 stream, as fedgp.rng
        if DRAW:
            zz = key + (s * m + pts + 1).to(tl.uint64) * gold
            zz = (zz ^ (zz >> 30)) * mix1
            zz = (zz ^ (zz >> 27)) * mix2
            zz = zz ^ (zz >> 31)
            uu = (zz >> 11).to(tl.float64) * (1.0 / 9007199254740992.0)
            tt = (n_c.to(tl.float64) - nf) + pts.to(tl.float64)
            idx = tl.minimum(tl.floor(uu * (tt + 1.0)), tt).to(tl.int64)
            top = tt.to(tl.int64)
            for j in range(1, m):
                oj = tl.sum(tl.where(pts == j, idx, 0))
                dup = tl.sum(tl.where((pts < j) & (idx == oj), 1, 0)) > 0
                idx = tl.where((pts == j) & dup, top, idx)
        else:
            idx = tl.load(given + (c * S_given + s) * M_given + pts, mask=point, other=0)
        at = base + tl.where(point, idx, 0)
        xm = tl.load(X + at[:, None] * d + fa[None, :], mask=inside, other=0.0)
        x0 = tl.sum(tl.where(ri == 0, xm, 0.0), axis=0)
        z = tl.where(inside, (xm - x0[None, :]) / lsv[None, :], 0.0)
        rr = tl.where(point, tl.load(y + at, mask=point, other=0.0) - shift, 0.0)
        # the Gram matrix K = s k(D) + noise I; padded rows and columns are the identity
        dist = tl.zeros((BLOCK_M, BLOCK_M), dtype=tl.float64)
        for a in range(0, d):
            za = tl.sum(tl.where(fa[None, :] == a, z, 0.0), axis=1)
            dz = za[:, None] - za[None, :]
            dist += dz * dz
        if NU == 0:  # RBF: k = exp(-D/2), dk/dD = -k/2
            kk = tl.where(pair, tl.exp(-0.5 * dist), 0.0)
            dk = -0.5 * kk
        elif NU == 1:  # Matérn-3/2: k = (1 + q) e^-q, q = sqrt(3D); dk/dD = -(3/2) e^-q
            q = tl.sqrt(3.0 * dist)
            eq = tl.where(pair, tl.exp(-q), 0.0)
            kk = (1.0 + q) * eq
            dk = -1.5 * eq
        else:  # Matérn-5/2: k = (1 + q + q²/3) e^-q, q = sqrt(5D); dk/dD = -(5/6)(1 + q) e^-q
            q = tl.sqrt(5.0 * dist)
            eq = tl.where(pair, tl.exp(-q), 0.0)
            kk = (1.0 + q + q * q / 3.0) * eq
            dk = -(5.0 / 6.0) * (1.0 + q) * eq
        A = sv * kk + tl.where(ri == ci, tl.where(point[:, None], sv + nv, 1.0), 0.0)
        # sweep every pivot: A becomes -K^-1; the pivots' logs add up to log|K|; a pivot <= 0 (or
        # NaN) is a failed factorisation (the Cholesky's failing column), the row then redone elsewhere
        logdet = total * 0.0
        bad = n_steps * 0
        for k in range(0, m):
            colk = tl.sum(tl.where(ci == k, A, 0.0), axis=1)
            rowk = tl.sum(tl.where(ri == k, A, 0.0), axis=0)
            p = tl.sum(tl.where(pts == k, colk, 0.0))
            ok = p > 0.0
            bad = tl.where(ok | (bad != 0), bad, k + 1)
            p = tl.where(ok, p, 1.0)
            logdet += tl.log(p)
            inv = 1.0 / p
            A = A - colk[:, None] * (rowk * inv)[None, :]
            A = tl.where(ri == k, (rowk * inv)[None, :], A)
            A = tl.where(ci == k, (colk * inv)[:, None], A)
            A = tl.where((ri == k) & (ci == k), -inv, A)
        K_inv = -A
        alpha = tl.sum(K_inv * rr[None, :], axis=1)
        total += 0.5 * (tl.sum(rr * alpha) + logdet + nf * 1.8378770664093453) / nf  # log 2π
        first_bad = tl.where((bad != 0) & (first_bad == 0), s + 1, first_bad)
        # gradients of the per-point NLL: W = (K^-1 - alpha alpha^T)/(2n); d/dnoise = tr W,
        # d/ds = sum W dK/ds, d/dz_i = sum_j F_ij (z_i - z_j) with F = 4 W s dk/dD
        W = (0.5 / nf) * (K_inv - alpha[:, None] * alpha[None, :])
        g_noise = tl.sum(tl.where(diag, W, 0.0))
        g_scale = g_noise + tl.sum(W * kk)
        F = 4.0 * sv * W * dk
        F_rows = tl.sum(F, axis=1)
        g = tl.zeros((BLOCK_P,), dtype=tl.float64)
        for a in range(0, d):
            za = tl.sum(tl.where(fa[None, :] == a, z, 0.0), axis=1)
            acc = tl.sum(za * (za * F_rows - tl.sum(F * za[None, :], axis=1)))
            col = ls0 + tl.where(nls > 1, a, 0)
            g = tl.where(pc == col, g - acc / tl.sum(tl.where(fa == a, lsv, 0.0)), g)
        g = tl.where(pc == sc, g_scale, g)
        g = tl.where(pc == ni, g_noise, g)
        g = tl.where(pc == mi, -tl.sum(alpha) / nf, g)
        grad = g * dval + prox_mu * (th - start)
        # OPT: fedgp.engines.fused's optimiser codes (fused.optimizer_settings)
        if OPT == 0:  # Adam, as fedgp.strategies.local.Adam (torch.optim.Adam's order)
            m_1 = tl.where(learn, m_1 + (1.0 - b1) * (grad - m_1), m_1)
            m_2 = tl.where(learn, m_2 * b2 + (1.0 - b2) * grad * grad, m_2)
            denom = tl.sqrt(m_2) / tl.load(bias2_sqrt + s) + eps
            th = tl.where(learn, th - (lr / tl.load(bias1 + s)) * m_1 / denom, th)
        elif OPT == 1:  # SGD, eta = beta / t on the global step t = round * E_k + s
            eta = lr / tl.maximum((rnd * n_steps + s).to(tl.float64), 1.0)
            th = tl.where(learn, th - eta * grad, th)
        else:
            th = tl.where(learn, th - lr * grad, th)
    tl.store(theta + r * P + pc, th, mask=pmask)
    tl.store(loss + r, total / n_steps.to(tl.float64))
    tl.store(info + r, first_bad.to(tl.int64))


def kernel(device: torch.device | str) -> triton.runtime.KernelInterface:
    """The Triton kernel for tensors on ``device``: compiled for a CUDA device; for CPU tensors,
    Triton's interpreter, which is a process-wide switch read when triton is first imported
    (``TRITON_INTERPRET=1``; the test suite sets it where no GPU is seen)."""
    if torch.device(device).type == "cpu" and not triton.knobs.runtime.interpret:
        raise InputError(
            "the Triton round runs on a CUDA device, or on CPU tensors in Triton's interpreter: set "
            "TRITON_INTERPRET=1 in the environment before triton is imported to use the interpreter"
        )
    if not _BUILT:
        _BUILT.append(triton.jit(_round))
    return _BUILT[0]


_BUILT: list = []


def launch_options(max_batch: int) -> dict:
    """Block sizes, warps and the FMA setting for minibatches of up to ``max_batch`` points."""
    block_m = max(16, triton.next_power_of_2(int(max_batch)))
    return {"BLOCK_M": block_m, "num_warps": 4 if block_m <= 32 else 8, "enable_fp_fusion": True}


def _launch(max_batch: int, d: int, P: int, nu_code: int, draw: bool, opt: int, num_warps: int | None):
    """The kernel's compile-time constants and launch options: what :func:`local_round` launches and
    :func:`compile_for` builds, from one place so the two cannot drift apart."""
    options = launch_options(max_batch)
    options["num_warps"] = num_warps or options["num_warps"]
    constants = {
        "NU": nu_code, "DRAW": draw, "OPT": opt, "BLOCK_M": options.pop("BLOCK_M"),
        "BLOCK_D": triton.next_power_of_2(d), "BLOCK_P": triton.next_power_of_2(P),
    }  # fmt: skip
    return constants, options


def local_round(
    fused,
    X: torch.Tensor,
    y: torch.Tensor,
    offsets: torch.Tensor,
    sizes: torch.Tensor,
    client_keys_: np.ndarray,
    steps: torch.Tensor,
    batch: torch.Tensor,
    given: torch.Tensor | None,
    row_client: torch.Tensor,
    theta: torch.Tensor,
    local: LocalTraining,
    rnd: int,
    num_warps: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`fedgp.engines.fused.local_round` on ``X``'s device, one Triton program per row of
    ``theta``: the same arguments (``fused`` its :class:`~fedgp.engines.fused.FusedLayout`) and the
    same results (theta, mean loss per row, info: the first step whose factorisation failed, 0 if none),
    on the device. ``X``/``y`` are the engine's stacked data, float64 on that device. ``num_warps``
    overrides :func:`launch_options`' choice (for tuning on a given GPU)."""
    device = X.device
    S = int(steps.max()) if len(steps) else 0
    k = np.arange(1, S + 1, dtype=np.float64)
    code, lr, b1, b2, eps = optimizer_settings(local)
    # Adam's bias corrections per step, computed as the CPU round computes them (b ** k)
    bias1 = torch.from_numpy(np.array([1.0 - b1**i for i in k], dtype=np.float64))
    bias2_sqrt = torch.from_numpy(np.array([math.sqrt(1.0 - b2**i) for i in k], dtype=np.float64))

    def on(t: torch.Tensor | np.ndarray, dtype=torch.int64) -> torch.Tensor:
        t = torch.from_numpy(t) if isinstance(t, np.ndarray) else t
        return t.to(device=device, dtype=dtype).contiguous()

    theta = theta.to(device=device, dtype=torch.float64).contiguous().clone()
    R, P = theta.shape
    loss = torch.empty(R, dtype=torch.float64, device=device)
    info = torch.zeros(R, dtype=torch.int64, device=device)
    given_ = torch.zeros((1, 1, 1), dtype=torch.int64) if given is None else given
    consts = np.array([GOLDEN, MIX1, MIX2], dtype=np.uint64).view(np.int64)
    if R == 0:
        return theta, loss, info
    constants, options = _launch(
        int(batch.max()), X.shape[1], P, fused.nu_code, given is None, code, num_warps
    )
    kernel(device)[(R,)](
        X, y, on(offsets), on(sizes), on(np.ascontiguousarray(client_keys_).view(np.int64)),
        on(steps), on(batch), on(given_), on(row_client), theta, on(consts),
        on(bias1, torch.float64), on(bias2_sqrt, torch.float64),
        on(fused.softplus.astype(np.int8), torch.int8), on(fused.lower, torch.float64),
        on(fused.trainable.astype(np.int8), torch.int8), loss, info,
        X.shape[1], P, given_.shape[1], given_.shape[2], fused.lengthscale[0], fused.lengthscale[1],
        fused.outputscale, fused.noise, fused.mean, int(rnd), float(lr), float(b1), float(b2),
        float(eps), float(local.prox_mu), **constants, **options,
    )  # fmt: skip
    return theta, loss, info


#: The kernel's arguments that are pointers (and to what), integers and floats, in its order: the
#: signature :func:`compile_for` gives Triton's compiler.
_POINTERS = {
    "X": "*fp64", "y": "*fp64", "offsets": "*i64", "sizes": "*i64", "keys": "*i64", "steps": "*i64",
    "batch": "*i64", "given": "*i64", "row_client": "*i64", "theta": "*fp64", "consts": "*i64",
    "bias1": "*fp64", "bias2_sqrt": "*fp64", "softplus_col": "*i8", "lower": "*fp64",
    "trainable": "*i8", "loss": "*fp64", "info": "*i64",
}  # fmt: skip
_INTEGERS = ("d", "P", "S_given", "M_given", "ls0", "nls", "sc", "ni", "mi", "rnd")
_FLOATS = ("lr", "b1", "b2", "eps", "prox_mu")


def compile_for(
    arch: int, max_batch: int, d: int, P: int, nu_code: int = 0, draw: bool = True, opt: int = 0,
    num_warps: int | None = None,
):  # fmt: skip
    """Compile the round ahead of time for a CUDA architecture (``90``: H100/H200) without a GPU:
    Triton's compiler and ``ptxas`` run on any machine. Returns Triton's compiled kernel (its
    ``asm["cubin"]`` is what the device would load); tests use it to check that the code the
    interpreter runs also compiles, and how many registers it needs (``num_warps`` as for
    :func:`local_round`). Needs a process without
    ``TRITON_INTERPRET``."""
    if triton.knobs.runtime.interpret:
        raise InputError("compile_for needs a process without TRITON_INTERPRET=1 (the interpreter is on)")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    constants, options = _launch(max_batch, d, P, nu_code, draw, opt, num_warps)
    signature = _POINTERS | dict.fromkeys(_INTEGERS, "i32") | dict.fromkeys(_FLOATS, "fp64")
    signature |= dict.fromkeys(constants, "constexpr")
    source = ASTSource(fn=kernel("cuda"), signature=signature, constexprs=constants)
    return triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)
