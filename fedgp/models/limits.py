"""The declared limits of fedgp's files, in one place, and the checks that apply them.

A saved model or checkpoint passes its seal (:mod:`fedgp.messages.container`) and is then parsed;
the seal proves only that the bytes are the ones written with that seal, so whatever a crafted file
with a recomputed seal says is checked here *before* anything is allocated from it. Every refusal is
a :class:`~fedgp.errors.FileFormatError` naming the field (readers add the file's path):

- the JSON header is at most :data:`MAX_HEADER_BYTES` long and nests at most :data:`MAX_JSON_DEPTH`
  deep, measured on the raw bytes before ``json.loads`` runs (no ``RecursionError``);
- tensors are of the dtypes in :data:`TENSOR_DTYPES` only (no float16, bfloat16 or complex state);
- a spec names at most :data:`MAX_SPEC_MODULES` modules; its ``ard_num_dims``, ``input_size`` and
  ``active_dims`` lie in ``[0, MAX_INPUT_DIMS]``; a ``batch_shape`` has at most
  :data:`MAX_BATCH_DIMS` positive sizes whose product is at most :data:`MAX_BATCH_ELEMENTS`, and no
  parameter it implies holds more than :data:`MAX_PARAMETER_ELEMENTS` numbers; a multi-output spec
  has at most :data:`MAX_OUTPUTS` outputs;
- a roster holds at most :data:`MAX_CLIENTS` clients, with as many sizes as ids;
- integers (seeds, round counts) are JSON integers in their range (``1e999``, ``"zero"`` and
  ``true`` are refused by name), booleans are JSON booleans, scales are finite and positive;
- free-form values (a result's ``history.attrs``) are JSON's own types only — objects with string
  keys, arrays, strings, numbers, booleans, null — at most :data:`MAX_ATTRS_BYTES` long as JSON;
- a saved table (history, failures) holds columns of the dtypes in :data:`FRAME_DTYPES` only.

The limits are far above any model fedgp can fit on one machine, and far below what would exhaust
its memory: the largest spec parameter they allow is 80 MB of float64.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import numpy as np
import torch

from fedgp.errors import FileFormatError

__all__ = [
    "MAX_HEADER_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_SPEC_MODULES",
    "MAX_INPUT_DIMS",
    "MAX_BATCH_DIMS",
    "MAX_BATCH_ELEMENTS",
    "MAX_PARAMETER_ELEMENTS",
    "MAX_OUTPUTS",
    "MAX_CLIENTS",
    "TENSOR_DTYPES",
    "MAX_ATTRS_BYTES",
    "FRAME_DTYPES",
    "check_json_depth",
    "plain_json",
    "check_tensors",
    "integer",
    "boolean",
    "positive",
    "shape",
    "shown",
]

#: Bytes of a file's JSON header (history, configs, spec description).
MAX_HEADER_BYTES = 256 * 2**20
#: Nesting of ``[`` and ``{`` in the JSON header (fedgp's own files nest fewer than 30 deep).
MAX_JSON_DEPTH = 100
#: Modules (kernels, means, likelihoods) a saved spec may name.
MAX_SPEC_MODULES = 256
#: ``ard_num_dims``, ``input_size``, and every entry of ``active_dims``.
MAX_INPUT_DIMS = 100_000
#: Entries of a ``batch_shape``.
MAX_BATCH_DIMS = 4
#: Product of a ``batch_shape``.
MAX_BATCH_ELEMENTS = 100_000
#: Numbers in one parameter a spec implies (batch elements times dimensions): 80 MB of float64.
MAX_PARAMETER_ELEMENTS = 10_000_000
#: Outputs T of a saved multi-output spec: W at full rank (T x T) and a dense task covariance B stay
#: under :data:`MAX_PARAMETER_ELEMENTS`.
MAX_OUTPUTS = 3_000
#: Clients in a saved roster.
MAX_CLIENTS = 10_000_000
#: The tensor dtypes a file may hold.
TENSOR_DTYPES = frozenset({torch.float64, torch.float32, torch.int64, torch.int32, torch.bool, torch.uint8})

#: Bytes of a saved result's ``history.attrs`` written as JSON (fedgp's own take under a kilobyte).
MAX_ATTRS_BYTES = 16 * 2**20
#: The dtypes a saved table's columns may have (pandas' names: ``str`` is pandas' string dtype).
FRAME_DTYPES = frozenset({"int64", "int32", "float64", "float32", "bool", "object", "str"})

_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_OTHER = bytes(b for b in range(256) if b not in b"[]{}")


def check_json_depth(text: bytes, where: str = "the header") -> None:
    """Refuse JSON ``text`` longer than :data:`MAX_HEADER_BYTES` or nested deeper than
    :data:`MAX_JSON_DEPTH`, without parsing it (no recursion)."""
    if len(text) > MAX_HEADER_BYTES:
        raise FileFormatError(f"{where} is {len(text)} bytes long; the limit is {MAX_HEADER_BYTES}")
    brackets = _STRINGS.sub(b"", bytes(text)).translate(None, _OTHER)
    if not brackets:
        return
    steps = np.frombuffer(brackets, dtype=np.uint8)
    depth = int(np.cumsum(np.where((steps == ord("[")) | (steps == ord("{")), 1, -1)).max())
    if depth > MAX_JSON_DEPTH:
        raise FileFormatError(f"{where} nests {depth} deep; the limit is {MAX_JSON_DEPTH}")


def check_tensors(tensors: dict[str, torch.Tensor], where: str = "tensor") -> None:
    """Refuse tensors of a dtype outside :data:`TENSOR_DTYPES`, naming the first such entry."""
    for name, tensor in tensors.items():
        if tensor.dtype not in TENSOR_DTYPES:
            allowed = ", ".join(sorted(str(d).removeprefix("torch.") for d in TENSOR_DTYPES))
            dtype = str(tensor.dtype).removeprefix("torch.")
            raise FileFormatError(f"{where} {name!r} is {dtype}; a fedgp file holds {allowed}")


def shown(value: Any) -> str:
    """``value``'s repr for an error message, cut to 60 characters (a crafted value may be huge)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def integer(value: Any, where: str, low: int, high: int) -> int:
    """``value`` if it is a JSON integer (not a float, string or boolean) in ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise FileFormatError(f"{where} must be an integer in [{low}, {high}], got {shown(value)}")
    return value


def boolean(value: Any, where: str) -> bool:
    """``value`` if it is a JSON boolean (``"false"`` is a string, and refused)."""
    if not isinstance(value, bool):
        raise FileFormatError(f"{where} must be true or false, got {shown(value)}")
    return value


def positive(value: Any, where: str) -> float:
    """``value`` if it is a finite number above zero."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (number and math.isfinite(value) and value > 0):
        raise FileFormatError(f"{where} must be a finite number above 0, got {shown(value)}")
    return float(value)


def shape(value: Any, where: str) -> tuple[int, ...]:
    """A ``batch_shape``: at most :data:`MAX_BATCH_DIMS` positive integers whose product is at most
    :data:`MAX_BATCH_ELEMENTS`."""
    if not isinstance(value, list) or len(value) > MAX_BATCH_DIMS:
        raise FileFormatError(f"{where} must be a list of at most {MAX_BATCH_DIMS} sizes, got {shown(value)}")
    sizes = tuple(integer(v, f"{where}[{i}]", 1, MAX_BATCH_ELEMENTS) for i, v in enumerate(value))
    if math.prod(sizes) > MAX_BATCH_ELEMENTS:
        raise FileFormatError(
            f"{where} {list(sizes)} holds {math.prod(sizes)} batch elements; "
            f"the limit is {MAX_BATCH_ELEMENTS}"
        )
    return sizes


def plain_json(value: Any, where: str) -> Any:
    """``value`` if it is made of JSON's own types only — dicts with string keys, lists, strings,
    ints, floats (NaN and infinities too, as fedgp's headers allow them), booleans and ``None`` — and
    at most :data:`MAX_ATTRS_BYTES` long written as JSON; else a :class:`FileFormatError` naming the
    first offending entry. Walks without recursion (the header's depth is bounded already)."""
    stack = [(value, where)]
    while stack:
        item, path = stack.pop()
        if isinstance(item, dict):
            for key, inner in item.items():
                if not isinstance(key, str):
                    raise FileFormatError(f"{path} has a key {shown(key)} that is not a string")
                stack.append((inner, f"{path}[{key!r}]"))
        elif isinstance(item, list):
            stack.extend((inner, f"{path}[{i}]") for i, inner in enumerate(item))
        elif item is not None and not isinstance(item, (str, int, float, bool)):
            raise FileFormatError(f"{path} is a {type(item).__name__}; only JSON values are allowed")
    size = len(json.dumps(value, allow_nan=True))
    if size > MAX_ATTRS_BYTES:
        raise FileFormatError(f"{where} is {size} bytes long as JSON; the limit is {MAX_ATTRS_BYTES}")
    return value
