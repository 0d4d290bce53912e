"""The GP marginal likelihood and posterior as batched tensor programs: one row per client.

GPyTorch evaluates one model per call; the batched engine (:mod:`fedgp.engines.batched`) needs the
same numbers for thousands of clients' parameter sets at once. :class:`BatchedGP` evaluates the
spec's own GPyTorch mean and kernel modules with a batch of parameter sets
(``torch.func.functional_call`` on their ``forward``) and writes the Gaussian likelihood out as a
batched Cholesky (:class:`GaussianNLL`, :func:`cholesky` with GPyTorch's jitter schedule). For
(scaled) RBF and Matérn kernels, :class:`StationaryGram` forms the Gram matrix with a hand-written
backward, and the compiled step (:mod:`fedgp.engines.compiled`) replaces the whole minibatch step
where numba is installed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import gpytorch
import torch

from fedgp.engines import compiled as compiled_step
from fedgp.errors import FactorizationError, InputError, UnsupportedSpec
from fedgp.models.objective import CHOLESKY_JITTER, CHOLESKY_MAX_TRIES
from fedgp.models.spec import ExactGPModel, GPSpec

__all__ = [
    "BatchedGP",
    "StationaryGram",
    "GaussianNLL",
    "cholesky",
    "stationary_fast_path",
    "stationary_kernel",
    "NOISE",
]

#: The raw name of a GaussianLikelihood's homoskedastic noise, the one noise the tensor path models.
NOISE = "likelihood.noise_covar.raw_noise"
_LOG_2PI = math.log(2 * math.pi)


class _MeanKernel(gpytorch.Module):
    """The spec's modules under the model's names, so ``functional_call`` takes the state's raw names."""

    def __init__(self, model: gpytorch.models.ExactGP):
        super().__init__()
        self.mean_module, self.covar_module = model.mean_module, model.covar_module
        self.likelihood = model.likelihood

    def forward(
        self, x1: torch.Tensor | None, x2: torch.Tensor | None = None, diag: bool = False, rows: int = 0
    ):
        if x1 is None:  # log p(θ) per row, as GPyTorch's marginal likelihood adds it
            total = 0.0
            for _, owner, prior, closure, _ in self.named_priors():
                total = total + prior.log_prob(closure(owner)).reshape(rows, -1).sum(-1)
            return total
        if x2 is None:
            return self.mean_module(x1)
        # ``forward`` skips the kernel's ``__call__``, which is where GPyTorch applies active_dims
        # (inner kernels of sums and products are called, so they apply their own).
        active = self.covar_module.active_dims
        if active is not None:
            x1, x2 = x1.index_select(-1, active.to(x1.device)), x2.index_select(-1, active.to(x2.device))
        out = self.covar_module.forward(x1, x2, diag=diag)
        # Composite kernels return lazy tensors; evaluate them while the batched parameters are in place.
        return out.to_dense() if hasattr(out, "to_dense") else out


class StationaryGram(torch.autograd.Function):
    """``s · k(‖z_i − z_j‖) + σ² I`` for RBF or Matérn-ν (ν = 3/2, 5/2) kernels on scaled inputs
    ``Z = X / ℓ``, with a hand-written backward.

    Small-M throughput is bound by passes over the ``(B, M, M)`` tensors, not by arithmetic:
    GPyTorch's kernel ``forward`` makes about eight and autograd as many again; this fused version
    makes five forward and four backward (benchmarks/engine_throughput.py). Tests compare it with
    GPyTorch's kernels and with ``torch.autograd.gradcheck``.
    """

    @staticmethod
    def forward(ctx, Z, outputscale, noise, nu) -> torch.Tensor:
        sq = (Z * Z).sum(-1)
        D = torch.baddbmm(sq.unsqueeze(-1) + sq.unsqueeze(-2), Z, Z.transpose(-1, -2), alpha=-2.0)
        D.clamp_min_(0).diagonal(dim1=-2, dim2=-1).zero_()
        if nu is None:  # RBF: k = exp(-D/2)
            unit = torch.exp(D.mul_(-0.5))
            e = None
        else:  # Matérn: r = √(2ν D)
            r = D.mul_(2 * nu).sqrt_()
            e = torch.exp(-r)
            unit = (1 + r) * e if nu == 1.5 else (1 + r + r * r / 3) * e
            e = e if nu == 1.5 else (1 + r) * e
        ctx.nu = nu
        ctx.save_for_backward(Z, outputscale, unit, e)
        K = unit * outputscale.reshape(-1, 1, 1)
        K.diagonal(dim1=-2, dim2=-1).add_(noise.reshape(-1, 1))
        return K

    @staticmethod
    def backward(ctx, grad) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None]:
        Z, outputscale, unit, e = ctx.saved_tensors
        nu = ctx.nu
        grad_noise = torch.diagonal(grad, dim1=-2, dim2=-1).sum(-1)
        P = grad * unit
        grad_s = P.sum((-1, -2))
        # dk/dD: RBF -k/2; Matérn-3/2 -(3/2) e^{-r}; Matérn-5/2 -(5/6)(1 + r) e^{-r}
        if nu is None:
            G, c = P, -0.5
        else:
            G, c = grad * e, (-1.5 if nu == 1.5 else -5.0 / 6.0)
        H = G + G.transpose(-1, -2)  # D_ij depends on z_i and z_j symmetrically
        grad_Z = (2 * c) * outputscale.reshape(-1, 1, 1) * (H.sum(-1, keepdim=True) * Z - H @ Z)
        return grad_Z, grad_s.reshape(outputscale.shape), grad_noise.reshape(-1), None


def stationary_fast_path(spec: GPSpec) -> tuple[str | None, str, float | None] | None:
    """``(outputscale name or None, lengthscale name, ν or None)`` when the kernel is a (scaled)
    RBF or Matérn-3/2, -5/2 without active_dims; else ``None`` (GPyTorch's forward). Priors are
    added to the loss separately (:meth:`BatchedGP.nll`)."""
    return stationary_kernel(spec.kernel)


def stationary_kernel(kernel, prefix: str = "covar_module.") -> tuple[str | None, str, float | None] | None:
    """:func:`stationary_fast_path` for one kernel module whose state names start with ``prefix``
    (a multi-output spec's input kernels: ``covar_module.`` or ``covar_module.kernels.<q>.``)."""
    outer, scale = kernel, None
    if type(kernel) is gpytorch.kernels.ScaleKernel:
        scale, kernel = prefix + "outputscale", kernel.base_kernel
        prefix = prefix + "base_kernel."
    if type(kernel) is gpytorch.kernels.RBFKernel:
        nu = None
    elif type(kernel) is gpytorch.kernels.MaternKernel and kernel.nu in (1.5, 2.5):
        nu = kernel.nu
    else:
        return None
    if any(getattr(m, "active_dims", None) is not None for m in outer.modules()):
        return None
    return scale, prefix + "lengthscale", nu


class BatchedGP:
    """The spec's GP evaluated for many parameter sets at once (one per row)."""

    def __init__(self, spec: GPSpec, compiled: bool | None = None):
        model = spec.build()
        if type(model) is not ExactGPModel:
            raise UnsupportedSpec(
                f"its tensor path evaluates mean(x) and kernel(x, x') of an ExactGPModel; this spec builds "
                f"a {type(model).__name__} (a multi-output spec's kernel multiplies a task covariance "
                "indexed by X's last column: fedgp.engines.hadamard_gp.HadamardBatchedGP evaluates it)"
            )
        if type(model.likelihood) is not gpytorch.likelihoods.GaussianLikelihood or NOISE not in {
            p.raw_name for p in spec.params
        }:
            raise UnsupportedSpec(
                "its tensor path supports GaussianLikelihood with one homoskedastic noise; "
                f"got {type(model.likelihood).__name__}"
            )
        self._adopt(spec, _MeanKernel(model))
        self.fast = stationary_fast_path(spec)
        if compiled and (self.fast is None or not compiled_step.available()):
            why = "numba is not installed" if self.fast is not None else "the kernel is not RBF/Matérn"
            raise InputError(f"compiled=True needs an RBF or Matérn kernel and numba; {why}")
        # The compiled minibatch step (fedgp.engines.compiled) by default wherever it applies.
        self.compiled = self.fast is not None and compiled_step.available() and compiled is not False

    def _adopt(self, spec: GPSpec, module: gpytorch.Module) -> None:
        """Evaluate ``spec`` through ``module`` (its modules under the model's names), frozen: the
        parameters come from the state each call."""
        self.spec, self.module = spec, module
        self.has_priors = any(True for _ in module.named_priors())
        for p in module.parameters():
            p.requires_grad_(False)
        self.noise = next(p for p in spec.params if p.raw_name == NOISE)
        self.parameter_free_mean = not any(True for _ in module.mean_module.parameters())

    def to(self, device: torch.device) -> BatchedGP:
        """The modules' buffers (priors' parameters, active_dims) moved to ``device``; returns self."""
        self.module.to(device)
        return self

    def _module_params(self, raw: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {p.raw_name: raw[p.name] for p in self.spec.params}

    def log_prior(self, raw: dict[str, torch.Tensor], rows: int) -> torch.Tensor:
        """``(rows,)`` log p(θ) of the modules' GPyTorch priors."""
        return torch.func.functional_call(self.module, self._module_params(raw), (None,), {"rows": rows})

    def mean(self, raw: dict[str, torch.Tensor], X: torch.Tensor) -> torch.Tensor:
        """The mean module evaluated with the parameters ``raw`` (batched over clients)."""
        if self.parameter_free_mean:  # no parameters (e.g. ZeroMean): skip functional_call's overhead
            return self.module.mean_module(X)
        return torch.func.functional_call(self.module, self._module_params(raw), (X,))

    def kernel(
        self, raw: dict[str, torch.Tensor], X1: torch.Tensor, X2: torch.Tensor, diag: bool = False
    ) -> torch.Tensor:
        """The kernel evaluated with the parameters ``raw`` between ``X1`` and ``X2`` (batched over
        clients)."""
        return torch.func.functional_call(self.module, self._module_params(raw), (X1, X2), {"diag": diag})

    def noise_variance(self, raw: dict[str, torch.Tensor]) -> torch.Tensor:
        """``(rows,)`` observation-noise variances."""
        return self.noise.transform(raw[self.noise.name]).reshape(-1)

    def _stationary_inputs(self, raw, X):
        """``((X - x₀) / ℓ, outputscale, noise)`` per row, for the stationary fast paths.

        Each row is shifted by its first point ``x₀`` (always a real point: padding comes last).
        The kernel is translation-invariant, so this is exact, and it keeps ``‖z_i‖²`` small: the
        Gram matrix forms ``‖z_i − z_j‖²`` as ``‖z_i‖² + ‖z_j‖² − 2 z_i·z_j``, which cancels
        catastrophically for inputs far from the origin (X = 1e8 + U(0, 1) was not positive
        definite). GPyTorch centres its inputs the same way (by their mean) for the same reason."""
        scale, lengthscale, _ = self.fast
        ls = self.spec.param(lengthscale).transform(raw[lengthscale])
        s = (
            self.spec.param(scale).transform(raw[scale])
            if scale
            else torch.ones(len(X), dtype=X.dtype, device=X.device)
        )
        return (X - X[..., :1, :]) / ls, s.reshape(-1), self.noise_variance(raw)

    def train_covariance(self, raw, X, mask) -> torch.Tensor:
        """``K(X, X) + σ² I`` (the fused stationary path when it applies, else GPyTorch's kernel
        ``forward``), with padded rows/columns replaced by the identity."""
        if self.fast is not None:
            K = StationaryGram.apply(*self._stationary_inputs(raw, X), self.fast[2])
        else:
            noise = self.noise_variance(raw)
            K = self.kernel(raw, X, X) + noise.reshape(-1, 1, 1) * torch.eye(
                X.shape[-2], dtype=X.dtype, device=X.device
            )
        return self.pad_identity(K, mask)

    @staticmethod
    def pad_identity(K: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """``K`` with the padded rows/columns (``mask`` False) replaced by the identity's: exact, they
        add nothing to the log-determinant or the quadratic form."""
        if mask is None:
            return K
        eye = torch.eye(K.shape[-1], dtype=K.dtype, device=K.device)
        return torch.where(mask.unsqueeze(-1) & mask.unsqueeze(-2), K, eye)

    def row_noise(self, raw: dict[str, torch.Tensor], X: torch.Tensor) -> torch.Tensor:
        """``(rows, n)`` observation-noise variance at each of the rows ``X`` (one noise per row here)."""
        return self.noise_variance(raw).unsqueeze(-1).expand(-1, X.shape[-2])

    def check_rows(self, X: torch.Tensor, where: str) -> None:
        """Refuse inputs this GP cannot read, naming ``where`` (a multi-output GP checks the output
        column); nothing to check for one output."""

    def nll(self, raw, X, y, mask, client_ids) -> torch.Tensor:
        """Per-point exact NLL ``-log p(y | X) / n - w log p(θ)`` per row (padded points excluded;
        ``w = 1 / n`` or the spec's ``prior_weight``, as :func:`fedgp.models.objective.minibatch_nll`).

        ``mask`` marks each row's points; they must come first (padding at the end), as the
        engine lays them out."""
        value = self._data_nll(raw, X, y, mask, client_ids)
        if not self.has_priors:
            return value
        w = self.spec.prior_weight
        n = X.shape[-2] if mask is None else mask.sum(-1).to(X.dtype)
        prior = self.log_prior(raw, len(value)).to(value.dtype)
        return value - (prior / n if w is None else w * prior)

    def _data_nll(self, raw, X, y, mask, client_ids) -> torch.Tensor:
        r = y - self.mean(raw, X)
        n = torch.full(r.shape[:1], X.shape[-2], dtype=torch.long, device=X.device)
        if mask is not None:
            r = torch.where(mask, r, torch.zeros((), dtype=r.dtype))
            n = mask.sum(-1)
        if self.compiled and X.shape[-2] <= compiled_step.MAX_POINTS and X.device.type == "cpu":
            value = compiled_step.stationary_nll(*self._stationary_inputs(raw, X), r, n, self.fast[2])
            if value is not None:
                return value
            # a matrix needs jitter: the tensor path below retries with it, or names the client
        K = self.train_covariance(raw, X, mask)
        return GaussianNLL.apply(K, r, n.to(X.dtype), client_ids)


class GaussianNLL(torch.autograd.Function):
    """``½ (rᵀK⁻¹r + log|K| + n log 2π) / n`` per row, with the closed-form backward
    ``∂/∂K = ½ (K⁻¹ − ααᵀ) / n``, ``∂/∂r = α / n`` (α = K⁻¹r).

    The forward forms K⁻¹ once from the Cholesky factor (LAPACK ``potri`` via
    ``torch.cholesky_inverse``), so the backward is elementwise. For batches of small matrices this
    is faster than autograd through ``cholesky`` and ``solve_triangular`` (about 2×) and than a
    triangular inverse followed by ``L⁻ᵀL⁻¹`` (about 10 %; benchmarks/batched_kernels.py).
    """

    @staticmethod
    def forward(ctx, K, r, n, client_ids) -> torch.Tensor:
        L = cholesky(K, client_ids)
        K_inv = torch.cholesky_inverse(L)
        alpha = (K_inv @ r.unsqueeze(-1)).squeeze(-1)
        logdet = 2 * torch.log(torch.diagonal(L, dim1=-2, dim2=-1)).sum(-1)
        ctx.save_for_backward(K_inv, alpha, n)
        return 0.5 * ((r * alpha).sum(-1) + logdet + n * _LOG_2PI) / n

    @staticmethod
    def backward(ctx, grad) -> tuple[torch.Tensor, torch.Tensor, None, None]:
        K_inv, alpha, n = ctx.saved_tensors
        scale = (grad / n).reshape(-1, 1)
        half_c = (0.5 * scale).unsqueeze(-1)
        grad_K = (K_inv - alpha.unsqueeze(-1) * alpha.unsqueeze(-2)).mul_(half_c)
        return grad_K, scale * alpha, None, None


def cholesky(K: torch.Tensor, client_ids: Sequence) -> torch.Tensor:
    """Batched Cholesky with GPyTorch's jitter schedule (``psd_safe_cholesky``), row by row.

    Only rows that fail get jitter, and each gets the smallest of 1e-8, 1e-7, 1e-6 (float32: 1e-6,
    1e-5, 1e-4) that works, added in GPyTorch's increments; rows that succeed keep their factor. A
    :class:`FactorizationError` names exactly the clients whose rows fail at the largest jitter.
    """
    L, info = torch.linalg.cholesky_ex(K)
    failed = torch.nonzero(info > 0).flatten()
    if not len(failed):
        return L
    first = CHOLESKY_JITTER if K.dtype == torch.float64 else 1e-6
    A = K[failed].clone()  # the failing rows, with GPyTorch's cumulative jitter
    pending = torch.ones(
        len(failed), dtype=torch.bool, device=K.device
    )  # rows of ``failed`` still without a factor
    previous = 0.0
    for attempt in range(CHOLESKY_MAX_TRIES):
        jitter = first * 10**attempt
        # Exactly GPyTorch's increment: a bool mask times a Python float (default dtype, as there).
        A.diagonal(dim1=-2, dim2=-1).add_((pending * (jitter - previous)).unsqueeze(-1))
        previous = jitter
        rows = torch.nonzero(pending).flatten()
        L_try, info_try = torch.linalg.cholesky_ex(A[rows])
        done = info_try == 0
        L[failed[rows[done]]] = L_try[done]
        pending[rows[done]] = False
        if not bool(pending.any()):
            return L
    bad = [client_ids[i] for i in failed[pending].tolist()]
    shown = bad[:5]
    others = f" (and others: {shown[1:]!r})" if len(shown) > 1 else ""
    raise FactorizationError(
        f"client {shown[0]!r}{others}: covariance "
        f"matrix not positive definite after {CHOLESKY_MAX_TRIES} jitter retries (largest jitter "
        f"{first * 10 ** (CHOLESKY_MAX_TRIES - 1):.0e})",
        tuple(dict.fromkeys(bad)),
    )
