"""The checks every client's arrays pass where they enter (:class:`~fedgp.data.client.ClientData`,
:meth:`Federation.from_partition <fedgp.data.client.Federation.from_partition>`,
:meth:`Federation.from_runs <fedgp.data.client.Federation.from_runs>`): real dtypes, finite values below
:data:`MAX_MAGNITUDE`, matching shapes, usable ids. Each refusal names the client and the field."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import torch

from fedgp.errors import InputError

ArrayLike = Any  # numpy array, torch tensor, pandas object or nested sequence


#: Largest magnitude accepted. A kernel squares differences of inputs and the likelihood squares
#: targets and sums them over points; at 1e150 the squares (1e300) keep a factor 1e8 of headroom
#: below float64's maximum (1.8e308). Larger values are refused rather than left to overflow later
#: inside one engine but not another. (``fit``'s input/outcome transforms rescale data, but can be
#: turned off, so the check stays here, where the data enter.)
MAX_MAGNITUDE = 1e150

_REAL_NAMES = "float16 bfloat16 float32 float64 int8 int16 int32 int64 uint8 uint16 uint32 uint64 " + (
    "float8_e4m3fn float8_e4m3fnuz float8_e5m2 float8_e5m2fnuz"
)
_TORCH_REAL = {getattr(torch, name) for name in _REAL_NAMES.split() if hasattr(torch, name)}


class _Pooled:
    """Stands for ``from_partition``'s pooled arrays where messages would name a client."""


_POOLED = _Pooled()


def _client_label(client: Any) -> str:
    return "from_partition (pooled arrays)" if client is _POOLED else f"client {client!r}"


def _refuse_dtype(client: Any, name: str, dtype: Any) -> InputError:
    hint = {
        "b": "; booleans are not numbers here: convert with .astype(float) if that is meant",
        "c": "; complex values: pass the real and imaginary parts as two real columns",
        "M": "; convert datetimes to numbers (e.g. seconds since a reference time)",
        "m": "; convert durations to numbers (e.g. seconds)",
        "O": "; a column of mixed or non-numeric objects: convert it to a numeric array",
        "U": "; text: encode it as numbers first",
        "S": "; bytes: encode them as numbers first",
    }.get(getattr(dtype, "kind", ""), "")
    return InputError(f"{_client_label(client)}: {name} has dtype {dtype}; expected real numbers{hint}")


def _from_pandas(value: pd.DataFrame | pd.Series, client: Any, name: str) -> np.ndarray:
    dtypes = list(value.dtypes) if isinstance(value, pd.DataFrame) else [value.dtype]
    for dtype in dtypes:
        if pd.api.types.is_bool_dtype(dtype) or not pd.api.types.is_numeric_dtype(dtype):
            raise _refuse_dtype(client, name, np.dtype("O") if not hasattr(dtype, "kind") else dtype)
        if pd.api.types.is_complex_dtype(dtype):
            raise _refuse_dtype(client, name, dtype)
    # nullable pandas dtypes (Int64, Float64) give object arrays with pd.NA; read missing as NaN
    return value.to_numpy(dtype=np.float64, na_value=np.nan)


def _as_float_tensor(value: ArrayLike, client: Any, name: str) -> torch.Tensor:
    """A float64 CPU tensor that owns its memory (so later writes by the caller cannot reach it).

    Every real dtype is accepted (signed, unsigned, float16 to longdouble) and rounded to the
    nearest float64; anything else is refused naming the client, the field and the dtype.
    """
    label = _client_label(client)
    if isinstance(value, (pd.DataFrame, pd.Series)):
        value = _from_pandas(value, client, name)
    if isinstance(value, torch.Tensor):
        if value.is_sparse or value.layout != torch.strided:
            raise InputError(f"{label}: {name} is a {value.layout} tensor; pass a dense tensor (.to_dense())")
        if value.dtype not in _TORCH_REAL:
            raise _refuse_dtype(client, name, value.dtype)
        try:
            source = value.detach().to("cpu")
        except (RuntimeError, NotImplementedError) as err:
            raise InputError(f"{label}: {name} cannot be copied to the CPU ({err})") from None
        tensor = source.to(torch.float64, copy=True)
        wide = source.is_floating_point() and bool(torch.isfinite(source).all())
    else:
        if isinstance(value, np.ma.MaskedArray) and bool(np.ma.getmaskarray(value).any()):
            raise InputError(
                f"{label}: {name} is a masked array with masked entries; fill or drop them first"
            )
        try:
            array = np.asarray(value)
        except (ValueError, TypeError) as err:
            raise InputError(f"{label}: {name} cannot be read as a numeric array ({err})") from None
        if array.dtype.kind not in "iuf":
            raise _refuse_dtype(client, name, array.dtype)
        with np.errstate(over="ignore"):
            converted = array.astype(np.float64)  # a copy, rounded to nearest
        tensor = torch.from_numpy(converted)
        wide = array.dtype.kind == "f" and bool(np.isfinite(array).all())
    if wide and not bool(torch.isfinite(tensor).all()):
        raise InputError(f"{label}: {name} has finite values beyond float64's range; rescale the data")
    return tensor.contiguous()


def _check_finite(tensor: torch.Tensor, client: Any, name: str) -> None:
    bad = ~torch.isfinite(tensor)
    if bool(bad.any()):
        rows = torch.nonzero(bad.reshape(tensor.shape[0], -1).any(dim=1)).flatten()
        kind = "NaN" if bool(torch.isnan(tensor).any()) else "inf"
        raise InputError(
            f"{_client_label(client)}: {name} contains {int(bad.sum())} non-finite value(s) ({kind}), "
            f"first at row {int(rows[0])}"
        )
    if tensor.numel():
        peak = float(tensor.abs().max())
        if peak >= MAX_MAGNITUDE:
            raise InputError(
                f"{_client_label(client)}: {name} has values up to {peak:.3g} in magnitude; fedgp refuses "
                f"|values| >= {MAX_MAGNITUDE:g}, whose squares near float64's limit in the kernel and "
                "likelihood. Rescale (standardise) the data."
            )


def _check_shapes(X: torch.Tensor, y: torch.Tensor, client: Any, xname: str, yname: str) -> None:
    label = _client_label(client)
    if X.dim() != 2:
        raise InputError(
            f"{label}: {xname} must be 2-D (n_points, n_features), got shape {tuple(X.shape)}"
            + ("; for one feature use X[:, None]" if X.dim() == 1 else "")
        )
    if y.dim() != 1:
        raise InputError(
            f"{label}: {yname} must be 1-D (n_points,), got shape {tuple(y.shape)}"
            + ("; for a column vector use y.ravel()" if y.dim() == 2 and y.shape[1] == 1 else "")
        )
    if X.shape[0] != y.shape[0]:
        raise InputError(f"{label}: {xname} has {X.shape[0]} rows but {yname} has {y.shape[0]}")
    if X.shape[1] == 0:
        raise InputError(f"{label}: {xname} has no features")


def within_limits(values: torch.Tensor) -> bool:
    """Whether every value is finite and below :data:`MAX_MAGNITUDE` (one pass; NaN fails)."""
    return not values.numel() or bool(values.abs().max() < MAX_MAGNITUDE)


def _check_not_constant(y: torch.Tensor, client: Any) -> None:
    if y.shape[0] >= 2 and bool((y == y[0]).all()):
        raise InputError(
            f"client {client!r}: y is constant ({float(y[0])!r} at all {y.shape[0]} points); "
            "its marginal likelihood has no information about the kernel"
        )


def _check_pair(X: torch.Tensor, y: torch.Tensor, client: Any, xname: str, yname: str) -> None:
    _check_shapes(X, y, client, xname, yname)
    _check_finite(X, client, xname)
    _check_finite(y, client, yname)


def _check_id(client_id: Any, where: str) -> None:
    """Ids key clients in dicts and messages: they must be hashable, equal to themselves, scalars."""
    if isinstance(client_id, (torch.Tensor, np.ndarray)):
        raise InputError(f"{where}: id {client_id!r} is an array; use a str or an int (e.g. .item())")
    try:
        hash(client_id)
    except TypeError:
        raise InputError(
            f"{where}: id {client_id!r} is not hashable ({type(client_id).__name__}); use a str or an int"
        ) from None
    try:
        itself = bool(client_id == client_id)
    except Exception:  # an __eq__ that does not give a truth value cannot key a client
        itself = False
    if not itself:
        raise InputError(f"{where}: id {client_id!r} is not equal to itself (NaN?); use a str or an int")
