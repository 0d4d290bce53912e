"""A GP's values in other units: what a prediction, test metrics and hyper-parameters become when
the data are mapped back from ``y' = (y − o) / s``, ``x'_i = (x_i − a_i) / b_i``.

A GP learned on ``(x', y')`` is, exactly, a GP on ``(x, y)``: its predictive mean is ``o + s·m'``,
its variances and covariances ``s²`` times, a test RMSE ``s`` times, a test NLL per point ``log s``
more, and its hyper-parameters map as :func:`state_in_units` lists. These are the maps; the data
transforms (:meth:`fedgp.transforms.DataTransform.untransform`) say which ``o, s, a, b`` apply.
Every ``o``/``s`` may be a tensor of shape ``B``, the leading (batch) dimensions of the values: one
call maps every client of a chunk, each by its own outcome map.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from fedgp.errors import InputError, InputTypeError
from fedgp.models.posterior import Prediction
from fedgp.models.spec import BIAS, CONSTANT, LENGTHSCALE, NOISE, OUTPUTSCALE, WEIGHTS
from fedgp.models.state import HyperState

__all__ = [
    "OUTCOME_UNITS",
    "DATA_NAMES",
    "STATE_UNITS",
    "outcome_in_units",
    "outcome_at_rows",
    "state_in_units",
]

#: How each test metric or ``predict`` reply field maps under ``y = o + s·y'``: ``"affine"``
#: ``x·s + o``, ``"square"`` ``x·s²``, ``"scale"`` ``x·s``, ``"log"`` ``x + log s`` (a density per
#: point of y), ``None`` unchanged (fractions, scores of labels, counts, and ``mean_f``: a
#: non-Gaussian likelihood's latent f, whose targets are never transformed).
OUTCOME_UNITS: dict[str, str | None] = {
    "mean": "affine",
    "variance_f": "square",
    "variance_y": "square",
    "covariance_f": "square",
    "mean_f": None,
    "rmse": "scale",
    "nll": "log",
    "coverage95": None,
    "accuracy": None,
    "brier": None,
    "n_test": None,
    "cluster": None,
}

#: A ConstantMean's raw constant (it has no constraint) is its constant: named so in the data's units.
DATA_NAMES = {CONSTANT: "mean_module.constant"}
#: What each hyper-parameter in the data's units is measured in: ``"y"`` the target's units, ``"y²"``
#: their square, ``"x"`` each feature's own (one entry per feature), ``"y/x"`` the target's per unit
#: of each feature (one entry per feature).
STATE_UNITS = {
    NOISE: "y²",
    OUTPUTSCALE: "y²",
    DATA_NAMES[CONSTANT]: "y",
    LENGTHSCALE: "x",
    WEIGHTS: "y/x",
    BIAS: "y",
}


def outcome_in_units(value: Prediction | Mapping[str, Any], offset: torch.Tensor, scale: torch.Tensor) -> Any:
    """A :class:`~fedgp.models.posterior.Prediction` (points last, any leading batch), or a mapping
    of test metrics or reply fields keyed by the names of :data:`OUTCOME_UNITS` (any other name is
    refused), mapped by ``y = offset + scale·y'``: ``mean·scale + offset``, variances and covariance
    ``× scale²`` (``scale * scale`` formed first), ``rmse × scale``, ``nll + log scale``, the rest
    as it is. Floating-point tensors come back float64, numbers as Python floats."""
    if isinstance(value, Prediction):
        names = ("mean", "variance_f", "variance_y", "covariance_f", "latent_mean")
        fields = {("mean_f" if n == "latent_mean" else n): getattr(value, n) for n in names}
        out = _fields({k: v for k, v in fields.items() if v is not None}, offset, scale)
        return Prediction(
            out["mean"], out["variance_f"], out["variance_y"], out.get("covariance_f"), out.get("mean_f")
        )
    if isinstance(value, Mapping):
        return _fields(value, offset, scale)
    raise InputTypeError(
        "untransform takes a fedgp Prediction, a HyperState or a mapping of metrics or reply "
        f"tensors, got {type(value).__name__}"
    )


def _fields(fields: Mapping[str, Any], offset: torch.Tensor, scale: torch.Tensor) -> dict[str, Any]:
    unknown = [name for name in fields if name not in OUTCOME_UNITS]
    if unknown:
        raise InputError(
            f"untransform: no map to the data's units is known for {', '.join(map(repr, unknown))}; "
            f"it maps {', '.join(OUTCOME_UNITS)}"
        )
    square = scale * scale
    out: dict[str, Any] = {}
    for name, value in fields.items():
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        tensor = torch.tensor(float(value), dtype=torch.float64) if number else torch.as_tensor(value)
        if tensor.is_floating_point():
            tensor = tensor.to(torch.float64)
        kind = OUTCOME_UNITS[name]
        if kind == "affine":
            tensor = tensor * _lead(scale, tensor) + _lead(offset, tensor)
        elif kind == "square":
            tensor = tensor * _lead(square, tensor)
        elif kind == "scale":
            tensor = tensor * _lead(scale, tensor)
        elif kind == "log":
            tensor = tensor + _lead(scale, tensor).log()
        out[name] = float(tensor) if number else tensor
    return out


def outcome_at_rows(value: Prediction | Mapping[str, Any], offset: torch.Tensor, scale: torch.Tensor) -> Any:
    """A prediction (or ``predict`` reply fields, points last) at rows whose outcome maps differ point by
    point — a multi-output spec's, each output standardised by its own mean and sd: ``offset`` and
    ``scale`` hold one value per point. Means ``m·s + o``; variances ``v·s²``; a joint covariance
    ``C_ij·s_i·s_j``. Tensors come back float64."""
    if isinstance(value, Prediction):
        names = ("mean", "variance_f", "variance_y", "covariance_f")
        out = outcome_at_rows(
            {n: getattr(value, n) for n in names if getattr(value, n) is not None}, offset, scale
        )
        return Prediction(out["mean"], out["variance_f"], out["variance_y"], out.get("covariance_f"))
    out: dict[str, Any] = {}
    for name, tensor in value.items():
        tensor = torch.as_tensor(tensor).to(torch.float64)
        if name == "mean":
            tensor = tensor * scale + offset
        elif name in ("variance_f", "variance_y"):
            tensor = tensor * (scale * scale)
        elif name == "covariance_f":
            tensor = tensor * scale[..., :, None] * scale[..., None, :]
        else:
            raise InputError(f"untransform_rows: no per-point map is known for {name!r}")
        out[name] = tensor
    return out


def _lead(factor: torch.Tensor, value: torch.Tensor, trailing: int | None = None) -> torch.Tensor:
    """``factor`` (shape ``B``, the leading dimensions of ``value``) with ones appended, so that it
    broadcasts over ``value``'s other dimensions (``trailing`` of them; default: all the rest)."""
    trailing = value.dim() - factor.dim() if trailing is None else trailing
    return factor.reshape((*factor.shape, *([1] * max(trailing, 0))))


def state_in_units(
    state: HyperState,
    offset: torch.Tensor | None,
    scale: torch.Tensor | None,
    x_offset: torch.Tensor | None,
    x_scale: torch.Tensor | None,
) -> tuple[HyperState, dict[str, str]]:
    """The hyper-parameters of ``state`` (learned on ``y' = (y − o) / s``, ``x'_i = (x_i − a_i) / b_i``)
    that have an exact map to ``(x, y)``, mapped; and ``{name: why not}`` for the rest.

    The same GP on ``(x, y)`` has: noise and outputscale ``× s²``; constant mean ``o + s·c`` (named
    ``mean_module.constant``, :data:`DATA_NAMES`); lengthscales ``× b_i``, one per feature (a shared
    one becomes one per feature, as the features' ranges differ); linear-mean weights ``s·w_i / b_i``
    and bias ``o + s·(c − Σ w_i a_i / b_i)``; a zero mean is the constant ``o``. Any other
    hyper-parameter (another kernel's) has no such map. ``offset``/``scale`` ``None``: y's map is
    unknown (each client's own), so the hyper-parameters in y's units have none either;
    ``x_offset``/``x_scale`` ``None``: the inputs were not transformed. Values are float64."""
    y_known = offset is not None
    a = None if x_offset is None else x_offset.to(torch.float64)
    b = None if x_scale is None else x_scale.to(torch.float64)
    d = None if b is None else b.numel()
    o, s = offset, scale
    events = state.event_shapes
    values: dict[str, torch.Tensor] = {}
    shapes: dict[str, torch.Size] = {}
    left: dict[str, str] = {}

    def flat(name: str) -> torch.Tensor:  # (*batch, entries), float64
        v = state[name].detach().to(torch.float64)
        return v.reshape(*v.shape[: v.dim() - len(events[name])], events[name].numel())

    for name in state:
        event, n = events[name], events[name].numel()
        v = state[name].detach().to(torch.float64)
        lead = v.shape[: v.dim() - len(event)]
        out, target, shape = None, name, event
        if name in (NOISE, OUTPUTSCALE, CONSTANT, WEIGHTS, BIAS) and not y_known:
            left[name] = "in y's units, with each client's own outcome map: pass its offset and scale"
            continue
        if name in (NOISE, OUTPUTSCALE):  # each entry a variance in y's units (one noise per task...)
            out = v * _lead(s * s, v, len(event))
        elif name == CONSTANT:
            out, target = _lead(o, v, len(event)) + _lead(s, v, len(event)) * v, DATA_NAMES[name]
        elif name == LENGTHSCALE and b is None:
            out = v
        elif name == LENGTHSCALE and n in (1, d):
            shape = torch.Size((*event[:-1], d) if len(event) else (d,))
            out = (flat(name) * b).reshape(*lead, *shape)
        elif name == WEIGHTS and (b is None or n == d):
            w = flat(name)
            out = (_lead(s, w, 1) * w if b is None else _lead(s, w, 1) * w / b).reshape(v.shape)
        elif name == BIAS and n == 1 and WEIGHTS in state and (b is None or events[WEIGHTS].numel() == d):
            w, c = flat(WEIGHTS), flat(name)[..., 0]
            shift = c if a is None else c - w @ (a / b)
            out = (_lead(o, shift, 0) + _lead(s, shift, 0) * shift).reshape(v.shape)
        if out is None:
            left[name] = "no map to the data's units is known for it"
            continue
        values[target], shapes[target] = out, shape
    return HyperState(values, shapes), left
