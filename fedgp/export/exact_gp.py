"""``FitResult.to_gpytorch``: one client's model as a plain GPyTorch ``ExactGP``.

The client's personal state (FGPR: the global one; clustered: its cluster's) is loaded into a
fresh copy of the spec's modules, and the model is conditioned on the client's own training data
and put in eval mode: calling it on inputs gives the same posterior as ``result.posterior``.

When the fit transformed the data (:mod:`fedgp.transforms`: x' = (x − a) / b, y' = (y − o) / s),
the learned GP is a GP on (x', y'). The same GP in the original units is again a GP, with
mean o + s·m(x'), kernel s²·k(x', x'') and noise s²σ²; the exported model is that one (its
modules wrap the learned ones in :class:`OriginalUnitsMean` and :class:`OriginalUnitsKernel`),
so ``model(X)`` and ``model.likelihood(model(X))`` take and give original units, as
``result.posterior`` does.

GPyTorch switches to iterative solvers above ``max_cholesky_size`` (800 points); fedgp's
predictions are exact at every size, so evaluate larger clients inside
``fedgp.models.exact_settings()`` to match them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import gpytorch
import torch

from fedgp.errors import InputTypeError
from fedgp.export.multioutput import to_gpytorch_outputs
from fedgp.models.multioutput import MultiOutputSpec
from fedgp.models.own_features import refuse_own_part
from fedgp.models.spec import NOISE, ExactGPModel
from fedgp.models.state import HyperState

if TYPE_CHECKING:
    from linear_operator.operators import LinearOperator

__all__ = ["to_gpytorch", "OriginalUnitsMean", "OriginalUnitsKernel"]


def _affine_inputs(x: torch.Tensor, offset: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (x - offset.to(x)) / scale.to(x)


class OriginalUnitsMean(gpytorch.means.Mean):
    """``o + s · m((x − a) / b)``: a mean learned on transformed data, in the original units."""

    def __init__(self, base, x_offset, x_scale, y_offset: float, y_scale: float):
        super().__init__()
        self.base = base
        self.register_buffer("x_offset", x_offset)
        self.register_buffer("x_scale", x_scale)
        self.y_offset, self.y_scale = float(y_offset), float(y_scale)

    def forward(self, x) -> torch.Tensor:
        return self.y_offset + self.y_scale * self.base(_affine_inputs(x, self.x_offset, self.x_scale))


class OriginalUnitsKernel(gpytorch.kernels.Kernel):
    """``s² · k((x − a) / b, (x' − a) / b)``: a kernel learned on transformed data, in the original units."""

    def __init__(self, base, x_offset, x_scale, y_scale: float):
        super().__init__()
        self.base = base
        self.register_buffer("x_offset", x_offset)
        self.register_buffer("x_scale", x_scale)
        self.variance = float(y_scale) ** 2

    def forward(self, x1, x2, diag=False, **params) -> torch.Tensor | LinearOperator:
        out = self.base(
            _affine_inputs(x1, self.x_offset, self.x_scale),
            _affine_inputs(x2, self.x_offset, self.x_scale),
            diag=diag,
            **params,
        )
        return out * self.variance


def _original_units(model: ExactGPModel, transform, data, dtype) -> ExactGPModel:
    """``model`` (learned on transformed data) as the equivalent GP on the original data.

    The mean and kernel stay the learned modules, wrapped (:class:`OriginalUnitsMean`,
    :class:`OriginalUnitsKernel`): they are functions of x, evaluated at whatever inputs the exported
    model is called on, not values that :meth:`~fedgp.transforms.DataTransform.untransform` could map
    once (a kernel other than ``ScaleKernel(base)`` has no hyper-parameters in the data's units, yet
    is a kernel in them this way). The noise is a value: its level and its constraint's lower bound
    come back as noise variances, through ``untransform``, with this client's outcome map."""
    _, offset, scale = transform.apply(data)
    d = data.n_features
    if transform.x_offset is None:
        x_offset, x_scale = torch.zeros(d, dtype=dtype), torch.ones(d, dtype=dtype)
    else:
        x_offset, x_scale = transform.x_offset.to(dtype), transform.x_scale.to(dtype)
    learned = model.likelihood.noise.detach()
    bound = torch.as_tensor(
        model.likelihood.noise_covar.raw_noise_constraint.lower_bound, dtype=learned.dtype
    )
    # The level and the lower bound as a batch of two noise values: one map, the same for both.
    noises = HyperState({NOISE: torch.stack([bound.expand_as(learned), learned])}, {NOISE: learned.shape})
    lower, noise = transform.untransform(noises, offset, scale, partial=True)[NOISE].to(dtype)
    constraint = gpytorch.constraints.GreaterThan(lower.reshape(bound.shape))
    likelihood = gpytorch.likelihoods.GaussianLikelihood(noise_constraint=constraint).to(dtype)
    with torch.no_grad():
        likelihood.noise = noise
    return ExactGPModel(
        OriginalUnitsMean(model.mean_module, x_offset, x_scale, offset, scale),
        OriginalUnitsKernel(model.covar_module, x_offset, x_scale, scale),
        likelihood,
    ).to(dtype)


def to_gpytorch(result, client: Any) -> ExactGPModel:
    """One client's personalised model as a GPyTorch ``ExactGP`` in eval mode, conditioned on the client's
    own points.

    When the fit transformed the data, the model is rewritten in the original units (mean ``o + s·m(x')``,
    kernel ``s²·k``, noise ``s²σ²``), so it predicts what ``result.posterior`` predicts. Its
    ``feature_names`` attribute names the input columns in the order it takes them (``None`` when the
    fit's data were unnamed).

    A multi-output result's model is GPyTorch's Hadamard multitask ``ExactGP`` on rows whose last
    column is the output index (:mod:`fedgp.export.multioutput`).
    """
    data = result.client_data(client)
    spec = result.spec
    refuse_own_part(spec, data, "to_gpytorch")
    if spec.variational:
        raise InputTypeError(
            "to_gpytorch: exports a client's exact GP posterior; this result's model is a VariationalGPSpec"
        )
    if isinstance(spec, MultiOutputSpec):  # GPyTorch's Hadamard multitask form
        return to_gpytorch_outputs(result, spec, result.client_state(client), data)
    model = spec.build()
    spec.load(model, result.client_state(client))
    transform = getattr(result, "transform", None)
    if transform is not None and not transform.is_identity:
        model = _original_units(model, transform, data, spec.dtype)
    model.set_train_data(data.X.to(spec.dtype), data.y.to(spec.dtype), strict=False)
    model.feature_names = getattr(result, "feature_names", None)
    return model.eval()
