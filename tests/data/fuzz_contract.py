"""The documented input contract of ``ClientData``, ``Federation`` and ``Federation.from_partition``,
written independently of their code, and hypothesis strategies that generate inputs across it.

Used by the property-based tests (``test_client_properties.py``) and by the fuzz study
(``benchmarks/fuzz_inputs.py``), which tabulates the outcome of every generated input:

- ``accepted``: valid input, accepted, values preserved (float64, rounded to nearest) and not
  shared with the caller's array;
- ``rejected-clearly``: invalid input, refused with a ``ValueError`` naming the client and a field
  that is wrong;
- ``unclear``: refused with a ``ValueError`` that does not name them;
- ``silent-change``: accepted with other values, or invalid input accepted;
- ``valid-rejected``: valid input refused;
- ``crash``: any other exception.
"""

from __future__ import annotations

import inspect
import math
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch
from hypothesis import strategies as st

from fedgp.data import ClientData, Federation

MAX_MAGNITUDE = 1e150  # the documented bound (fedgp.data.client.MAX_MAGNITUDE)

REAL = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
        "float16", "float32", "float64", "longdouble"]  # fmt: skip
NON_REAL = ["bool", "complex128", "str", "datetime64[s]", "timedelta64[s]", "object"]
TORCH_OF = {"int8": torch.int8, "int16": torch.int16, "int32": torch.int32, "int64": torch.int64,
            "uint8": torch.uint8, "uint16": torch.uint16, "uint32": torch.uint32, "uint64": torch.uint64,
            "float16": torch.float16, "float32": torch.float32, "float64": torch.float64}  # fmt: skip


@dataclass
class Case:
    """One generated input: ``build()`` calls the entry point; ``bad`` lists (client, field) pairs
    that the contract says are wrong (empty: valid); ``expected`` the values a valid input keeps."""

    kind: str
    args: dict
    bad: list[tuple[Any, str]] = field(default_factory=list)
    expected: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    sources: list[Any] = field(default_factory=list)  # the caller's mutable arrays
    built: Any = None  # the federation, once accepted

    def build(self):
        if self.kind == "ClientData":
            return Federation([ClientData(**self.args)])
        if self.kind == "Federation":
            return Federation([ClientData(**a) for a in self.args["clients"]])
        return Federation.from_partition(**self.args)


# -- values ----------------------------------------------------------------------------------------
def _values(draw, shape, dtype: str, allow_bad: bool) -> np.ndarray:
    size = int(np.prod(shape)) if shape else 1
    if dtype in REAL:
        info = np.iinfo(dtype) if dtype[0] in "iu" else None
        if info is not None:
            lo, hi = max(info.min, -(2**40)), min(info.max, 2**40)
            big = [info.min, info.max] if allow_bad else []
            elems = st.one_of(st.integers(lo, hi), st.integers(max(lo, -3), 3), *(st.just(b) for b in big))
            return np.array(draw(st.lists(elems, min_size=size, max_size=size)), dtype=dtype).reshape(shape)
        top = min(1e6, float(np.finfo(dtype).max))
        finite = st.floats(-top, top, allow_nan=False, width=64)
        extreme = st.sampled_from([np.nan, np.inf, -np.inf, 1e200, -3e160, 2e149, 1e-300, 5e-324])
        elems = st.one_of(finite, finite, finite, extreme) if allow_bad else finite
        raw = draw(st.lists(elems, min_size=size, max_size=size))
        with np.errstate(over="ignore"):
            return np.array(raw, dtype=np.float64).astype(dtype).reshape(shape)
    if dtype == "bool":
        return np.array(draw(st.lists(st.booleans(), min_size=size, max_size=size)), dtype=bool).reshape(
            shape
        )
    if dtype == "complex128":
        return (np.arange(size) + 1j).reshape(shape)
    if dtype == "str":
        return np.array([str(i) for i in range(size)]).reshape(shape)
    if dtype.startswith("datetime64") or dtype.startswith("timedelta64"):
        return np.arange(size).astype(dtype).reshape(shape)
    return np.array([object() if i % 2 else 1.5 for i in range(size)] or [None], dtype=object)[:size].reshape(
        shape
    )


def _container(draw, array: np.ndarray, ndim_ok: bool):
    """The same values as numpy, torch, pandas or nested lists; returns (value, mutable source)."""
    options = ["numpy", "list"]
    if str(array.dtype) in TORCH_OF:
        options.append("torch")
    if ndim_ok and array.ndim in (1, 2) and array.dtype.kind in "iuf" and array.dtype != np.longdouble:
        options.append("pandas")
    kind = draw(st.sampled_from(options))
    if kind == "numpy":
        copy = array.copy()
        return copy, copy
    if kind == "list":
        return array.tolist(), None
    if kind == "torch":
        t = torch.from_numpy(array.copy()).to(TORCH_OF[str(array.dtype)])
        return t, t
    return (pd.DataFrame(array) if array.ndim == 2 else pd.Series(array)), None


def _field_problems(array: np.ndarray, name: str) -> list[str]:
    if array.dtype.kind not in "iuf":
        return [name]
    with np.errstate(over="ignore", invalid="ignore"):
        as64 = array.astype(np.float64)
    if not np.isfinite(as64).all() or (as64.size and np.abs(as64).max() >= MAX_MAGNITUDE):
        return [name]
    return []


IDS = st.one_of(
    st.integers(-5, 50), st.text(min_size=0, max_size=4), st.none(), st.tuples(st.integers(0, 3)),
    st.sampled_from([float("nan"), np.float64("nan"), [1, 2], {"a": 1}, np.arange(2), 2.5, True]),
)  # fmt: skip


def _id_problem(cid) -> bool:
    if isinstance(cid, (np.ndarray, torch.Tensor, list, dict, set)):
        return True
    return isinstance(cid, float) and math.isnan(cid)


# -- one client ------------------------------------------------------------------------------------
@st.composite
def client_arrays(draw, cid, n=None, d=None, allow_bad=True, training=True):
    """Arrays and keyword arguments for one ``ClientData``, with the problems the contract sees
    (``training``: in a federation, which needs 2 points per client; a lone ``ClientData`` with 0
    or 1 points is a valid cold-start client)."""
    n = draw(st.integers(0, 6)) if n is None else n
    d = draw(st.integers(0 if allow_bad else 1, 3)) if d is None else d
    x_dtype = draw(st.sampled_from(REAL * 3 + NON_REAL)) if allow_bad else draw(st.sampled_from(REAL))
    y_dtype = draw(st.sampled_from(REAL * 3 + NON_REAL)) if allow_bad else draw(st.sampled_from(REAL))
    x_shape, y_shape = (n, d), (n,)
    if allow_bad:
        x_shape = draw(st.sampled_from([x_shape] * 6 + [(n,), (n, d, 1)]))
        y_shape = draw(st.sampled_from([y_shape] * 6 + [(n, 1), (max(n - 1, 0),), (n + 1,)]))
    X = _values(draw, x_shape, x_dtype, allow_bad)
    y = _values(draw, y_shape, y_dtype, allow_bad)
    Xv, Xsrc = _container(draw, X, True)
    yv, ysrc = _container(draw, y, True)
    # the contract reads nested lists as numpy.asarray does: [] is shape (0,), datetimes are objects
    X = np.asarray(Xv) if isinstance(Xv, list) else X
    y = np.asarray(yv) if isinstance(yv, list) else y
    bad = _field_problems(X, "X") + _field_problems(y, "y")
    shapes = (["X"] if X.ndim != 2 or X.shape[1:] == (0,) else []) + (["y"] if y.ndim != 1 else [])
    if X.shape[:1] != y.shape[:1]:
        shapes.append("X")  # "X has 3 rows but y has 2"
    bad += shapes
    if not bad:
        if X.shape[0] < 2:
            bad = ["X"] if training else []  # "client 0: 0 training point(s); training needs at least 2"
        elif len(np.unique(y.astype(np.float64))) == 1:
            bad = ["y"]
    kwargs = {"X": Xv, "y": yv, "id": cid}
    return kwargs, bad, (X, y), [s for s in (Xsrc, ysrc) if s is not None]


@st.composite
def client_cases(draw):
    cid = draw(IDS)
    kwargs, bad, arrays, sources = draw(client_arrays(cid))  # built into a Federation: training rules
    problems = [(cid, "id")] if _id_problem(cid) else [(cid, f) for f in bad]
    if cid is None:  # the Federation it is built into names it by its position
        problems += [(0, f) for f in bad]
    return Case("ClientData", kwargs, problems, [] if problems else [arrays], sources)


@st.composite
def federation_cases(draw):
    k = draw(st.integers(1, 4))
    dims = [draw(st.sampled_from([1, 1, 1, 2])) for _ in range(k)]
    clients, expected, bad, seen = [], [], [], {}
    for position, dk in enumerate(dims):
        cid = draw(st.one_of(st.integers(0, 3), st.none(), st.sampled_from(["a", "b", float("nan")])))
        kwargs, problems, arrays, _ = draw(
            client_arrays(cid, n=draw(st.integers(2, 5)), d=dk, allow_bad=False)
        )
        key = position if cid is None else cid
        bad += [(cid, name) for name in problems]
        if isinstance(cid, float) and math.isnan(cid):
            bad.append((cid, "id"))
        elif key in seen:
            bad.append((key, "id"))
        if dk != dims[0]:
            bad.append((key, "features"))
        seen[key] = position
        clients.append(kwargs)
        expected.append(arrays)
    return Case("Federation", {"clients": clients}, bad, [] if bad else expected)


@st.composite
def partition_cases(draw):
    n = draw(st.integers(2, 8))
    d = draw(st.integers(1, 2))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    X, y = rng.normal(size=(n, d)), rng.normal(size=n)
    k = draw(st.integers(1, 3))
    use_ids = draw(st.booleans())
    ids = [draw(st.one_of(st.integers(0, 9), st.sampled_from(["u", "v", float("nan")]))) for _ in range(k)]
    parts, expected, bad = [], [], []
    for i in range(k):
        cid = ids[i] if use_ids else i
        form = draw(
            st.sampled_from(
                ["int", "uint", "mask", "mask-wrong-length", "float", "negative", "out", "2d", "list"]
            )
        )
        rows = np.array(draw(st.lists(st.integers(0, n - 1), min_size=0, max_size=n + 2)), dtype=np.int64)
        if form == "int":
            part = rows
        elif form == "uint":
            part = rows.astype(np.uint32)
        elif form == "list":
            part = rows.tolist()
        elif form == "mask":
            part = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)))
            rows = np.flatnonzero(part)
        elif form == "mask-wrong-length":
            part = np.ones(n + 1, dtype=bool)
        elif form == "float":
            part = rows.astype(np.float64) + 0.5
        elif form == "negative":
            part = np.append(rows, -1)
        elif form == "out":
            part = np.append(rows, n)
        else:
            part = rows.reshape(1, -1)
        parts.append(part)
        if isinstance(cid, float) and math.isnan(cid):
            bad.append((cid, "id"))
        elif form in ("mask-wrong-length", "negative", "out", "2d") or (form == "float" and rows.size):
            bad.append((cid, "partition"))
        elif len(rows) < 2:
            bad.append((cid, "X"))
        elif len(np.unique(y[rows])) == 1:
            bad.append((cid, "y"))
        expected.append((X[rows], y[rows]))
    keys = [ids[i] if use_ids else i for i in range(k)]
    for i, key in enumerate(keys):
        if not (isinstance(key, float) and math.isnan(key)) and key in keys[:i]:
            bad.append((key, "id"))
    args = {"X": X, "y": y, "parts": parts}
    if use_ids:
        args["ids"] = ids
    return Case("from_partition", args, bad, [] if bad else expected)


CASES = st.one_of(client_cases(), client_cases(), federation_cases(), partition_cases())


# -- the judge ----------------------------------------------------------------------------------------
_FIELD_WORDS = {"id": r"\bid\b", "features": r"features", "partition": r"partition|mask|row index",
                "X": r"\bX\b|single point|training point", "y": r"\by\b"}  # fmt: skip


def _names_a_problem(message: str, bad: list[tuple[Any, str]]) -> bool:
    """Does the message name a client the contract finds wrong, and a field wrong in it?"""
    return any(
        (f"client {cid!r}" in message or f"id {cid!r}" in message) and re.search(_FIELD_WORDS[name], message)
        for cid, name in bad
    )


def outcome(case: Case) -> tuple[str, str]:
    """Run one case; (category, detail)."""
    try:
        fed = case.build()
    except ValueError as err:
        message = str(err)
        if not case.bad:
            return "valid-rejected", message
        return ("rejected-clearly" if _names_a_problem(message, case.bad) else "unclear"), message
    except Exception as err:  # noqa: BLE001 - anything else is what the study counts
        return "crash", f"{type(err).__name__}: {err}"
    case.built = fed
    if case.bad:
        return "silent-change", f"accepted, but the contract refuses {case.bad}"
    for client, (X, y) in zip(fed, case.expected):
        want_X = torch.from_numpy(np.asarray(X).astype(np.float64).reshape(client.X.shape))
        want_y = torch.from_numpy(np.asarray(y).astype(np.float64))
        if not (torch.equal(client.X, want_X) and torch.equal(client.y, want_y)):
            return "silent-change", f"client {client.id!r}: stored values differ from the input"
    for source in case.sources:  # the caller writes into its array afterwards
        before = [c.X.clone() for c in fed] + [c.y.clone() for c in fed]
        source.fill_(0) if isinstance(source, torch.Tensor) else source.fill(0)
        after = [c.X for c in fed] + [c.y for c in fed]
        if not all(torch.equal(a, b) for a, b in zip(before, after)):
            return "silent-change", "the stored data share memory with the caller's array"
    return "accepted", ""


def one_round_on_each_engine(fed: Federation) -> list[str]:
    """One FGPR round on the sequential and the batched engine, transforms off: ``fit-ok``, or
    ``fit-fails-naming-client`` / ``fit-unclear`` with the error, per engine."""
    import fedgp
    from fedgp.strategies import FGPR

    if "transforms" in inspect.signature(fedgp.fit).parameters:
        raw = {"transforms": None}  # the data as given: the harder case
    else:  # a fedgp from before fedgp.run (benchmarks/fuzz_inputs.py --against an older checkout)
        raw = {"input_transform": None, "outcome_transform": None, "progress": False}
    labels = []
    for engine in ("sequential", "batched"):
        try:
            fedgp.fit(fedgp.GPSpec(), fed, FGPR(local_steps=1, batch_size=4), engine=engine, rounds=1, **raw)
            labels.append("fit-ok")
        except Exception as err:  # noqa: BLE001 - counted by the caller
            named = any(repr(i) in str(err) for i in fed.ids)
            labels.append(("fit-fails-naming-client" if named else "fit-unclear") + f": {engine}: {err}")
    return labels
