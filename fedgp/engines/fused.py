"""A whole local round of many clients in one compiled call (CPU, numba).

The compiled minibatch step (:mod:`fedgp.engines.compiled`) made the GP arithmetic of a step fast;
what was left of a round ran in Python once per step: minibatch indices, gathers, autograd through
the parameter transforms, the optimiser. Here all of it runs in compiled code, per tile of
clients, for all E steps of the round: the minibatch draw (the same SplitMix64 stream and Floyd
sampler as :mod:`fedgp.rng`, so the same minibatches as every other engine), ``(x − x₀)/ℓ``, the
GP step (:func:`fedgp.engines.compiled.tile_nll`), the chain rule through GPyTorch's softplus
constraints, and Adam (restarted each round) or SGD with its β/t schedule, as
:mod:`fedgp.strategies.local` defines them. One call per chunk; tiles are spread over
``torch.get_num_threads()`` threads.

It applies to what the compiled step applies to — ``ScaleKernel`` (optional) of RBF or Matérn-3/2,
-5/2 without ``active_dims``, a ``ZeroMean`` or ``ConstantMean``, a ``GaussianLikelihood``,
softplus (``Positive``/``GreaterThan``) constraints, no priors, float64, CPU — with ``Adam`` or
``SGD``, uniform or nearest-neighbour minibatches (the latter drawn in Python and passed in) of at
most :data:`~fedgp.engines.compiled.MAX_POINTS` points. Anything else runs the step-by-step path as
before; :func:`unsupported` says why. Tests hold it to the sequential engine (the engine contract,
1e-8) and to the step-by-step path.
"""

from __future__ import annotations

from dataclasses import dataclass

import gpytorch
import numpy as np
import torch

from fedgp.engines import compiled
from fedgp.engines.tensor_gp import NOISE, stationary_fast_path
from fedgp.rng import GOLDEN, MIX1, MIX2, client_keys
from fedgp.strategies.local import SGD, Adam, LocalTraining

__all__ = ["FusedLayout", "layout", "unsupported", "local_round", "optimizer_settings"]

#: Optimiser codes of the compiled round.
_ADAM, _SGD_INVERSE_T, _SGD_CONSTANT = 0, 1, 2


@dataclass(frozen=True)
class FusedLayout:
    """Where each hyper-parameter sits in the ``(rows, P)`` matrix of raw values the round updates.

    ``lower``: the constraint's lower bound per column (the value is ``softplus(raw) + lower``
    where ``softplus[column]``, else the raw value itself); ``trainable`` per column."""

    names: tuple[str, ...]
    widths: tuple[int, ...]
    lengthscale: tuple[int, int]  # (first column, width: 1 or d)
    outputscale: int  # column, or -1 (no ScaleKernel)
    noise: int
    mean: int  # ConstantMean's column, or -1 (ZeroMean)
    softplus: np.ndarray
    lower: np.ndarray
    trainable: np.ndarray
    nu_code: int


def _softplus_bound(constraint) -> float | None:
    """The lower bound of a GPyTorch ``Positive``/``GreaterThan`` softplus constraint, else None."""
    if type(constraint) not in (gpytorch.constraints.Positive, gpytorch.constraints.GreaterThan):
        return None
    fn = constraint._transform
    if not (
        (isinstance(fn, torch.nn.Softplus) and fn.beta == 1 and fn.threshold == 20)
        or fn is torch.nn.functional.softplus
    ):
        return None
    if constraint.lower_bound.numel() != 1:
        return None
    return float(constraint.lower_bound)


def layout(spec) -> FusedLayout | str:
    """The spec's :class:`FusedLayout`, or a sentence saying why the fused round cannot run it
    (numba's here, or Triton's: :mod:`fedgp.engines.triton_round` takes the same layout)."""
    if spec.dtype != torch.float64:
        return f"the spec's dtype is {spec.dtype}, not float64"
    fast = stationary_fast_path(spec)
    if fast is None:
        return "the kernel is not a (scaled) RBF or Matérn-3/2, -5/2 kernel without active_dims"
    if type(spec.likelihood) is not gpytorch.likelihoods.GaussianLikelihood:
        return f"the likelihood is {type(spec.likelihood).__name__}, not GaussianLikelihood"
    model = spec.build()
    if any(True for _ in model.named_priors()):
        return "the modules carry GPyTorch priors"
    mean = spec.mean
    if type(mean) not in (gpytorch.means.ZeroMean, gpytorch.means.ConstantMean):
        return f"the mean is {type(mean).__name__}, not ZeroMean or ConstantMean"
    scale_name, ls_name, nu = fast
    names, widths, softplus, lower, trainable = [], [], [], [], []
    columns: dict[str, int] = {}
    for p in spec.params:
        width = int(p.shape.numel())
        columns[p.raw_name] = sum(widths)
        names.append(p.name)
        widths.append(width)
        if p.raw_name == "mean_module.raw_constant":
            if p.constraint is not None or width != 1:
                return "the ConstantMean's constant is constrained or batched"
            bound = None
        else:
            bound = _softplus_bound(p.constraint)
            if bound is None:
                return f"{p.name} has a constraint other than softplus Positive/GreaterThan"
        softplus += [bound is not None] * width
        lower += [bound or 0.0] * width
        trainable += [p.trainable] * width
    raw_ls = spec.param(ls_name).raw_name
    raw_scale = spec.param(scale_name).raw_name if scale_name else None
    known = {raw_ls, NOISE, "mean_module.raw_constant", raw_scale} - {None}
    extra = [p.name for p in spec.params if p.raw_name not in known]
    if extra:
        return f"it has hyper-parameters the fused round does not know: {extra}"
    ls_width = widths[names.index(spec.param(ls_name).name)]
    return FusedLayout(
        names=tuple(names),
        widths=tuple(widths),
        lengthscale=(columns[raw_ls], ls_width),
        outputscale=columns[raw_scale] if raw_scale else -1,
        noise=columns[NOISE],
        mean=columns.get("mean_module.raw_constant", -1),
        softplus=np.array(softplus, dtype=np.bool_),
        lower=np.array(lower, dtype=np.float64),
        trainable=np.array(trainable, dtype=np.bool_),
        nu_code=compiled.NU_CODES[nu],
    )


def unsupported(local: LocalTraining, batch_sizes: torch.Tensor, d: int, fused: FusedLayout) -> str | None:
    """Why this round's local training cannot run fused (``None``: it can)."""
    if type(local.optimizer) not in (Adam, SGD):
        return f"the optimiser is {type(local.optimizer).__name__}, not Adam or SGD"
    if int(batch_sizes.max()) > compiled.MAX_POINTS:
        return f"minibatches of more than {compiled.MAX_POINTS} points"
    if local.minibatch not in ("uniform", "nearest"):
        return f"minibatch={local.minibatch!r}"
    if fused.lengthscale[1] not in (1, d):
        return f"a lengthscale of width {fused.lengthscale[1]} for {d} input features"
    return None


#: The compiled functions the round calls, set by :class:`_RoundKernels` (module globals so that
#: numba's on-disk cache of the round hits: see there).
_tile_nll = _scratch = _draw_uniform = _softplus = None


class _RoundKernels:
    """The compiled round, built on first use (importing this module never needs numba).

    ``__init__`` and ``local_round`` are longer than the package's 80-line limit on purpose: they are
    one compiled kernel, whose length is the algorithm (the minibatch draw, the parameter
    transforms, the Gram matrix, its Cholesky, the NLL and its gradient, and the optimiser step,
    fused so that a client's data stay in cache); split into Python functions they would cost a
    call per client and step."""

    def __init__(self):
        import numba

        T = compiled.TILE
        # The compiled functions local_round calls are module globals, not closure variables: numba's
        # cache keys a closure by its captured values, and a dispatcher pickles differently in every
        # process, so a closure over them missed the cache and was compiled again in each (~3 s)
        module = globals()
        module["_tile_nll"], module["_scratch"] = compiled.kernels().tile_nll, compiled.kernels().scratch
        gold, m1, m2 = GOLDEN, MIX1, MIX2
        s30, s27, s31, s11 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(11)
        strict = numba.njit(cache=True, nogil=True)  # the draw: bit for bit what fedgp.rng computes

        @strict
        def draw_uniform(key, n, m, s, out, top):  # pragma: no cover
            """Floyd's sampler on the client's stream: fedgp.rng.uniform_minibatches of
            client_uniform(...)[s] for a minibatch of m of n points (step s)."""
            for j in range(m):
                z = key + np.uint64(s * m + j + 1) * gold
                z = (z ^ (z >> s30)) * m1
                z = (z ^ (z >> s27)) * m2
                z = z ^ (z >> s31)
                u = np.float64(z >> s11) * (1.0 / 9007199254740992.0)
                t = (np.float64(n) - np.float64(m)) + np.float64(j)
                out[j] = np.int64(min(np.floor(u * (t + 1.0)), t))
                top[j] = np.int64(t)
            for j in range(1, m):
                for i in range(j):
                    if out[i] == out[j]:
                        out[j] = top[j]
                        break

        fast = numba.njit(fastmath=compiled.FASTMATH, cache=True, error_model="numpy", nogil=True)

        @fast
        def softplus(x):  # pragma: no cover
            """GPyTorch's constraint transform (torch's softplus, threshold 20) and its derivative."""
            if x > 20.0:
                return x, 1.0
            e = np.exp(x)
            return np.log1p(e), e / (e + 1.0)

        module["_draw_uniform"], module["_softplus"] = draw_uniform, softplus

        @fast
        def local_round(
            X, y, offsets, sizes, keys, steps, batch, draw, given, row_client,
            theta, softplus_col, lower, trainable, ls0, nls, sc, ni, mi, nu_code,
            opt, lr, b1, b2, eps, prox_mu, rnd, loss, info, t0, t1,
        ):  # pragma: no cover  # fmt: skip
            R, P = theta.shape
            d = X.shape[1]
            M = 1
            for c in range(len(batch)):
                M = max(M, batch[c])
            dt = X.dtype
            # per-thread scratch, reused by every tile of [t0, t1)
            L, U, E, out, al, gz, z, rr, valid, nf, sv, nv = _scratch(M, d, X)
            th = np.empty((P, T), dtype=dt)
            start = np.empty((P, T), dtype=dt)
            val = np.empty((P, T), dtype=dt)
            dval = np.empty((P, T), dtype=dt)
            g = np.empty((P, T), dtype=dt)
            m_1 = np.empty((P, T), dtype=dt)
            m_2 = np.empty((P, T), dtype=dt)
            total = np.empty(T, dtype=dt)
            idx = np.empty(M, dtype=np.int64)
            top = np.empty(M, dtype=np.int64)
            x0 = np.empty(d, dtype=dt)
            lane_steps = np.zeros(T, dtype=np.int64)
            for t in range(t0, t1):
                r0 = t * T
                nb = min(T, R - r0)
                S = 0
                for b in range(T):
                    lane_steps[b] = steps[row_client[r0 + b]] if b < nb else 0
                    S = max(S, lane_steps[b])
                    for p in range(P):
                        th[p, b] = theta[r0 + b, p] if b < nb else 0.0
                        start[p, b] = th[p, b]
                        m_1[p, b] = 0.0
                        m_2[p, b] = 0.0
                    total[b] = 0.0
                for s in range(S):
                    for p in range(P):
                        for b in range(T):
                            if softplus_col[p]:
                                v, dv = _softplus(th[p, b])
                                val[p, b] = v + lower[p]
                                dval[p, b] = dv
                            else:
                                val[p, b] = th[p, b]
                                dval[p, b] = 1.0
                    # the minibatch of each active lane, centred on its first point and scaled by ℓ
                    for b in range(T):
                        nf[b] = 1.0
                        sv[b] = 1.0 if sc < 0 else val[sc, b]
                        nv[b] = val[ni, b]
                        for i in range(M):
                            valid[i, b] = 0.0
                            rr[i, b] = 0.0
                            for a in range(d):
                                z[i, a, b] = 0.0
                        if s >= lane_steps[b]:
                            continue
                        c = row_client[r0 + b]
                        m = batch[c]
                        if draw:
                            _draw_uniform(keys[c], sizes[c], m, s, idx, top)
                        else:
                            for i in range(m):
                                idx[i] = given[c, s, i]
                        base = offsets[c]
                        for a in range(d):
                            x0[a] = X[base + idx[0], a]
                        shift = 0.0 if mi < 0 else val[mi, b]
                        nf[b] = m
                        for i in range(m):
                            valid[i, b] = 1.0
                            rr[i, b] = y[base + idx[i]] - shift
                            for a in range(d):
                                ls = val[ls0 + (a if nls > 1 else 0), b]
                                z[i, a, b] = (X[base + idx[i], a] - x0[a]) / ls
                    _tile_nll(z, rr, valid, nf, sv, nv, M, d, nu_code, True, L, U, E, out, al, gz)
                    # raw gradients: the chain rule through (x − x₀)/ℓ and the softplus transforms
                    for b in range(T):
                        for p in range(P):
                            g[p, b] = 0.0
                        for a in range(d):
                            acc = 0.0
                            for i in range(M):
                                acc += gz[i, a, b] * z[i, a, b]
                            col = ls0 + (a if nls > 1 else 0)
                            g[col, b] -= acc / val[col, b]
                        if sc >= 0:
                            g[sc, b] = out[2, b]
                        g[ni, b] = out[3, b]
                        if mi >= 0:
                            acc = 0.0
                            for i in range(M):
                                acc += al[i, b]
                            g[mi, b] = -acc / nf[b]
                    k = 1.0 + s  # Adam's step count (the steps a lane takes are its first ones)
                    bias1 = 1.0 - b1**k
                    bias2_sqrt = np.sqrt(1.0 - b2**k)
                    for b in range(T):
                        if s >= lane_steps[b]:
                            continue
                        r = r0 + b
                        if out[1, b] != 0.0 and info[r] == 0:
                            info[r] = s + 1
                        total[b] += out[0, b]
                        for p in range(P):
                            if not trainable[p]:
                                continue
                            grad = g[p, b] * dval[p, b]
                            if prox_mu != 0.0:
                                grad += prox_mu * (th[p, b] - start[p, b])
                            if opt == 0:  # Adam, as fedgp.strategies.local.Adam (torch.optim.Adam's order)
                                m_1[p, b] = m_1[p, b] + (1.0 - b1) * (grad - m_1[p, b])
                                m_2[p, b] = m_2[p, b] * b2 + (1.0 - b2) * grad * grad
                                denom = np.sqrt(m_2[p, b]) / bias2_sqrt + eps
                                th[p, b] = th[p, b] - (lr / bias1) * m_1[p, b] / denom
                            else:  # SGD: η = β / t on the global step t = round · E_k + s, or constant
                                eta = lr
                                if opt == 1:
                                    eta = lr / max(1.0, np.float64(rnd * lane_steps[b] + s))
                                th[p, b] = th[p, b] - eta * grad
                for b in range(nb):
                    for p in range(P):
                        theta[r0 + b, p] = th[p, b]
                    loss[r0 + b] = total[b] / lane_steps[b]

        # it has compiled.py's GP step compiled into it: stale when compiled.py changes too
        compiled.cached_with(local_round, compiled)
        self.local_round = local_round
        self.draw_uniform = draw_uniform


#: The compiled round.
kernels = compiled.once(lambda: _RoundKernels())


def optimizer_settings(local: LocalTraining) -> tuple[int, float, float, float, float]:
    """The local optimiser as the compiled rounds take it: (code, lr, β₁, β₂, ε); SGD's are 0."""
    opt = local.optimizer
    if isinstance(opt, Adam):
        return _ADAM, opt.lr, opt.betas[0], opt.betas[1], opt.eps
    return (_SGD_INVERSE_T if opt.schedule == "inverse_t" else _SGD_CONSTANT), opt.lr, 0.0, 0.0, 0.0


def local_round(
    fused: FusedLayout,
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
    threads: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """Train ``theta`` (rows, P raw values, float64) for one round; returns (theta, mean loss, info).

    Per client c (``offsets``, ``sizes``, ``client_keys_`` of its minibatch stream, ``steps``,
    ``batch``: E_k and M_k; ``given``: ``(B, S, M)`` minibatch indices, or ``None`` to draw uniform
    ones in the compiled code); ``row_client`` maps each row of ``theta`` to its client. ``info[r]``
    is the first step (1-based) whose Cholesky failed for row r, 0 if none: those rows' results are
    not valid and the caller redoes the round on the step-by-step path (jitter, clear errors)."""
    code, lr, b1, b2, eps = optimizer_settings(local)
    theta = theta.to(torch.float64).contiguous().clone()
    R = theta.shape[0]
    loss = np.zeros(R, dtype=np.float64)
    info = np.zeros(R, dtype=np.int64)
    given_np = (
        np.zeros((1, 1, 1), dtype=np.int64) if given is None else given.to(torch.int64).contiguous().numpy()
    )
    compiled.run_tiles(
        kernels().local_round,
        (R + compiled.TILE - 1) // compiled.TILE,
        X.numpy(),
        y.numpy(),
        offsets.to(torch.int64).numpy(),
        sizes.to(torch.int64).numpy(),
        client_keys_,
        steps.to(torch.int64).numpy(),
        batch.to(torch.int64).numpy(),
        given is None,
        given_np,
        row_client.to(torch.int64).numpy(),
        theta.numpy(),
        fused.softplus,
        fused.lower,
        fused.trainable,
        fused.lengthscale[0],
        fused.lengthscale[1],
        fused.outputscale,
        fused.noise,
        fused.mean,
        fused.nu_code,
        code,
        float(lr),
        float(b1),
        float(b2),
        float(eps),
        float(local.prox_mu),
        int(rnd),
        loss,
        info,
        threads=threads,
    )
    return theta, torch.from_numpy(loss), info


def minibatch_keys(seed: int, rnd: int, keys: torch.Tensor) -> np.ndarray:
    """The clients' minibatch-stream keys for round ``rnd`` (those of
    :func:`fedgp.rng.draw_minibatches`)."""
    return client_keys(seed, "minibatch", rnd, keys)
