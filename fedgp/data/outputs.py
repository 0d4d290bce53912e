"""Several outputs per input, as the rows a multi-output spec reads (:mod:`fedgp.models.multioutput`).

An owner measuring T outputs holds an (n, T) table in which some outputs may be missing at some
inputs (NaN). :func:`long_form` turns it into one row per *observed* output, ``(x, t) → y``, the
output index t appended to X as its last column; :func:`outputs_client` builds the
:class:`~fedgp.data.client.ClientData` of such rows. NaN means "not measured" here and only here:
``ClientData`` itself still refuses NaN in ``y``, so a single-output table with a NaN is still an error.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from fedgp.data.client import ClientData
from fedgp.errors import InputError

__all__ = ["long_form", "outputs_client"]


def _table(Y: Any, where: str, name: str) -> torch.Tensor:
    try:
        out = torch.as_tensor(np.asarray(Y, dtype=np.float64))
    except (TypeError, ValueError):
        raise InputError(
            f"{where}: {name} must be an (n, T) table of numbers (NaN where an output is missing)"
        ) from None
    if out.dim() != 2 or out.shape[1] < 1:
        raise InputError(
            f"{where}: {name} must have shape (n, T), one column per output with NaN where one is "
            f"missing, got shape {tuple(out.shape)}"
        )
    if bool(torch.isinf(out).any()):
        row, col = (int(i) for i in torch.nonzero(torch.isinf(out))[0])
        raise InputError(f"{where}: {name} holds an infinite value at row {row}, output {col}")
    return out


def long_form(X: Any, Y: Any, where: str = "long_form") -> tuple[torch.Tensor, torch.Tensor]:
    """``(X_rows, y)``: one row per observed entry of ``Y`` (n, T), input by input, its output index
    appended to ``X`` (n, d) as the last column; NaN entries of ``Y`` (missing outputs) give no row."""
    Y = _table(Y, where, "Y")
    try:
        X = torch.as_tensor(np.asarray(X, dtype=np.float64))
    except (TypeError, ValueError):
        raise InputError(f"{where}: X must be an (n, d) array of numbers") from None
    if X.dim() != 2 or X.shape[0] != Y.shape[0]:
        raise InputError(
            f"{where}: X must have shape (n, d) with one row per row of Y {tuple(Y.shape)}, "
            f"got {tuple(X.shape)}"
        )
    seen = ~torch.isnan(Y)
    rows, tasks = torch.nonzero(seen, as_tuple=True)
    inputs = torch.cat([X[rows], tasks.to(torch.float64)[:, None]], 1)
    return inputs, Y[rows, tasks]


def outputs_client(
    X: Any, Y: Any, id: Any = None, X_test: Any = None, Y_test: Any = None, **fields: Any
) -> ClientData:
    """A client holding the observed entries of ``Y`` (n, T; NaN where an output is missing) at the
    inputs ``X`` (n, d) as rows of a multi-output spec, and likewise its test split (``X_test``,
    ``Y_test``); other ``ClientData`` fields (``metadata`` ...) pass through."""
    where = f"client {id!r}"
    inputs, y = long_form(X, Y, where)
    test = {}
    if (X_test is None) != (Y_test is None):
        raise InputError(f"{where}: give both X_test and Y_test, or neither")
    if X_test is not None:
        test_inputs, test_y = long_form(X_test, Y_test, f"{where}, test split")
        if _table(Y_test, where, "Y_test").shape[1] != _table(Y, where, "Y").shape[1]:
            raise InputError(f"{where}: Y_test has a different number of outputs than Y")
        test = {"X_test": test_inputs, "y_test": test_y}
    return ClientData(inputs, y, id=id, **test, **fields)
