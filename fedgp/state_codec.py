"""A server state as JSON plus a table of tensors: the one codec behind checkpoints and saved results.

A strategy's server state is a tree of tensors, :class:`~fedgp.models.state.HyperState`\\ s,
plain values and small dataclasses (a clustered state, an initialisation's progress). Files hold
it without pickle: :func:`encode` turns the tree into JSON-ready values whose tensors are
references into a flat ``{key: tensor}`` table (written with safetensors), and :func:`decode`
rebuilds it.

One type policy for every file fedgp reads: a dataclass is named by ``module:qualname`` and rebuilt
only if it is defined in fedgp and already imported, or registered with
:func:`register_state_type`. Nothing is imported and nothing else is instantiated, so a crafted
file cannot name ``os:system`` and have it run. (A strategy's state types are imported with the
strategy, which both checkpoint resumption and ``fedgp.load`` build before decoding its state.)
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import numpy as np
import torch

from fedgp.models.state import HyperState

__all__ = ["StateCodecError", "decode", "encode", "register_state_type"]

_EXTRA_TYPES: dict[str, type] = {}


class StateCodecError(ValueError):
    """An encoded tree names a type it may not, or refers to a tensor the file does not hold."""


def register_state_type(cls: type) -> type:
    """Allow a dataclass defined outside fedgp (a user strategy's server state) in fedgp's files."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass; only dataclasses can be written to fedgp's files")
    _EXTRA_TYPES[_type_name(cls)] = cls
    return cls


def _type_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _in_fedgp(module_name: str) -> bool:
    return module_name == "fedgp" or module_name.startswith("fedgp.")


def _resolve_type(name: str) -> type:
    """The dataclass ``module:qualname`` names, if it is already imported and allowed; never imports."""
    if name in _EXTRA_TYPES:
        return _EXTRA_TYPES[name]
    module_name, _, qualname = str(name).partition(":")
    obj: Any = sys.modules.get(module_name) if _in_fedgp(module_name) else None
    for part in qualname.split(".") if obj is not None else ():
        obj = getattr(obj, part, None)
    # Defined in fedgp, not merely reachable from it (a fedgp module's ``os`` attribute, say).
    if not (isinstance(obj, type) and _in_fedgp(obj.__module__) and dataclasses.is_dataclass(obj)):
        raise StateCodecError(
            f"the file names type {name!r}, which is not an imported fedgp dataclass; fedgp's files can "
            "only rebuild fedgp's own state types (register others with register_state_type)"
        )
    return obj


def encode(value: Any, tensors: dict[str, torch.Tensor], where: str, prefix: str = "") -> Any:
    """``value`` as JSON-ready values; its tensors are added to ``tensors`` under ``prefix<n>``.

    ``where`` names the value in error messages (``server_state.states``).
    """

    def add(tensor: torch.Tensor) -> str:
        key = f"{prefix}{len(tensors)}"
        tensors[key] = tensor.detach().cpu().contiguous().clone()  # safetensors refuses shared memory
        return key

    def walk(value: Any, where: str) -> Any:
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if isinstance(value, np.generic):
            return value.item()
        if isinstance(value, torch.Tensor):
            return {"__tensor__": add(value)}
        if isinstance(value, np.ndarray):
            return {"__ndarray__": add(torch.from_numpy(np.ascontiguousarray(value).copy()))}
        if isinstance(value, HyperState):
            return {
                "__hyperstate__": {k: walk(v, f"{where}.{k}") for k, v in value.items()},
                "events": {k: list(s) for k, s in value.event_shapes.items()},
            }
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            fields = {
                f.name: walk(getattr(value, f.name), f"{where}.{f.name}") for f in dataclasses.fields(value)
            }
            return {"__dataclass__": _type_name(type(value)), "fields": fields}
        if isinstance(value, tuple):
            return {"__tuple__": [walk(v, f"{where}[{i}]") for i, v in enumerate(value)]}
        if isinstance(value, list):
            return [walk(v, f"{where}[{i}]") for i, v in enumerate(value)]
        if isinstance(value, dict):
            return {"__items__": [[walk(k, where), walk(v, f"{where}[{k!r}]")] for k, v in value.items()]}
        raise TypeError(
            f"cannot write a {type(value).__name__} at {where}: fedgp's files hold numbers, strings, "
            "tensors, arrays, lists, tuples, dicts, HyperStates and dataclasses"
        )

    return walk(value, where)


def decode(value: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """The tree :func:`encode` wrote, with its tensors looked up in ``tensors``."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [decode(v, tensors) for v in value]
    if not isinstance(value, dict):
        raise StateCodecError(f"unexpected {type(value).__name__} in the file's state")
    if "__tensor__" in value:
        return _tensor(tensors, value["__tensor__"])
    if "__ndarray__" in value:
        return _tensor(tensors, value["__ndarray__"]).numpy()
    if "__hyperstate__" in value:
        values = {k: decode(v, tensors) for k, v in value["__hyperstate__"].items()}
        return HyperState(values, {k: tuple(s) for k, s in value["events"].items()})
    if "__dataclass__" in value:
        cls = _resolve_type(value["__dataclass__"])
        fields = {k: decode(v, tensors) for k, v in value["fields"].items()}
        init = {f.name for f in dataclasses.fields(cls) if f.init}
        obj = cls(**{k: v for k, v in fields.items() if k in init})
        for k, v in fields.items():
            if k not in init:
                object.__setattr__(obj, k, v)
        return obj
    if "__tuple__" in value:
        return tuple(decode(v, tensors) for v in value["__tuple__"])
    if "__items__" in value:
        return {decode(k, tensors): decode(v, tensors) for k, v in value["__items__"]}
    raise StateCodecError(f"unrecognised entry in the file's state, with keys {sorted(value)}")


def _tensor(tensors: dict[str, torch.Tensor], key: Any) -> torch.Tensor:
    if not isinstance(key, str) or key not in tensors:
        raise StateCodecError(f"the file's state refers to tensor {key!r}, which the file does not hold")
    return tensors[key]
