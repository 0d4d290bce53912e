"""One tree codec, one type policy: strategy configs, server states and histories as JSON.

A strategy is a frozen dataclass of settings (and of parts: initialisers, assigners, aggregators,
optimisers); a server state is a tree of tensors, :class:`~fedgp.models.state.HyperState` s, plain
values and small dataclasses. :func:`encode` turns either into JSON-ready values and
:func:`decode` rebuilds it. Tensors are written inline as lists (a strategy config that travels
as JSON) or, given a table, as references into it (files and messages, whose tensors the
container holds: :mod:`fedgp.messages.container`).

The type policy, the same for everything fedgp reads: a dataclass is named by
``module:qualname`` and rebuilt only if it is *registered* — every :class:`~fedgp.messages.config.
Configurable` registers itself when its class is defined, a state type with :func:`register_type`
— or is a dataclass defined in fedgp and already imported. Nothing is imported and nothing else
is instantiated, so a crafted config or file cannot name ``os:system`` and have it run.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import numpy as np
import torch

from fedgp.errors import CodecError, InputTypeError
from fedgp.models.state import HyperState

__all__ = ["encode", "decode", "register_type", "register_name", "type_name"]

_REGISTERED: dict[str, type] = {}
_DTYPES = {
    "float64": torch.float64,
    "float32": torch.float32,
    "int64": torch.int64,
    "int32": torch.int32,
    "bool": torch.bool,
}


def type_name(cls: type) -> str:
    """``module:qualname``, the name a class has in fedgp's JSON."""
    return f"{cls.__module__}:{cls.__qualname__}"


def register_type(cls: type) -> type:
    """Allow a dataclass defined outside fedgp (a user strategy's server state) in fedgp's configs,
    checkpoints and saved models. Usable as a class decorator."""
    if not dataclasses.is_dataclass(cls):
        raise InputTypeError(f"{cls!r} is not a dataclass; only dataclasses can be written to fedgp's files")
    _REGISTERED[type_name(cls)] = cls
    return cls


def register_name(cls: type) -> type:
    """Register ``cls`` without checking it (``Configurable`` subclasses, as they are defined, before
    ``@dataclass`` has run); :func:`decode` rebuilds only dataclasses."""
    _REGISTERED[type_name(cls)] = cls
    return cls


def _in_fedgp(module_name: str) -> bool:
    return module_name == "fedgp" or module_name.startswith("fedgp.")


def _resolve_type(name: Any) -> type:
    """The class ``module:qualname`` names, if registered or an imported fedgp dataclass; never imports."""
    if isinstance(name, str) and name in _REGISTERED and dataclasses.is_dataclass(_REGISTERED[name]):
        return _REGISTERED[name]
    module_name, _, qualname = str(name).partition(":")
    obj: Any = sys.modules.get(module_name) if _in_fedgp(module_name) else None
    for part in qualname.split(".") if obj is not None else ():
        obj = getattr(obj, part, None)
    # Defined in fedgp, not merely reachable from it (a fedgp module's ``os`` attribute, say).
    if not (isinstance(obj, type) and _in_fedgp(obj.__module__) and dataclasses.is_dataclass(obj)):
        raise CodecError(
            f"type {name!r} is not a registered or imported fedgp dataclass; fedgp rebuilds only its own "
            "settings and state types and those registered with fedgp.messages.register_type (import "
            "the module that defines a strategy before reading its config)"
        )
    return obj


def encode(value: Any, tensors: dict[str, torch.Tensor] | None = None, where: str = "value") -> Any:
    """``value`` as JSON-ready values. With a ``tensors`` table, each tensor is added to it under a
    new key and referenced by that key; without one, tensors are written inline. ``where`` names
    the value in error messages (``server_state.states``)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, torch.Tensor):
        return {"__tensor__": _put(value, tensors)}
    if isinstance(value, np.ndarray):
        return {"__ndarray__": _put(torch.from_numpy(np.ascontiguousarray(value).copy()), tensors)}
    if isinstance(value, torch.dtype):
        return {"__dtype__": str(value).removeprefix("torch.")}
    if isinstance(value, HyperState):
        return {
            "__hyperstate__": {k: encode(v, tensors, f"{where}.{k}") for k, v in value.items()},
            "events": {k: list(s) for k, s in value.event_shapes.items()},
        }
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        # The constructor's fields only: a field(init=False) is derived in __post_init__ (FGPR's local
        # training from its settings), so the rebuilt object derives it again.
        fields = [f for f in dataclasses.fields(value) if f.init]
        params = {f.name: encode(getattr(value, f.name), tensors, f"{where}.{f.name}") for f in fields}
        return {"type": type_name(type(value)), "params": params}
    if isinstance(value, tuple):
        return {"__tuple__": [encode(v, tensors, f"{where}[{i}]") for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [encode(v, tensors, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value):
            return {"__dict__": {k: encode(v, tensors, f"{where}[{k!r}]") for k, v in value.items()}}
        return {
            "__items__": [
                [encode(k, tensors, where), encode(v, tensors, f"{where}[{k!r}]")] for k, v in value.items()
            ]
        }
    raise InputTypeError(
        f"cannot encode a {type(value).__name__} at {where}: fedgp's configs and files hold numbers, "
        "strings, tensors, arrays, dtypes, lists, tuples, dicts, HyperStates and dataclasses"
    )


def _put(tensor: torch.Tensor, tensors: dict[str, torch.Tensor] | None) -> Any:
    data = tensor.detach().cpu()
    if tensors is None:
        return {
            "data": data.reshape(-1).tolist(),
            "dtype": str(data.dtype).removeprefix("torch."),
            "shape": list(data.shape),
        }
    key = str(len(tensors))
    while key in tensors:
        key = "_" + key
    tensors[key] = data.contiguous().clone()  # safetensors refuses tensors that share memory
    return key


def _get(ref: Any, tensors: dict[str, torch.Tensor] | None) -> torch.Tensor:
    if isinstance(ref, dict):  # inline
        try:
            dtype = _DTYPES[ref["dtype"]]
            return torch.tensor(ref["data"], dtype=dtype).reshape([int(s) for s in ref["shape"]])
        except (KeyError, TypeError, ValueError, RuntimeError) as err:
            raise CodecError(f"unreadable inline tensor ({type(err).__name__}: {err})") from None
    if not isinstance(ref, str) or tensors is None or ref not in tensors:
        raise CodecError(f"the encoded value refers to tensor {ref!r}, which its container does not hold")
    return tensors[ref]


_PLAIN = {
    "bool": lambda v: isinstance(v, bool),
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "float": lambda v: isinstance(v, (int, float, torch.Tensor, np.ndarray)) and not isinstance(v, bool),
}


def _expected(cls: type, annotation: Any) -> Any:
    """What a field annotated ``annotation`` must hold: a plain-type check, a class, or ``None`` (not
    checked: unions, generics, ``Any``)."""
    name = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    if name in _PLAIN:
        return _PLAIN[name]
    if not name.isidentifier() or name in ("Any", "object"):
        return None
    found = vars(sys.modules.get(cls.__module__, object)).get(name)
    return found if isinstance(found, type) and found.__module__ != "typing" else None


def _check_plain_fields(cls: type, kwargs: dict[str, Any], name: str) -> None:
    """Refuse a value of the wrong type for a field annotated exactly ``bool``, ``int``, ``float`` or
    one class (``"false"`` for a boolean is truthy, and a number where a ``HyperState`` belongs
    would fail only later, far from the file)."""
    for f in dataclasses.fields(cls):
        if f.name not in kwargs:
            continue
        expected, value = _expected(cls, f.type), kwargs[f.name]
        if expected is None:
            continue
        ok = isinstance(value, expected) if isinstance(expected, type) else expected(value)
        if not ok:
            kind = expected.__name__ if isinstance(expected, type) else f.type
            raise CodecError(f"{name}: field {f.name!r} must be a {kind}, got {value!r:.60}")


def decode(value: Any, tensors: dict[str, torch.Tensor] | None = None) -> Any:
    """The tree :func:`encode` wrote, with referenced tensors looked up in ``tensors``."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [decode(v, tensors) for v in value]
    if not isinstance(value, dict):
        raise CodecError(f"unexpected {type(value).__name__} in an encoded value")
    if "__tensor__" in value:
        return _get(value["__tensor__"], tensors)
    if "__ndarray__" in value:
        return _get(value["__ndarray__"], tensors).numpy()
    if "__dtype__" in value:
        try:
            return _DTYPES[value["__dtype__"]]
        except KeyError:
            raise CodecError(f"unknown dtype {value['__dtype__']!r}") from None
    if "__hyperstate__" in value:
        values = {k: decode(v, tensors) for k, v in value["__hyperstate__"].items()}
        return HyperState(values, {k: tuple(s) for k, s in value["events"].items()})
    if "type" in value and "params" in value:
        cls = _resolve_type(value["type"])
        params = value["params"]
        if not isinstance(params, dict):
            raise CodecError(f"{value['type']}: 'params' must be a JSON object")
        kwargs = {k: decode(v, tensors) for k, v in params.items()}
        _check_plain_fields(cls, kwargs, value["type"])
        try:
            return cls(**kwargs)
        except TypeError as err:  # a parameter the class does not take, or one missing
            raise CodecError(f"{value['type']}: {err}") from None
    if "__tuple__" in value:
        return tuple(decode(v, tensors) for v in value["__tuple__"])
    if "__dict__" in value:
        return {k: decode(v, tensors) for k, v in value["__dict__"].items()}
    if "__items__" in value:
        return {decode(k, tensors): decode(v, tensors) for k, v in value["__items__"]}
    raise CodecError(f"unrecognised encoded entry with keys {sorted(value)}")
