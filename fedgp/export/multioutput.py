"""``to_gpytorch`` of a multi-output result: GPyTorch's Hadamard multitask ``ExactGP``, in the data's units.

The rows are GPyTorch's Hadamard form, as fedgp's (:mod:`fedgp.models.multioutput`): the output index
in X's last column. The learned GP lives on transformed rows (features scaled, output t's targets
``y' = (y − o_t) / s_t``); in the data's units it is again a GP, with

- mean ``o_t + s_t · m(x', t)``,
- covariance ``s_t s_t' · k((x', t), (x'', t'))`` (the task covariance B scaled by the outputs' sds),
- noise ``s_t² σ_t²`` per output: a shared noise σ² becomes one noise per output in the data's units,

so the exported likelihood is GPyTorch's ``HadamardGaussianLikelihood`` reading the output column.
Call it as GPyTorch's Hadamard example does: ``model(rows)`` for f, ``model.likelihood(model(rows),
rows)`` for y.

BoTorch's ``MultiTaskGP`` is not an export target: it builds its task covariance as a
``PositiveIndexKernel`` (positive correlations only), which cannot hold an ICM that learned outputs of
opposite sign, so ``to_botorch`` refuses a multi-output result (:mod:`fedgp.export.botorch_model`).
"""

from __future__ import annotations

from typing import Any

import gpytorch
import torch
from linear_operator.operators import DiagLinearOperator

from fedgp.models.multioutput import HadamardGPModel, OutputNoise, check_task_column

__all__ = ["OriginalUnitsHadamardGP", "to_gpytorch_outputs"]


class OriginalUnitsHadamardGP(gpytorch.models.ExactGP):
    """A Hadamard multitask GP learned on transformed rows (``learned``, fedgp's
    :class:`~fedgp.models.multioutput.HadamardGPModel` with a client's state), in the data's units:
    rows ``(x, t)`` are mapped to ``((x − a) / b, t)``, the prior's mean to ``o_t + s_t m`` and its
    covariance to ``S K S`` with ``S = diag(s_t)`` (module docstring)."""

    def __init__(self, learned: HadamardGPModel, x_offset, x_scale, y_offset, y_scale, likelihood) -> None:
        super().__init__(None, None, likelihood)
        self.learned = learned
        self.outputs = learned.outputs
        for name, value in (("x_offset", x_offset), ("x_scale", x_scale)):
            self.register_buffer(name, value)
        self.register_buffer("y_offset", y_offset)
        self.register_buffer("y_scale", y_scale)

    def forward(self, x: torch.Tensor) -> gpytorch.distributions.MultivariateNormal:
        """The prior at rows ``x`` (features, then the output index) in the data's units."""
        task = check_task_column(x, self.outputs, "to_gpytorch model")
        prior = self.learned.forward((x - self.x_offset.to(x)) / self.x_scale.to(x))
        s = self.y_scale.to(x)[task]
        scale = DiagLinearOperator(s)
        covar = scale @ prior.lazy_covariance_matrix @ scale
        return gpytorch.distributions.MultivariateNormal(self.y_offset.to(x)[task] + s * prior.mean, covar)


def _noise_per_output(model: HadamardGPModel, y_scale: torch.Tensor) -> gpytorch.likelihoods.Likelihood:
    """``HadamardGaussianLikelihood`` with output t's noise ``s_t² σ_t²`` (σ² shared or per output);
    its lower bound is the learned one's in the smallest output's units (every noise stays above it)."""
    learned = model.likelihood
    noise = learned.noise.detach().reshape(-1)
    noise = noise.expand(model.outputs) if noise.numel() == 1 else noise
    bound = torch.as_tensor(learned.noise_covar.raw_noise_constraint.lower_bound, dtype=noise.dtype)
    variance = y_scale.to(noise.dtype).pow(2)
    constraint = gpytorch.constraints.GreaterThan(float(bound.reshape(-1)[0] * variance.min()))
    likelihood = gpytorch.likelihoods.HadamardGaussianLikelihood(
        num_tasks=model.outputs, noise_constraint=constraint, task_feature_index=-1
    ).to(noise.dtype)
    with torch.no_grad():
        likelihood.noise = (noise * variance).clamp_min(constraint.lower_bound.to(noise) * (1 + 1e-12))
    return likelihood


def to_gpytorch_outputs(result: Any, spec, state, data) -> OriginalUnitsHadamardGP:
    """A multi-output client's posterior as :class:`OriginalUnitsHadamardGP`, conditioned on its rows,
    in eval mode (``to_gpytorch``'s work for a :class:`~fedgp.models.multioutput.MultiOutputSpec`)."""
    model = spec.build()
    spec.load(model, state)
    transform = getattr(result, "transform", None)
    dtype, T, d = spec.dtype, spec.outputs, data.n_features
    x_offset, x_scale = torch.zeros(d, dtype=dtype), torch.ones(d, dtype=dtype)
    y_offset, y_scale = torch.zeros(T, dtype=dtype), torch.ones(T, dtype=dtype)
    if transform is not None and transform.x_offset is not None:
        x_offset, x_scale = transform.x_offset.to(dtype), transform.x_scale.to(dtype)
    if transform is not None and transform.per_output:
        y_offset, y_scale = transform.y_offset.to(dtype), transform.y_scale.to(dtype)
    if isinstance(model.likelihood, OutputNoise):
        model.likelihood.rows = None  # the exported likelihood reads its own rows
    exported = OriginalUnitsHadamardGP(
        model, x_offset, x_scale, y_offset, y_scale, _noise_per_output(model, y_scale)
    ).to(dtype)
    exported.set_train_data(data.X.to(dtype), data.y.to(dtype), strict=False)
    exported.feature_names = getattr(result, "feature_names", None)
    return exported.eval()
