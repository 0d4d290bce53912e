"""The batched engine: every client's local steps as one tensor program.

A Python loop over clients, each with its own GPyTorch ``ExactGP``, spends its time in per-call
overhead: a 32-point exact GP step is a few microseconds of arithmetic and a millisecond of
bookkeeping. Here the participating clients' minibatches are stacked into ``(B, M, M)`` tensors:
the spec's own GPyTorch mean and kernel modules are evaluated with a batch of parameter sets
(``torch.func.functional_call`` on their ``forward``), and the marginal likelihood is a batched
Cholesky written out below — GPyTorch's batch mode needs one model per parameter batch shape and
routes through ``linear_operator`` objects whose overhead is what we are removing.

For RBF and Matérn kernels on the CPU, when numba is installed, a whole local round of a chunk is
one compiled call instead (:mod:`fedgp.engines.fused`: minibatch draws, parameter transforms and
the optimiser too), and where that does not apply (priors, float32 minibatches, ...) each minibatch
step is one compiled function (:mod:`fedgp.engines.compiled`: Gram matrix, Cholesky, inverse, NLL
and gradients vectorised across clients); the tensor path below remains for other kernels, for
matrices that need jitter, for GPUs, and as the reference the compiled paths are tested against.

It computes exactly what the sequential engine computes (same minibatches, same optimiser,
float64): tests hold the two engines to 1e-8. Unequal client sizes are handled by padding with
an identity block (exact: it adds nothing to the log-determinant or the quadratic form) and
unequal step counts by masking the optimiser step. Clients are processed in chunks, so memory is
bounded whatever the number of clients; full-data evaluations are further grouped by size under a
memory budget. GPyTorch priors enter the loss as in the sequential engine (``BatchedGP.nll``) and
``active_dims`` are applied as GPyTorch's ``Kernel.__call__`` does. At construction the engine
checks itself against GPyTorch on a random case; a spec it cannot reproduce (another likelihood,
e.g. ``FixedNoiseGaussianLikelihood``, or a kernel whose ``forward`` does not broadcast over
parameter batches) is evaluated client by client with GPyTorch instead (:class:`PerClientOps`),
with a one-time warning: the sequential engine's numbers, without the speed-up.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator, Sequence

import gpytorch
import torch

from fedgp.data.client import ClientData
from fedgp.engines import compiled as compiled_step
from fedgp.engines import fused as fused_round
from fedgp.engines.base import InProcessEngine
from fedgp.engines.minibatch import draw_minibatches
from fedgp.models.objective import CHOLESKY_JITTER, CHOLESKY_MAX_TRIES, FactorizationError
from fedgp.models.posterior import Prediction
from fedgp.models.spec import GPSpec
from fedgp.models.state import HyperState
from fedgp.strategies.base import TrainResult
from fedgp.strategies.local import LocalTraining

__all__ = ["BatchedEngine", "BatchedOps", "BatchedGP", "PerClientOps", "UnsupportedSpec"]

_NOISE = "likelihood.noise_covar.raw_noise"
_LOG_2PI = math.log(2 * math.pi)
_WARNED: set[str] = set()
CPU_CHUNK_SIZE, GPU_CHUNK_SIZE = 512, 16_384  # default clients per batched program (BatchedEngine)


class UnsupportedSpec(ValueError):
    """The tensor path cannot evaluate a spec; the engine falls back to per-client GPyTorch."""


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
    def forward(ctx, Z, outputscale, noise, nu):
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
    def backward(ctx, grad):
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


def _stationary_fast_path(spec: GPSpec):
    """``(outputscale name or None, lengthscale name, ν or None)`` when the kernel is a (scaled)
    RBF or Matérn-3/2, -5/2 without active_dims; else ``None`` (GPyTorch's forward). Priors are
    added to the loss separately (:meth:`BatchedGP.nll`)."""
    kernel = spec.kernel
    scale = None
    if type(kernel) is gpytorch.kernels.ScaleKernel:
        scale, kernel = "covar_module.outputscale", kernel.base_kernel
        prefix = "covar_module.base_kernel."
    else:
        prefix = "covar_module."
    if type(kernel) is gpytorch.kernels.RBFKernel:
        nu = None
    elif type(kernel) is gpytorch.kernels.MaternKernel and kernel.nu in (1.5, 2.5):
        nu = kernel.nu
    else:
        return None
    if any(getattr(m, "active_dims", None) is not None for m in spec.kernel.modules()):
        return None
    return scale, prefix + "lengthscale", nu


class BatchedGP:
    """The spec's GP evaluated for many parameter sets at once (one per row)."""

    def __init__(self, spec: GPSpec, compiled: bool | None = None):
        model = spec.build()
        if type(model.likelihood) is not gpytorch.likelihoods.GaussianLikelihood or _NOISE not in {
            p.raw_name for p in spec.params
        }:
            raise UnsupportedSpec(
                "its tensor path supports GaussianLikelihood with one homoskedastic noise; "
                f"got {type(model.likelihood).__name__}"
            )
        self.spec = spec
        self.module = _MeanKernel(model)
        self.has_priors = any(True for _ in self.module.named_priors())
        for p in self.module.parameters():
            p.requires_grad_(False)
        self.noise = next(p for p in spec.params if p.raw_name == _NOISE)
        self.parameter_free_mean = not any(True for _ in self.module.mean_module.parameters())
        self.fast = _stationary_fast_path(spec)
        if compiled and (self.fast is None or not compiled_step.available()):
            why = "numba is not installed" if self.fast is not None else "the kernel is not RBF/Matérn"
            raise ValueError(f"compiled=True needs an RBF or Matérn kernel and numba; {why}")
        # The compiled minibatch step (fedgp.engines.compiled) by default wherever it applies.
        self.compiled = self.fast is not None and compiled_step.available() and compiled is not False

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

    def kernel(self, raw: dict[str, torch.Tensor], X1: torch.Tensor, X2: torch.Tensor, diag: bool = False):
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

    def train_covariance(self, raw, X, mask):
        """``K(X, X) + σ² I`` (the fused stationary path when it applies, else GPyTorch's kernel
        ``forward``), with padded rows/columns replaced by the identity."""
        if self.fast is not None:
            K = StationaryGram.apply(*self._stationary_inputs(raw, X), self.fast[2])
        else:
            noise = self.noise_variance(raw)
            K = self.kernel(raw, X, X) + noise.reshape(-1, 1, 1) * torch.eye(
                X.shape[-2], dtype=X.dtype, device=X.device
            )
        n = X.shape[-2]
        eye = torch.eye(n, dtype=X.dtype, device=X.device)
        if mask is not None:
            pair = mask.unsqueeze(-1) & mask.unsqueeze(-2)
            K = torch.where(pair, K, eye)
        return K

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
    def forward(ctx, K, r, n, client_ids):
        L = cholesky(K, client_ids)
        K_inv = torch.cholesky_inverse(L)
        alpha = (K_inv @ r.unsqueeze(-1)).squeeze(-1)
        logdet = 2 * torch.log(torch.diagonal(L, dim1=-2, dim2=-1)).sum(-1)
        ctx.save_for_backward(K_inv, alpha, n)
        return 0.5 * ((r * alpha).sum(-1) + logdet + n * _LOG_2PI) / n

    @staticmethod
    def backward(ctx, grad):
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


class BatchedEngine(InProcessEngine):
    """Runs chunks of clients as batched tensor programs.

    Args:
        chunk_size: clients per batched program (bounds memory; cost is linear in clients). The
            default on the CPU keeps one ``(chunk, 32, 32)`` float64 tensor at 4 MiB, in cache: 512
            was the fastest of 256–1,024 for M = 32 in both precisions, by up to 20 % over 1,024.
            On a GPU the default is 16,384: a chunk of 512 leaves it waiting on kernel launches
            (4.5× slower at K = 10,000 on an H200; results/benchmarks/gpu_batched.csv).
        memory_mb: budget for one full-data evaluation group (kernel matrices of whole clients).
        check: compare with GPyTorch on a random case at construction (recommended).
        minibatch_dtype: precision of the local minibatch steps only (e.g. ``torch.float32``, about
            1.6× faster here); states, optimiser and full-data evaluations stay in the spec's dtype.
            Results then differ from the sequential engine by float32 rounding.
        compiled: the compiled minibatch step of :mod:`fedgp.engines.compiled` (RBF/Matérn
            kernels, needs numba): ``None`` uses it where it applies, ``False`` never, ``True`` insists.
            It computes the same numbers as the tensor path (to rounding), 2–3× faster.
        fused: a whole local round per chunk in one compiled call (:mod:`fedgp.engines.fused`:
            minibatch draws, transforms and optimiser compiled too): ``None`` where it applies (and
            ``compiled`` is not ``False``), ``False`` never (the step-by-step path), ``True`` insists
            (a ``ValueError`` says why a spec cannot; a round it cannot run falls back, e.g.
            minibatches over 64 points).
        device: where the tensor path runs (e.g. ``"cuda"``): the clients' data are copied there
            once at construction (``ClientData`` stays float64 on the CPU), states are moved there per
            chunk and replies come back to the CPU. The compiled step is CPU-only, so on a GPU the
            tensor path runs; the per-client fallback runs on the CPU.
        loopback, timeout: as for every in-process engine (:class:`~fedgp.engines.base.InProcessEngine`);
            a timeout applies to a whole chunk, whose clients all fail when it is exceeded.
    """

    name = "batched"

    def __init__(
        self,
        spec: GPSpec,
        clients: Sequence[ClientData],
        seed: int = 0,
        chunk_size: int | None = None,
        memory_mb: float = 256.0,
        check: bool = True,
        minibatch_dtype: torch.dtype | None = None,
        compiled: bool | None = None,
        device: str | torch.device = "cpu",
        fused: bool | None = None,
        **options,
    ):
        self.device = torch.device(device)
        if chunk_size is None:
            chunk_size = GPU_CHUNK_SIZE if self.device.type == "cuda" else CPU_CHUNK_SIZE
        if chunk_size < 1:
            raise ValueError("chunk_size must be >= 1")
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(
                f"device={str(device)!r}, but this PyTorch sees no CUDA GPU (torch.cuda.is_available() "
                "is False); install a CUDA build of PyTorch on a GPU machine, or leave device unset"
            )
        super().__init__(spec, clients, seed, **options)
        self.chunk_size, self.memory_mb = chunk_size, memory_mb
        self.model = None  # a GPyTorch model for the per-client fallback, built when first needed
        self.minibatch_dtype = minibatch_dtype or spec.dtype
        if self.minibatch_dtype not in (torch.float32, torch.float64):
            raise ValueError(f"minibatch_dtype must be torch.float32 or torch.float64, got {minibatch_dtype}")
        self.gp = _batched_gp(spec, compiled, check, clients[0].n_features if clients else 1)
        if self.gp is not None:
            self.gp.module.to(self.device)  # the modules' buffers (priors' parameters, active_dims)
        self.fused = self._fused_layout(fused)
        self.sizes = torch.tensor([c.n for c in clients], dtype=torch.long)
        self.offsets = torch.cumsum(self.sizes, 0) - self.sizes
        self.data_changed()

    def _fused_layout(self, fused: bool | None) -> fused_round.FusedLayout | None:
        """The fused round's layout where it applies (see ``fused``), else ``None``."""
        if fused is False:
            return None
        if self.gp is None:
            why = "the spec runs client by client with GPyTorch"
        elif not self.gp.compiled:
            why = "the compiled step is off (compiled=False, or no numba)"
        elif self.device.type != "cpu":
            why = f"it runs on the CPU only, not {self.device}"
        elif self.minibatch_dtype != torch.float64:
            why = "minibatch_dtype is not float64"
        else:
            found = fused_round.layout(self.spec)
            if not isinstance(found, str):
                return found
            why = found
        if fused:
            raise ValueError(f"fused=True: the fused local round cannot run here: {why}")
        return None

    def data_changed(self) -> None:
        """Stack every client's training data end to end (and once more in the minibatch precision).

        ClientData keeps float64 on the CPU as storage; the engine's copy is in the spec's precision
        on ``device``, moved once per transform (N·(d+1) numbers); states are moved per chunk and task."""
        dtype = self.spec.dtype
        self.X = torch.cat([c.X for c in self.clients]).to(self.device, dtype)
        self.y = torch.cat([c.y for c in self.clients]).to(self.device, dtype)
        if self.minibatch_dtype != dtype:  # a copy in the minibatch precision, gathered every step
            self.X_mb, self.y_mb = self.X.to(self.minibatch_dtype), self.y.to(self.minibatch_dtype)
        else:
            self.X_mb, self.y_mb = self.X, self.y

    def ops(self, clients: torch.Tensor, rnd: int) -> BatchedOps | PerClientOps:
        if self.gp is None:
            return PerClientOps(self, clients, rnd)
        return BatchedOps(self, clients, rnd)

    # -- data access ------------------------------------------------------------------------------
    def padded(self, rows: torch.Tensor, lengths: torch.Tensor | None = None):
        """Whole training sets of clients ``rows``: X ``(R, N, d)``, y ``(R, N)``, mask ``(R, N)``."""
        lengths = self.sizes[rows] if lengths is None else lengths
        n = int(lengths.max())
        pos = torch.arange(n)
        mask = pos.unsqueeze(0) < lengths.unsqueeze(1)
        flat = torch.where(mask, self.offsets[rows].unsqueeze(1) + pos, self.offsets[rows].unsqueeze(1))
        return self.X[flat], self.y[flat], (None if bool(mask.all()) else mask.to(self.device))

    def size_groups(
        self, rows: torch.Tensor, extra_rows: int = 1, test: bool = False
    ) -> Iterator[torch.Tensor]:
        """Positions into ``rows``, grouped by client size so each group fits the memory budget."""
        sizes = self.sizes[rows]
        if test:
            sizes = sizes + torch.tensor([self.clients[i].X_test.shape[0] for i in rows.tolist()])
        order = torch.argsort(sizes, stable=True)
        budget = self.memory_mb * 2**20 / 8 / 12  # ~12 n×n float64 temporaries per row
        group: list[int] = []
        for pos in order.tolist():
            n = int(sizes[pos])
            if group and (len(group) + 1) * extra_rows * n * n > budget:
                yield torch.tensor(group)
                group = []
            group.append(pos)
        if group:
            yield torch.tensor(group)


class BatchedOps:
    """:class:`~fedgp.strategies.base.ClientOps` for a chunk of clients."""

    def __init__(self, engine: BatchedEngine, rows: torch.Tensor, rnd: int):
        self.engine, self.round, self.seed = engine, rnd, engine.seed
        self.rows = rows  # positions of the clients' data in this engine
        self.indices = engine.keys[rows]  # their keys: what their random streams are keyed by
        self.sizes = engine.sizes[rows]
        self.clients = [engine.clients[i] for i in rows.tolist()]
        self.spec, self.gp = engine.spec, engine.gp

    # -- helpers --------------------------------------------------------------------------------
    def _rows(self, states: HyperState):
        batch = states.batch_shape
        if len(batch) < 1 or batch[0] != len(self.rows):
            raise ValueError(f"states must have batch ({len(self.rows)}, ...), got {tuple(batch)}")
        extra = batch[1:]
        device = self.engine.device
        flat = states.map(lambda v, e: v.reshape(-1, *v.shape[len(batch) :]).to(device))
        per_client = int(torch.Size(extra).numel())
        return flat, extra, per_client

    def _ids(self, rows: torch.Tensor) -> list:
        return [self.engine.ids[i] for i in rows.tolist()]

    def _full_data_nll(self, raw: dict, client_pos: torch.Tensor, per_client: int, grad: bool, out: dict):
        """NLL (and raw gradients) on whole local datasets of the clients at ``client_pos``, one row
        per (client, extra state), written into ``out["loss"]`` / ``out["grads"]`` (all rows)."""
        for group in self.engine.size_groups(self.rows[client_pos], per_client):
            row_idx = (client_pos[group].unsqueeze(1) * per_client + torch.arange(per_client)).reshape(-1)
            row_idx = row_idx.to(self.engine.device)
            clients = self.rows[client_pos[group]].repeat_interleave(per_client)
            X, y, mask = self.engine.padded(clients)
            sub = {
                k: v[row_idx].detach().requires_grad_(grad and self.spec.param(k).trainable)
                for k, v in raw.items()
            }
            with torch.set_grad_enabled(grad):
                value = self.gp.nll(sub, X, y, mask, self._ids(clients))
            if grad:
                leaves = [k for k in sub if sub[k].requires_grad]
                for k, g in zip(leaves, torch.autograd.grad(value.sum(), [sub[k] for k in leaves])):
                    out["grads"][k][row_idx] = g
            out["loss"][row_idx] = value.detach()

    # -- ClientOps --------------------------------------------------------------------------------
    def nll(self, states: HyperState) -> torch.Tensor:
        """Per-point exact NLL of each client's full data under each state, all clients at once (see
        :class:`~fedgp.strategies.ClientOps`)."""
        flat, extra, per_client = self._rows(states)
        raw = dict(self.spec.to_raw(flat))
        out = {
            "loss": torch.empty(len(self.rows) * per_client, dtype=self.spec.dtype, device=self.engine.device)
        }
        self._full_data_nll(raw, torch.arange(len(self.rows)), per_client, False, out)
        return out["loss"].reshape(len(self.rows), *extra).to("cpu", torch.float64)

    def gradient(self, states: HyperState, batch_size: int | None = None) -> tuple[torch.Tensor, HyperState]:
        """Per-point NLL and its gradient with respect to the raw trainable parameters, all clients at
        once (see :class:`~fedgp.strategies.ClientOps`)."""
        flat, extra, per_client = self._rows(states)
        raw = dict(self.spec.to_raw(flat))
        B = len(self.rows)
        out = {
            "loss": torch.empty(B * per_client, dtype=self.spec.dtype, device=self.engine.device),
            "grads": {k: torch.zeros_like(v) for k, v in raw.items()},
        }
        # A client with at most batch_size points uses all of them (as the sequential engine).
        full = torch.ones(B, dtype=torch.bool) if batch_size is None else self.sizes <= batch_size
        if bool(full.any()):
            self._full_data_nll(raw, full.nonzero().flatten(), per_client, True, out)
        if not bool(full.all()):
            pos = (~full).nonzero().flatten()
            idx = draw_minibatches(
                self.engine.seed,
                self.round,
                self.indices[pos],
                self.sizes[pos],
                1,
                batch_size,
                stream="gradient",
            )[:, 0]
            rows = (
                (pos.unsqueeze(1) * per_client + torch.arange(per_client)).reshape(-1).to(self.engine.device)
            )
            clients = self.rows[pos].repeat_interleave(per_client)
            flat_idx = self.engine.offsets[clients].unsqueeze(1) + idx.repeat_interleave(per_client, 0)
            sub = {k: v[rows].detach().requires_grad_(self.spec.param(k).trainable) for k, v in raw.items()}
            value = self.gp.nll(
                sub, self.engine.X[flat_idx], self.engine.y[flat_idx], None, self._ids(clients)
            )
            leaves = [k for k in sub if sub[k].requires_grad]
            for k, g in zip(leaves, torch.autograd.grad(value.sum(), [sub[k] for k in leaves])):
                out["grads"][k][rows] = g
            out["loss"][rows] = value.detach()
        shaped = HyperState(out["grads"], flat.event_shapes).map(
            lambda v, e: v.reshape(B, *extra, *v.shape[1:]).cpu()
        )
        return out["loss"].reshape(B, *extra).to("cpu", torch.float64), shaped

    def _minibatch_indices(self, local: LocalTraining, steps: torch.Tensor, batch: torch.Tensor):
        """``(B, S, M)`` minibatch indices, drawn per group of equal M_k so every client gets exactly
        the draws the sequential engine gives it; shorter minibatches are padded with -1 to M."""
        S, M = int(steps.max()), int(batch.max())
        idx = torch.full((len(self.rows), S, M), -1, dtype=torch.long)
        for m in batch.unique().tolist():
            pos = (batch == m).nonzero().flatten()
            X_pad = self.engine.padded(self.rows[pos])[0] if local.minibatch == "nearest" else None
            idx[pos, :, :m] = draw_minibatches(
                self.engine.seed, self.round, self.indices[pos], self.sizes[pos], S, m, local.minibatch, X_pad
            )
        return idx

    def train(self, states: HyperState, local: LocalTraining) -> TrainResult:
        """Run the local optimiser from each state, every client's minibatch steps as one batched program
        (see :class:`~fedgp.strategies.ClientOps`)."""
        flat, extra, per_client = self._rows(states)
        steps = local.num_steps(self.sizes)
        batch = local.batch_sizes(self.sizes)
        layout = self.engine.fused
        if (
            layout is not None
            and fused_round.unsupported(local, batch, self.engine.X.shape[1], layout) is None
        ):
            result = self._train_fused(layout, flat, extra, per_client, steps, batch, local)
            if result is not None:
                return result
        return self._train_stepwise(flat, extra, per_client, steps, batch, local)

    def _train_fused(self, layout, flat, extra, per_client, steps, batch, local) -> TrainResult | None:
        """The whole round in one compiled call (:mod:`fedgp.engines.fused`); ``None`` when a
        Cholesky failed on the way (the step-by-step path then retries with jitter or names it)."""
        B = len(self.rows)
        raw = self.spec.to_raw(flat)
        rows = B * per_client
        theta = torch.cat([raw[k].reshape(rows, -1) for k in layout.names], 1)
        given = self._minibatch_indices(local, steps, batch) if local.minibatch == "nearest" else None
        theta, loss, info = fused_round.local_round(
            layout,
            self.engine.X,
            self.engine.y,
            self.engine.offsets[self.rows],
            self.sizes,
            fused_round.minibatch_keys(self.engine.seed, self.round, self.indices),
            steps,
            batch,
            given,
            torch.arange(B).repeat_interleave(per_client),
            theta,
            local,
            self.round,
        )
        if info.any():
            return None
        pieces = theta.split(list(layout.widths), 1)
        trained = {k: piece.reshape(rows, *flat[k].shape[1:]) for k, piece in zip(layout.names, pieces)}
        new = self.spec.from_raw(HyperState(trained, self.spec.event_shapes))
        new = new.map(lambda v, e: v.reshape(B, *extra, *v.shape[1:]))
        return TrainResult(new, loss.reshape(B, *extra), steps)

    def _train_stepwise(self, flat, extra, per_client, steps, batch, local) -> TrainResult:
        """One batched (compiled or tensor) minibatch step at a time, optimiser in torch."""
        B = len(self.rows)
        S = int(steps.max())
        idx = self._minibatch_indices(local, steps, batch)
        device = self.engine.device
        mask = (idx >= 0).repeat_interleave(per_client, 0).to(device)  # (rows, S, M)
        flat_idx = self.engine.offsets[self.rows].view(B, 1, 1) + idx.clamp_min(0)
        flat_idx = flat_idx.repeat_interleave(per_client, 0)
        row_steps = steps.repeat_interleave(per_client).to(device)
        ids = self._ids(self.rows.repeat_interleave(per_client))

        raw_all = dict(self.spec.to_raw(flat))
        # The trainable raw parameters side by side in one (rows, P) tensor: one gradient and one
        # optimiser update per step instead of one per parameter (both are elementwise).
        trainable = [p.name for p in self.spec.params if p.trainable]
        shapes = [raw_all[k].shape[1:] for k in trainable]
        widths = [shape.numel() for shape in shapes]
        start = torch.cat([raw_all[k].reshape(len(row_steps), -1) for k in trainable], 1)
        theta, opt_state = start, local.optimizer.init({"theta": start})
        total = torch.zeros(len(row_steps), dtype=self.spec.dtype, device=device)
        mb_dtype = self.engine.minibatch_dtype
        for s in range(S):
            active = s < row_steps
            leaf = theta.detach().requires_grad_()
            params = dict(raw_all)
            for k, piece, shape in zip(trainable, leaf.split(widths, 1), shapes):
                params[k] = piece.reshape(-1, *shape)
            m_s = mask[:, s]
            value = self.gp.nll(
                {k: v.to(mb_dtype) for k, v in params.items()},
                self.engine.X_mb[flat_idx[:, s]],
                self.engine.y_mb[flat_idx[:, s]],
                None if bool(m_s.all()) else m_s,
                ids,
            )
            (grad,) = torch.autograd.grad(value.sum(), [leaf])
            if local.prox_mu:
                grad = grad + local.prox_mu * (theta - start)
            t = self.round * row_steps + s
            theta = local.optimizer.step({"theta": theta}, {"theta": grad}, opt_state, t, active)["theta"]
            total += torch.where(active, value.detach().to(total.dtype), torch.zeros((), dtype=total.dtype))
        raw = {
            k: piece.reshape(-1, *shape) for k, piece, shape in zip(trainable, theta.split(widths, 1), shapes)
        }
        raw_all.update(raw)
        new = self.spec.from_raw(HyperState(raw_all, self.spec.event_shapes))
        new = new.map(lambda v, e: v.reshape(B, *extra, *v.shape[1:]).cpu())
        loss = (total / row_steps.to(total.dtype)).reshape(B, *extra).to("cpu", torch.float64)
        return TrainResult(new, loss, steps)

    def predict(
        self, states: HyperState, X_new: torch.Tensor | None = None, full_cov: bool = False
    ) -> list[Prediction]:
        """Personalised posteriors of all clients of the chunk at once (batch ``(B,)`` states);
        at each client's test inputs, or at shared inputs ``X_new`` (with ``full_cov``, also the
        joint covariance of f there)."""
        flat, extra, per_client = self._rows(states)
        if extra:
            raise ValueError(f"predict needs one state per client, got extra batch {tuple(extra)}")
        raw = dict(self.spec.to_raw(flat))
        out: list[Prediction | None] = [None] * len(self.rows)
        for group in self.engine.size_groups(self.rows, 1, test=X_new is None):
            clients = self.rows[group]
            X, y, mask = self.engine.padded(clients)
            if X_new is None:
                missing = [
                    self.engine.ids[i] for i in clients.tolist() if self.engine.clients[i].X_test is None
                ]
                if missing:
                    raise ValueError(f"client {missing[0]!r} has no test split and no inputs were given")
                tests = [self.engine.clients[i].X_test.to(X.dtype) for i in clients.tolist()]
                lengths = torch.tensor([len(t) for t in tests])
                Xs = torch.nn.utils.rnn.pad_sequence(tests, batch_first=True).to(X.device)
            else:
                Xs = torch.as_tensor(X_new, dtype=X.dtype, device=X.device).expand(len(clients), *X_new.shape)
                lengths = torch.full((len(clients),), X_new.shape[0])
            sub = {k: v[group.to(X.device)] for k, v in raw.items()}
            with torch.no_grad():
                mean, var_f, noise, cov = self._posterior(sub, X, y, mask, Xs, self._ids(clients), full_cov)
                mean, var_f, noise = (t.cpu() for t in (mean, var_f, noise))
                cov = None if cov is None else cov.cpu()
            for j, pos in enumerate(group.tolist()):
                n = int(lengths[j])
                joint = None if cov is None else cov[j, :n, :n].clone()
                out[pos] = Prediction(
                    mean[j, :n].clone(), var_f[j, :n].clone(), var_f[j, :n] + noise[j], joint
                )
        return out  # type: ignore[return-value]

    def _posterior(self, raw, X, y, mask, Xs, ids, full_cov=False):
        K = self.gp.train_covariance(raw, X, mask)
        L = cholesky(K, ids)
        r = y - self.gp.mean(raw, X)
        # stationary kernels: shift both sides by the row's first point, as _stationary_inputs does
        shift = X[..., :1, :] if self.gp.fast is not None else X.new_zeros(())
        Ks = self.gp.kernel(raw, X - shift, Xs - shift)  # (B, N, T)
        if mask is not None:
            r = torch.where(mask, r, torch.zeros((), dtype=r.dtype))
            Ks = torch.where(mask.unsqueeze(-1), Ks, torch.zeros((), dtype=Ks.dtype))
        alpha = torch.cholesky_solve(r.unsqueeze(-1), L).squeeze(-1)
        mean = self.gp.mean(raw, Xs) + (Ks * alpha.unsqueeze(-1)).sum(-2)
        V = torch.linalg.solve_triangular(L, Ks, upper=False)
        prior = self.gp.kernel(raw, Xs - shift, Xs - shift, diag=True)
        var_f = (prior - (V * V).sum(-2)).clamp_min(0.0)
        cov = self.gp.kernel(raw, Xs, Xs) - V.transpose(-1, -2) @ V if full_cov else None
        return mean, var_f, self.gp.noise_variance(raw).unsqueeze(-1), cov


def _batched_gp(spec: GPSpec, compiled: bool | None, check: bool, d: int) -> BatchedGP | None:
    """The tensor path for ``spec``, or ``None`` (with a one-time warning) when it cannot reproduce
    GPyTorch: the engine then evaluates each client with GPyTorch, as the sequential engine does."""
    try:
        gp = BatchedGP(spec, compiled)
        if check:
            check_against_gpytorch(spec, compiled=compiled, d=d)
        return gp
    except UnsupportedSpec as err:
        if compiled:
            raise ValueError(f"compiled=True: the batched engine cannot evaluate this spec: {err}") from err
        message = (
            f"the batched engine evaluates this spec client by client with GPyTorch ({err}); "
            "results are the sequential engine's, without the batched speed-up"
        )
        if message not in _WARNED:
            _WARNED.add(message)
            warnings.warn(message, UserWarning, stacklevel=4)
        return None


class PerClientOps:
    """:class:`~fedgp.strategies.base.ClientOps` for a chunk, one GPyTorch model per client in turn:
    the batched engine's fallback for specs its tensor path cannot evaluate (it computes exactly
    what the sequential engine computes)."""

    def __init__(self, engine: BatchedEngine, rows: torch.Tensor, rnd: int):
        from fedgp.engines.sequential import SequentialOps

        if engine.model is None:
            engine.model = engine.spec.build()
        self.spec, self.round, self.seed = engine.spec, rnd, engine.seed
        self.indices, self.sizes = engine.keys[rows], engine.sizes[rows]
        self.clients = [engine.clients[i] for i in rows.tolist()]
        self._ops = [
            SequentialOps(engine.spec, engine.model, c, int(k), rnd, engine.seed)
            for c, k in zip(self.clients, self.indices.tolist())
        ]

    def _each(self, states: HyperState):
        for i, ops in enumerate(self._ops):
            yield ops, states.index(slice(i, i + 1))

    def nll(self, states: HyperState) -> torch.Tensor:
        """Per-point exact NLL, client by client with GPyTorch (the fallback path)."""
        return torch.cat([ops.nll(s) for ops, s in self._each(states)])

    def gradient(self, states: HyperState, batch_size: int | None = None) -> tuple[torch.Tensor, HyperState]:
        """Per-point NLL and gradient, client by client with GPyTorch (the fallback path)."""
        out = [ops.gradient(s, batch_size) for ops, s in self._each(states)]
        return torch.cat([loss for loss, _ in out]), HyperState.cat([g for _, g in out])

    def train(self, states: HyperState, local: LocalTraining) -> TrainResult:
        """Local training, client by client with GPyTorch (the fallback path)."""
        out = [ops.train(s, local) for ops, s in self._each(states)]
        return TrainResult(
            HyperState.cat([r.states for r in out]),
            torch.cat([r.loss for r in out]),
            torch.cat([r.steps for r in out]),
        )

    def predict(
        self, states: HyperState, X_new: torch.Tensor | None = None, full_cov: bool = False
    ) -> list[Prediction]:
        """Personalised predictions, client by client with GPyTorch (the fallback path)."""
        return [p for ops, s in self._each(states) for p in ops.predict(s, X_new, full_cov)]


def check_against_gpytorch(
    spec: GPSpec, seed: int = 0, compiled: bool | None = None, d: int | None = None
) -> None:
    """Raise :class:`UnsupportedSpec` unless the batched path reproduces GPyTorch's NLL and
    gradients on a random case with ``d`` input features for this spec (guards against kernels
    whose ``forward`` does not broadcast over parameter batches, priors it cannot read ...)."""
    from fedgp.engines.sequential import SequentialOps

    g = torch.Generator().manual_seed(seed)
    d = _input_dim(spec) if d is None else d
    clients = [
        ClientData(
            torch.rand(n, d, generator=g, dtype=torch.float64),
            torch.randn(n, generator=g, dtype=torch.float64),
            id=i,
        )
        for i, n in enumerate((7, 5))
    ]
    raw = spec.to_raw(spec.initial_state())
    perturbed = [
        _well_conditioned(
            spec,
            spec.from_raw(raw.map(lambda v, e: v + 0.1 * torch.randn(v.shape, generator=g, dtype=v.dtype))),
        )
        for _ in clients
    ]
    try:
        engine = BatchedEngine(spec, clients, 0, check=False, compiled=compiled)
        ops = BatchedOps(engine, torch.arange(2), 0)
        ours_loss, ours_grad = ops.gradient(HyperState.stack(perturbed))
    except Exception as err:  # any failure here means "not supported"
        raise UnsupportedSpec(f"{type(err).__name__}: {err}") from err
    model = spec.build()
    # (loss rtol, atol, gradient rtol, atol): float32 rounding differs between the two paths.
    tol = (1e-9, 1e-12, 1e-7, 1e-10) if spec.dtype == torch.float64 else (1e-4, 1e-5, 1e-3, 1e-4)
    for i, (client, state) in enumerate(zip(clients, perturbed)):
        ref_loss, ref_grad = SequentialOps(spec, model, client, i, 0, 0).gradient(state.expand(1))
        differ = [] if torch.allclose(ours_loss[i], ref_loss[0], rtol=tol[0], atol=tol[1]) else ["the NLL"]
        differ += [
            f"∂/∂{k}"
            for k in ref_grad
            if not torch.allclose(ours_grad[k][i], ref_grad[k][0], rtol=tol[2], atol=tol[3])
        ]
        if differ:
            raise UnsupportedSpec(
                f"its tensor path does not reproduce GPyTorch for this spec: {', '.join(differ)} differ on "
                "a well-conditioned test case (a kernel whose forward does not broadcast over parameter "
                "batches?)"
            )


def _well_conditioned(spec: GPSpec, state: HyperState) -> HyperState:
    """``state`` with its noise raised to 0.1 where the constraint allows (else as near as it allows).

    The self-check compares two float64 computations of the same NLL; with a tiny noise (a
    legitimate ``GreaterThan(1e-12)`` likelihood) the check case's covariance is so ill-conditioned
    that rounding alone separates them. The noise does not enter the kernel's forward, which is
    what the check is for, so the check uses a noise that keeps the case well-conditioned."""
    info = next((p for p in spec.params if p.raw_name == _NOISE), None)
    if info is None:  # a fixed (known) noise: nothing to raise
        return state
    target = torch.full_like(state[info.name], 0.1)
    constraint = info.constraint
    if constraint is not None:
        lower, upper = float(constraint.lower_bound.max()), float(constraint.upper_bound.min())
        target = target.clamp(min=lower * 2 if lower > 0 else lower)
        if math.isfinite(upper):
            target = target.clamp(max=lower + 0.5 * (upper - lower))
    values = dict(state)
    values[info.name] = torch.maximum(state[info.name], target)
    return HyperState(values, state.event_shapes)


def _input_dim(spec: GPSpec) -> int:
    dims = [getattr(m, "ard_num_dims", None) for m in spec.kernel.modules()]
    dims += [
        getattr(m, "weights", torch.empty(1, 1)).shape[-2]
        for m in spec.mean.modules()
        if hasattr(m, "weights")
    ]
    dims = [int(x) for x in dims if x]
    return max(dims) if dims else 1
