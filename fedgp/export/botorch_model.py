"""``FitResult.to_botorch``: one client's model as a BoTorch ``SingleTaskGP``, ready for acquisition.

A federated surrogate is there to be optimised. BoTorch's acquisition functions take any BoTorch
``Model``; its ``SingleTaskGP`` accepts our own mean, kernel and likelihood modules, so the
client's conditioned GP is handed over as one: the spec's modules with the client's personal
state loaded, trained on the client's own points, hyper-parameters frozen (``requires_grad`` off,
so the learned prior is what is used, not refitted on a few points), in eval mode. Its
``posterior`` is BoTorch's, with the joint covariance and ``rsample``.

When the fit transformed the data (``result.transform``, :mod:`fedgp.transforms`), the model
carries the same maps as BoTorch transforms, so it takes and returns the original units: a
``Normalize`` input transform with the learned bounds, and a ``Standardize`` outcome transform
holding the learned mean and sd (:class:`FixedStandardize`: BoTorch's own would re-estimate them
from the client's few points). Without transforms none is attached: BoTorch's default
``Standardize`` would rescale the targets the learned outputscale and noise refer to.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from fedgp.errors import InputTypeError, import_extra
from fedgp.models.multioutput import MultiOutputSpec
from fedgp.models.own_features import refuse_own_part

if TYPE_CHECKING:
    from botorch.models import SingleTaskGP
    from botorch.models.transforms import Standardize

__all__ = ["to_botorch", "botorch_model", "fixed_standardize"]


def _botorch():
    import_extra("botorch.models.transforms", "to_botorch")
    import botorch.models

    return botorch


def fixed_standardize(offset: float, scale: float, dtype: torch.dtype) -> Standardize:
    """BoTorch's ``Standardize`` (one outcome) with a given mean and sd that training never changes."""
    Standardize = _botorch().models.transforms.Standardize

    class FixedStandardize(Standardize):
        """``Standardize`` that stays in eval mode: ``SingleTaskGP`` calls ``train()`` on its outcome
        transform and a training-mode ``Standardize`` re-estimates mean and sd from the data."""

        def train(self, mode: bool = True):
            return super().train(False)

    out = FixedStandardize(m=1)
    out.means = torch.full((1, 1), float(offset), dtype=dtype)
    out.stdvs = torch.full((1, 1), float(scale), dtype=dtype)
    out._stdvs_sq = out.stdvs.pow(2)
    out._is_trained = torch.tensor(True)
    return out.eval()


def _transforms(result, data, dtype):
    """(client data in the model's units, BoTorch input transform, outcome transform)."""
    transform = getattr(result, "transform", None)
    if transform is None or transform.is_identity:
        return data.X.to(dtype), data.y.to(dtype), None, None
    botorch = _botorch()
    _, offset, scale = transform.apply(data)
    outcome = fixed_standardize(offset, scale, dtype)
    inputs = None
    if transform.x_offset is not None:
        lower = transform.x_offset.to(dtype)
        bounds = torch.stack([lower, lower + transform.x_scale.to(dtype)])
        inputs = botorch.models.transforms.Normalize(d=len(lower), bounds=bounds)
    return data.X.to(dtype), data.y.to(dtype), inputs, outcome


def to_botorch(result, client: Any, trainable: bool = False) -> SingleTaskGP:
    """One client's personalised model as a BoTorch ``SingleTaskGP``: the learned prior conditioned on the
    client's own points, hyper-parameters frozen, in the data's original units.

    Parameters
    ----------
    result
        A :class:`~fedgp.fit.FitResult` or a loaded result.
    client
        A training client (position or id) or any :class:`~fedgp.data.ClientData`.
    trainable
        ``False`` (default): every hyper-parameter frozen at the federated value, so
        ``fit_gpytorch_mll`` has nothing to fit (it raises "No parameters to get state from").
        ``True``: the spec's trainable hyper-parameters start from the federated values and
        ``fit_gpytorch_mll`` fine-tunes them on this client's own points (the spec's fixed ones stay
        fixed); the model is then the client's own, no longer the federation's.

    Returns
    -------
    botorch.models.SingleTaskGP
        In eval mode, ready for BoTorch's acquisition functions. Its ``feature_names`` attribute
        names the input columns in the order the model takes them (the fit's, ``None`` when the data
        were unnamed): BoTorch takes plain tensors, so build them in this order (bounds too).
    """
    _botorch()
    data = result.client_data(client)
    spec = result.spec
    refuse_own_part(spec, data, "to_botorch")
    if spec.variational:
        raise InputTypeError(
            "to_botorch: exports a client's exact GP posterior; this result's model is a VariationalGPSpec"
        )
    if isinstance(spec, MultiOutputSpec):
        raise InputTypeError(
            "to_botorch: exports a one-output GP; this result's model is a MultiOutputSpec, and BoTorch's "
            "MultiTaskGP builds its task covariance as a PositiveIndexKernel (positive correlations "
            "only), which cannot hold an ICM whose outputs may be of opposite sign. Use "
            "result.to_gpytorch(client) (GPyTorch's Hadamard multitask model) or "
            "result.predict(rows, client=...)"
        )
    X, y, inputs, outcome = _transforms(result, data, spec.dtype)
    model = botorch_model(spec, result.client_state(client), X, y, inputs, outcome, trainable)
    model.feature_names = getattr(result, "feature_names", None)  # BoTorch has no model card: an attribute
    return model


def botorch_model(
    spec, state, X: torch.Tensor, y: torch.Tensor, inputs=None, outcome=None, trainable: bool = False
) -> SingleTaskGP:
    """``spec``'s GP with ``state`` loaded, conditioned on ``(X, y)`` (the model's units unless
    ``inputs``/``outcome`` transforms map them), as a frozen BoTorch ``SingleTaskGP`` in eval mode:
    :func:`to_botorch`'s model, built where the rows are (a Flower node proposes on it)."""
    botorch = _botorch()
    gp = spec.build()
    spec.load(gp, state)
    model = botorch.models.SingleTaskGP(
        X,
        y.unsqueeze(-1),
        likelihood=gp.likelihood,
        covar_module=gp.covar_module,
        mean_module=gp.mean_module,
        outcome_transform=outcome,
        input_transform=inputs,
    )
    model.requires_grad_(False)
    if trainable:
        named = dict(model.named_parameters())
        for p in spec.params:
            if p.trainable:
                named[p.raw_name].requires_grad_(True)
    return model.eval()
