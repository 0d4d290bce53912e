"""The Hadamard multi-output GP (ICM, LMC) as a batched tensor program: one row per client.

A multi-output spec (:class:`~fedgp.models.multioutput.MultiOutputSpec`) reads the output index
from X's last column: ``k((x, t), (x', t')) = Σ_q k_q(x, x') · B_q[t, t']`` with
``B_q = W_q W_qᵀ + diag(v_q)`` (GPyTorch's ``IndexKernel``; one term for an ICM, Q for an LMC), a
mean of one constant per output (:class:`~fedgp.models.multioutput.TaskMean`) or of the features,
and one noise or one per output (:class:`~fedgp.models.multioutput.OutputNoise`).
:class:`HadamardBatchedGP` evaluates that for many clients' parameter sets at once: each input
kernel is the spec's own GPyTorch module (``functional_call`` on its ``forward``, as
:class:`~fedgp.engines.tensor_gp.BatchedGP`), each ``B_q`` is formed per row from W and v and
gathered at the rows' output indices, and the likelihood is the same batched Cholesky
(:class:`~fedgp.engines.tensor_gp.GaussianNLL`), so padding, masking and jitter are the
single-output engine's. Its minibatch steps run on this tensor path: the compiled step and the
fused round (:mod:`fedgp.engines.compiled`, :mod:`fedgp.engines.fused`) have no task covariance.
"""

from __future__ import annotations

import gpytorch
import torch

from fedgp.engines.tensor_gp import NOISE, BatchedGP, StationaryGram, _MeanKernel, stationary_kernel
from fedgp.errors import InputError, UnsupportedSpec
from fedgp.models.multioutput import (
    HadamardGPModel,
    MultiOutputSpec,
    OutputNoise,
    TaskMean,
    check_task_column,
)
from fedgp.models.spec import GPSpec

__all__ = ["HadamardBatchedGP", "batched_gp", "case_inputs", "task_columns", "MULTI_OUTPUT_NOT_FUSED"]

#: Why a multi-output spec's local rounds are not fused or compiled (engines and docs say it).
MULTI_OUTPUT_NOT_FUSED = (
    "a multi-output (Hadamard) spec: the compiled step and the fused round have no task covariance, "
    "so its minibatch steps run on the batched tensor path"
)


def batched_gp(spec: GPSpec, compiled: bool | None = None) -> BatchedGP:
    """The batched evaluator for ``spec``: :class:`HadamardBatchedGP` for a multi-output spec, else
    :class:`~fedgp.engines.tensor_gp.BatchedGP` (each raises ``UnsupportedSpec`` for what it cannot do)."""
    if isinstance(spec, MultiOutputSpec):
        return HadamardBatchedGP(spec, compiled)
    return BatchedGP(spec, compiled)


def task_columns(spec: GPSpec) -> int:
    """Columns of X that are not input features: 1 (the output index) for a multi-output spec, else 0."""
    return int(isinstance(spec, MultiOutputSpec))


def case_inputs(spec: GPSpec, n: int, d: int, generator: torch.Generator) -> torch.Tensor:
    """``(n, d)`` inputs of the batched engine's self-check case: U(0, 1) features and, for a
    multi-output spec (which reads them there), random output indices in the last column."""
    X = torch.rand(n, d, generator=generator, dtype=torch.float64)
    if isinstance(spec, MultiOutputSpec):
        X[:, -1] = torch.randint(spec.outputs, (n,), generator=generator).to(X.dtype)
    return X


class _HadamardModules(_MeanKernel):
    """The model's modules under its names (so ``functional_call`` takes the state's raw names), with
    the input kernel of each term evaluated on its own."""

    def __init__(self, model: HadamardGPModel):
        super().__init__(model)
        self.task_covar_module = model.task_covar_module
        # a plain tuple: the kernels are registered once, under covar_module (an LMC's AdditiveKernel)
        self.terms = tuple(model.covar_module.kernels) if model.lmc else (model.covar_module,)

    def forward(self, x1, x2=None, diag: bool = False, rows: int = 0, term: int = 0):
        if x1 is None or x2 is None:  # priors, or the mean
            return super().forward(x1, x2, diag, rows)
        kernel = self.terms[term]
        active = kernel.active_dims  # applied as the kernel's __call__ would (forward skips it)
        if active is not None:
            x1, x2 = x1.index_select(-1, active.to(x1.device)), x2.index_select(-1, active.to(x2.device))
        out = kernel.forward(x1, x2, diag=diag)
        return out.to_dense() if hasattr(out, "to_dense") else out


class HadamardBatchedGP(BatchedGP):
    """A multi-output spec's GP evaluated for many parameter sets at once (one per row); rows of X
    carry the output index in their last column, as the sequential engine's."""

    multi_output = True

    def __init__(self, spec: GPSpec, compiled: bool | None = None):
        model = spec.build()
        if not isinstance(model, HadamardGPModel):
            raise UnsupportedSpec(f"HadamardBatchedGP evaluates a MultiOutputSpec; got {type(spec).__name__}")
        if compiled:
            raise InputError(f"compiled=True cannot run {MULTI_OUTPUT_NOT_FUSED}; leave compiled unset")
        likelihood = type(model.likelihood)
        if likelihood not in (gpytorch.likelihoods.GaussianLikelihood, OutputNoise) or NOISE not in {
            p.raw_name for p in spec.params
        }:
            raise UnsupportedSpec(
                "its multi-output tensor path supports GaussianLikelihood (one noise) or OutputNoise (one "
                f"per output) with a learned noise; got {likelihood.__name__}"
            )
        self._adopt(spec, _HadamardModules(model))
        self.outputs, self.output_noise = model.outputs, likelihood is OutputNoise
        self.task_mean = isinstance(model.mean_module, TaskMean)
        self.fast, self.compiled = None, False  # the tensor path only (MULTI_OUTPUT_NOT_FUSED)
        terms = range(spec.terms)
        prefixes = [f"task_covar_module.{q}." for q in terms] if model.lmc else ["task_covar_module."]
        names = set(spec.names)
        # (W's state name or None: rank 0 has no W, v's state name) per term
        self.task_terms = [
            (p + "covar_factor" if p + "covar_factor" in names else None, p + "var") for p in prefixes
        ]
        # each input kernel's fused Gram (StationaryGram) where it is a (scaled) RBF or Matérn
        inputs = [f"covar_module.kernels.{q}." for q in terms] if model.lmc else ["covar_module."]
        self.fast_terms = [stationary_kernel(k, p) for k, p in zip(self.module.terms, inputs)]

    def _task(self, X: torch.Tensor) -> torch.Tensor:
        """The rows' output indices (checked where the rows enter: ``MultiOutputSpec.for_data``)."""
        return X[..., -1].round().long()

    def check_rows(self, X: torch.Tensor, where: str) -> None:
        """Refuse rows whose last column is not an output index of this spec, naming ``where``."""
        check_task_column(X, self.outputs, where)

    def task_covariances(self, raw: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        """Each term's ``B_q = W_q W_qᵀ + diag(v_q)``, ``(rows, T, T)``."""
        out = []
        for w_name, v_name in self.task_terms:
            B = torch.diag_embed(self.spec.param(v_name).transform(raw[v_name]))
            if w_name is not None:
                W = raw[w_name]
                B = B + W @ W.transpose(-1, -2)
            out.append(B)
        return out

    def mean(self, raw: dict[str, torch.Tensor], X: torch.Tensor) -> torch.Tensor:
        """``c_t`` per row for a :class:`TaskMean`; else the spec's mean of the input features."""
        if self.task_mean:
            name = "mean_module.constant"
            c = self.spec.param(name).transform(raw[name]).reshape(-1, self.outputs).expand(X.shape[0], -1)
            return c.gather(1, self._task(X))
        return super().mean(raw, X[..., :-1])

    def _one_hot(self, X: torch.Tensor) -> torch.Tensor:
        """``(rows, n, T)``: each row's output as a one-hot vector, so ``E₁ B E₂ᵀ`` is ``B[t, t']``
        (batched matrix products, whose backward is cheaper than a gather's scatter)."""
        return torch.nn.functional.one_hot(self._task(X), self.outputs).to(X.dtype)

    def kernel(
        self, raw: dict[str, torch.Tensor], X1: torch.Tensor, X2: torch.Tensor, diag: bool = False
    ) -> torch.Tensor:
        """``Σ_q k_q(x, x') B_q[t, t']`` between the rows ``X1`` and ``X2`` (batched over clients), each
        ``k_q`` the spec's GPyTorch module."""
        E1, E2 = self._one_hot(X1), self._one_hot(X2)
        x1, x2 = X1[..., :-1], X2[..., :-1]
        params = self._module_params(raw)
        total = None
        for q, B in enumerate(self.task_covariances(raw)):
            k = torch.func.functional_call(self.module, params, (x1, x2), {"diag": diag, "term": q})
            b = ((E1 @ B) * E1).sum(-1) if diag else E1 @ B @ E2.transpose(-1, -2)
            total = k * b if total is None else total + k * b
        return total

    def _train_gram(self, raw: dict[str, torch.Tensor], X: torch.Tensor) -> torch.Tensor:
        """``Σ_q k_q(x, x') B_q[t, t']`` over the rows ``X`` themselves: a stationary ``k_q`` as the
        single-output fused Gram (:class:`~fedgp.engines.tensor_gp.StationaryGram`, inputs shifted by
        the row's first point as there), any other through its GPyTorch ``forward``."""
        E = self._one_hot(X)
        x = X[..., :-1]
        total = None
        for q, (B, fast) in enumerate(zip(self.task_covariances(raw), self.fast_terms)):
            if fast is None:
                k = torch.func.functional_call(self.module, self._module_params(raw), (x, x), {"term": q})
            else:
                scale, lengthscale, nu = fast
                ls = self.spec.param(lengthscale).transform(raw[lengthscale])
                ones = torch.ones(len(X), dtype=X.dtype, device=X.device)
                s = self.spec.param(scale).transform(raw[scale]).reshape(-1) if scale else ones
                k = StationaryGram.apply((x - x[..., :1, :]) / ls, s, torch.zeros_like(ones), nu)
            b = E @ B @ E.transpose(-1, -2)
            total = k * b if total is None else total + k * b
        return total

    def row_noise(self, raw: dict[str, torch.Tensor], X: torch.Tensor) -> torch.Tensor:
        """``(rows, n)`` noise variance of each row: its output's (:class:`OutputNoise`) or the one noise."""
        noise = self.noise.transform(raw[self.noise.name])
        if self.output_noise:
            return noise.reshape(-1, self.outputs).gather(1, self._task(X))
        return noise.reshape(-1, 1).expand(-1, X.shape[-2])

    def train_covariance(self, raw, X, mask) -> torch.Tensor:
        """``K(X, X)`` plus each row's noise, with padded rows/columns replaced by the identity."""
        K = self._train_gram(raw, X) + torch.diag_embed(self.row_noise(raw, X))
        return self.pad_identity(K, mask)
