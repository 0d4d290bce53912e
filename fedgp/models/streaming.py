"""An exact GP posterior that grows: rows appended to an owner's data extend its Cholesky factor.

With ``K + σ²I = L Lᵀ`` for the n rows held, k new rows X* extend it by one block row
(Rasmussen & Williams 2006, §A.3's partitioned inverse; wave-4 note §4)::

    L' = [[L, 0], [Vᵀ, L_S]],   V = L⁻¹ K(X, X*)  (n×k),   L_S = chol(K(X*, X*) + σ²I − VᵀV)

so that ``L' L'ᵀ`` is the kernel matrix of all n + k rows, and the whitened residual grows by
``L_S⁻¹(y* − m(X*) − Vᵀz)``. That costs O(n²k + nk² + k³) against the O((n + k)³) of factorising
again, with the same hyper-parameters (a change of them needs a new factor: :class:`GrowingPosterior`
is built for one state).

The factor is kept as its block rows — the first factor, then one ``(Vᵀ, L_S)`` pair per append —
and solved against by block forward substitution: an append copies nothing already held (a
contiguous ``(n + k)²`` copy of a 4,000-row factor costs as much as the solve itself), and the
solves are matrix products and small triangular solves.
"""

from __future__ import annotations

from typing import Any

import gpytorch
import torch
from linear_operator.operators import DiagLinearOperator
from linear_operator.utils.cholesky import psd_safe_cholesky

from fedgp.errors import InputError
from fedgp.models.objective import exact_settings, factorization_guard
from fedgp.models.posterior import Prediction
from fedgp.models.spec import GPSpec
from fedgp.models.state import HyperState

__all__ = ["BlockCholesky", "GrowingPosterior"]


class BlockCholesky:
    """A lower-triangular Cholesky factor held as block rows ``[R_j, D_j]`` (``R_j`` the rows'
    part left of the diagonal block ``D_j``), grown by :meth:`append` without copying what it holds."""

    def __init__(self, factor: torch.Tensor) -> None:
        n = factor.shape[0]
        self._blocks: list[tuple[torch.Tensor, torch.Tensor]] = [(factor.new_zeros(n, 0), factor)]
        self.n = n

    def solve(self, B: torch.Tensor) -> torch.Tensor:
        """``L⁻¹ B`` by block forward substitution (``B``: ``(n, m)``)."""
        out = torch.empty_like(B)
        start = 0
        for left, diagonal in self._blocks:
            stop = start + diagonal.shape[0]
            rhs = B[start:stop]
            if start:
                rhs = rhs - left @ out[:start]
            out[start:stop] = torch.linalg.solve_triangular(diagonal, rhs, upper=False)
            start = stop
        return out

    def append(self, left: torch.Tensor, diagonal: torch.Tensor) -> None:
        """One more block row: ``left`` ``(k, n)`` and the lower-triangular ``diagonal`` ``(k, k)``."""
        self._blocks.append((left, diagonal))
        self.n += diagonal.shape[0]

    def dense(self) -> torch.Tensor:
        """The whole ``(n, n)`` factor (for checks; O(n²) memory)."""
        out = self._blocks[0][1].new_zeros(self.n, self.n)
        start = 0
        for left, diagonal in self._blocks:
            stop = start + diagonal.shape[0]
            out[start:stop, :start] = left
            out[start:stop, start:stop] = diagonal
            start = stop
        return out

    def log_det(self) -> torch.Tensor:
        """``log |L Lᵀ|``."""
        return 2 * sum(torch.diagonal(d).log().sum() for _, d in self._blocks)


class GrowingPosterior:
    """The exact posterior of ``(spec, state)`` given rows ``(X, y)`` (the model's units), with
    :meth:`extend` for new rows and :meth:`predict` as :func:`~fedgp.models.posterior.predict_with_model`
    computes it (to rounding). ``client`` names the owner in a factorisation error."""

    def __init__(
        self, spec: GPSpec, state: HyperState, X: torch.Tensor, y: torch.Tensor, client: Any = None
    ) -> None:
        if spec.variational or not spec.conjugate:
            raise InputError(
                f"client {client!r}: a growing posterior is exact GP conditioning; the spec is variational"
            )
        if state.batch_shape:
            shape = tuple(state.batch_shape)
            raise InputError(f"a growing posterior needs one state, got batch shape {shape}")
        self.spec, self.client = spec, client
        self.model = spec.build()
        spec.load(self.model, state)
        self.model.eval()
        self.dtype = spec.dtype
        X, y = X.to(self.dtype), y.to(self.dtype)
        with torch.no_grad(), exact_settings(), factorization_guard(client, "posterior"):
            noisy = self._marginal(X).to_dense()
            self.factor = BlockCholesky(psd_safe_cholesky(noisy))
            residual = (y - self.model.mean_module(X)).unsqueeze(-1)
            self.z = self.factor.solve(residual).squeeze(-1)
        self.X, self.y = X, y

    @property
    def n(self) -> int:
        """The rows conditioned on."""
        return self.factor.n

    def _marginal(self, X: torch.Tensor):
        """The covariance of y at ``X`` under the prior: the kernel plus the likelihood's noise."""
        model = self.model
        prior = gpytorch.distributions.MultivariateNormal(model.mean_module(X), model.covar_module(X))
        return model.likelihood(prior, X).lazy_covariance_matrix

    def extend(self, X_new: torch.Tensor, y_new: torch.Tensor) -> None:
        """Condition on ``k`` more rows by the rank-k block update of the factor (module docstring)."""
        X_new, y_new = X_new.to(self.dtype), y_new.to(self.dtype)
        model = self.model
        with torch.no_grad(), exact_settings(), factorization_guard(self.client, "posterior update"):
            cross = model.covar_module(self.X, X_new).to_dense()  # (n, k)
            V = self.factor.solve(cross)
            schur = self._marginal(X_new).to_dense() - V.transpose(-1, -2) @ V
            diagonal = psd_safe_cholesky(schur)
            residual = y_new - model.mean_module(X_new) - V.transpose(-1, -2) @ self.z
            z_new = torch.linalg.solve_triangular(diagonal, residual.unsqueeze(-1), upper=False).squeeze(-1)
        self.factor.append(V.transpose(-1, -2).contiguous(), diagonal)
        self.z = torch.cat([self.z, z_new])
        self.X, self.y = torch.cat([self.X, X_new]), torch.cat([self.y, y_new])

    def retarget(self, y: torch.Tensor) -> None:
        """The same rows with other targets (an owner that re-standardises its own outcome): the
        factor does not depend on ``y``, so only the whitened residual is solved again, O(n²)."""
        y = y.to(self.dtype)
        if y.shape != self.y.shape:
            raise InputError(f"retarget: {tuple(y.shape)} targets for {self.n} rows")
        with torch.no_grad():
            self.z = self.factor.solve((y - self.model.mean_module(self.X)).unsqueeze(-1)).squeeze(-1)
        self.y = y

    def predict(self, X_new: torch.Tensor, full_cov: bool = False) -> Prediction:
        """The posterior at ``X_new`` (the model's units): f's mean and variance, y's variance, and
        with ``full_cov`` f's joint covariance. Variances are clamped at GPyTorch's minimum variance,
        as its ``MultivariateNormal`` does."""
        X_new = torch.as_tensor(X_new).to(self.dtype)
        model = self.model
        with torch.no_grad(), exact_settings():
            A = self.factor.solve(model.covar_module(self.X, X_new).to_dense())  # (n, m)
            mean = model.mean_module(X_new) + A.transpose(-1, -2) @ self.z
            floor = gpytorch.settings.min_variance.value(self.dtype)
            if full_cov:
                covariance = model.covar_module(X_new).to_dense() - A.transpose(-1, -2) @ A
                variance_f = torch.diagonal(covariance).clamp_min(floor)
                latent = gpytorch.distributions.MultivariateNormal(mean, covariance)
            else:
                covariance = None
                prior = model.covar_module(X_new, diag=True)
                variance_f = (prior - (A * A).sum(0)).clamp_min(floor)
                latent = gpytorch.distributions.MultivariateNormal(mean, DiagLinearOperator(variance_f))
            variance_y = model.likelihood(latent, X_new).variance.clamp_min(floor)
        return Prediction(mean, variance_f, variance_y, covariance)
