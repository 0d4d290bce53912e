"""A run's history in the data's units, for the people who read ``history.csv``.

``FitResult.history`` holds the hyper-parameters the model learned, in the units it learned them:
on standardised targets and unit-cube inputs when the data transforms were on
(:mod:`fedgp.transforms`). Someone reading a model folder (``fedgp fit --out``, the Flower app's
``out-dir``) wants a noise variance in the target's units and a lengthscale in each feature's.
This module is the exact map between the two; :func:`fedgp.layout.write_history` writes both the
converted table and the units of every column.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["history_in_data_units"]

#: A hyper-parameter's history column: ``[j/]name[i]`` (``j/``: a clustered strategy's cluster ``j``).
_PARAM_COLUMN = re.compile(r"(?:(?P<batch>\d+)/)?(?P<name>[^\[\]]+?)(?:\[(?P<index>\d+)\])?")
#: History columns holding the training objective: an NLL per point of the transformed target.
_OBJECTIVES = ("train_nll", "objective")
_NOISE, _OUTPUTSCALE = "likelihood.noise_covar.noise", "covar_module.outputscale"
_LENGTHSCALE = "covar_module.base_kernel.lengthscale"
_CONSTANT, _WEIGHTS, _BIAS = "mean_module.raw_constant", "mean_module.weights", "mean_module.bias"


def _param_key(match: re.Match) -> tuple[str, str]:
    """``(cluster prefix, hyper-parameter name)`` of a history column's match."""
    return (f"{match['batch']}/" if match["batch"] is not None else "", match["name"])


@dataclass
class _Units:
    """The transform's numbers and the history's hyper-parameter columns, grouped."""

    history: Any
    features: Sequence[str]
    m: float  # the outcome's offset and scale: y' = (y - m) / s
    s: float
    a: np.ndarray  # the inputs' lower bounds and ranges: x'_i = (x_i - a_i) / b_i
    b: np.ndarray
    y_local: bool  # each owner's own standardisation: no value in the target's units exists
    identity: bool
    y_model: str  # the units the model learned y in ("standardised y", ...; "" for none)
    model: str  # the same for y and x together
    groups: dict[tuple[str, str], dict[int, str]]  # (cluster prefix, name) -> {index: column}

    def values(self, key: tuple[str, str]) -> np.ndarray:
        """The columns of one hyper-parameter as ``(rounds, entries)``."""
        columns = self.groups[key]
        return np.column_stack([self.history[columns[i]].to_numpy(float) for i in sorted(columns)])


def _convert(u: _Units, key: tuple[str, str]) -> list[tuple[str, Any, str]]:
    """``(column, values, units)`` of one hyper-parameter in the data's units, where a faithful
    map exists; else its model-unit columns, named so."""
    prefix, name = key
    v, d, fixed_y = u.values(key), len(u.features), not u.y_local
    if name in (_NOISE, _OUTPUTSCALE) and fixed_y and v.shape[1] == 1:
        return [(prefix + name, v[:, 0] * u.s * u.s, "the target's units squared")]
    if name == _CONSTANT and fixed_y and v.shape[1] == 1:
        return [(f"{prefix}mean_module.constant", u.m + u.s * v[:, 0], "the target's units")]
    if name == _LENGTHSCALE and v.shape[1] in (1, d):
        return [
            (f"{prefix}{name}[{f}]", v[:, i if v.shape[1] == d else 0] * u.b[i], f"{f}'s units")
            for i, f in enumerate(u.features)
        ]
    weights = (prefix, _WEIGHTS)
    if name == _WEIGHTS and fixed_y and v.shape[1] == d:
        return [
            (f"{prefix}{name}[{f}]", u.s * v[:, i] / u.b[i], f"the target's units per unit of {f}")
            for i, f in enumerate(u.features)
        ]
    if name == _BIAS and fixed_y and v.shape[1] == 1 and len(u.groups.get(weights, ())) == d:
        w = u.values(weights)
        return [(prefix + name, u.m + u.s * (v[:, 0] - w @ (u.a / u.b)), "the target's units")]
    if u.identity:
        return [(c, u.history[c], "the data's units (no transform)") for c in u.groups[key].values()]
    only_y = name in (_NOISE, _OUTPUTSCALE, _CONSTANT)
    suffix, unit = (u.y_model, u.y_model) if only_y else ("model units", u.model)
    return [(f"{c} ({suffix})", u.history[c], f"model units ({unit})") for c in u.groups[key].values()]


def _units(history: pd.DataFrame, transform: Any, features: Sequence[str], params: Sequence[str]) -> _Units:
    d = len(features)
    y_scaled, x_scaled = transform.y_offset is not None, transform.x_offset is not None
    y_model = "each owner's standardised y" if transform.y_local else ("standardised y" if y_scaled else "")
    groups: dict[tuple[str, str], dict[int, str]] = {}
    for column in history.columns:
        match = _PARAM_COLUMN.fullmatch(str(column))
        if match and match["name"] in params:
            groups.setdefault(_param_key(match), {})[int(match["index"] or 0)] = column
    return _Units(
        history=history,
        features=features,
        m=float(transform.y_offset) if y_scaled else 0.0,
        s=float(transform.y_scale) if y_scaled else 1.0,
        a=transform.x_offset.double().numpy() if x_scaled else np.zeros(d),
        b=transform.x_scale.double().numpy() if x_scaled else np.ones(d),
        y_local=bool(transform.y_local),
        identity=bool(transform.is_identity),
        y_model=y_model,
        model=", ".join(x for x in (y_model, "unit-cube x" if x_scaled else "") if x),
        groups=groups,
    )


def history_in_data_units(
    history: pd.DataFrame, transform: Any, features: Sequence[str], params: Sequence[str]
) -> tuple[pd.DataFrame, dict[str, str]]:
    """``history`` (``FitResult.history``) with its hyper-parameter columns in the data's units, and
    the units of its columns (hyper-parameters, objectives, test metrics), as ``fedgp fit`` writes
    them to ``history.csv`` and ``transforms.json``. ``transform``: the run's
    :class:`fedgp.transforms.DataTransform` (``FitResult.transform``); ``params``: the spec's
    hyper-parameter names.

    The model learned on transformed data, ``y' = (y − m) / s`` and ``x'_i = (x_i − a_i) / b_i``
    (the unit cube: ``a`` the lower bounds, ``b`` the ranges). The same GP in the data's units has,
    exactly: noise variance and outputscale ``× s²``; constant mean ``m + s·c`` (column
    ``mean_module.constant``); linear-mean weights ``s·w_i / b_i`` and bias
    ``m + s·(c − Σ w_i a_i / b_i)``; lengthscales ``× b_i``, one column per feature named by it
    (``lengthscale[x1]``; a single shared lengthscale becomes one per feature, as their ranges
    differ); a zero mean is the constant ``m`` (``transforms.json``'s outcome mean). With each
    owner's own standardisation (``Standardize(local=True)``) no value in the target's units
    exists: those columns stay in the model's units and say so in their names
    (``covar_module.outputscale (each owner's standardised y)``), as do the training objective's
    (``train_nll (standardised y)``, the figure the progress bar shows) and any hyper-parameter
    this map does not know (``... (model units)``). The test metrics are in the data's units
    already.
    """
    import pandas as pd

    u = _units(history, transform, features, params)
    columns: dict[str, Any] = {}
    units: dict[str, str] = {}
    done: set[tuple[str, str]] = set()
    for column in history.columns:
        match = _PARAM_COLUMN.fullmatch(str(column))
        key = None if match is None else _param_key(match)
        if key in u.groups:
            if key not in done:
                done.add(key)
                for name, value, unit in _convert(u, key):
                    columns[name], units[name] = value, unit
            continue
        name = column
        if column in _OBJECTIVES and u.y_model:
            name = f"{column} ({u.y_model})"
            units[name] = (
                f"model units: NLL per training point of the {u.y_model} (the optimiser's objective)"
            )
        elif str(column).startswith("test_rmse"):
            units[name] = "the target's units"
        elif str(column).startswith("test_nll"):
            units[name] = "the data's units: NLL per test point of the target"
        columns[name] = history[column]
    return pd.DataFrame(columns, index=history.index), units
