"""Strategies and their parts as JSON: what a client needs to rebuild the algorithm it runs.

Strategies are frozen dataclasses of settings, and so are their parts (initialisers, assigners,
solvers, aggregators, optimisers, local training). :class:`Configurable` gives each a
``to_config()`` — plain JSON: numbers, strings, lists and tagged tensors or states, never a
pickle — and ``from_config``, which only instantiates classes that registered themselves by
subclassing :class:`Configurable`: reading a config imports nothing and runs no code.
A client rebuilds the strategy from its config and its own ``GPSpec``.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, ClassVar

import torch

from fedgp.models.state import HyperState

__all__ = ["Configurable", "to_config", "from_config", "config_json"]

_DTYPES = {"float64": torch.float64, "float32": torch.float32, "int64": torch.int64, "bool": torch.bool}


class Configurable:
    """Mixin for frozen-dataclass settings objects that travel as JSON configs."""

    _registry: ClassVar[dict[str, type]] = {}

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        Configurable._registry[_type_name(cls)] = cls

    def to_config(self) -> dict:
        """``{"type": ..., "params": {...}}``, JSON-able; ``from_config`` inverts it."""
        return _encode(self)

    @classmethod
    def from_config(cls, config: dict) -> Any:
        """Rebuild an object from :meth:`to_config`'s settings; a config of another class is a
        ``TypeError``."""
        obj = _decode(config)
        if not isinstance(obj, cls):
            raise TypeError(f"config describes a {type(obj).__name__}, not a {cls.__name__}")
        return obj


def _type_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _encode(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Configurable):
        if not dataclasses.is_dataclass(value):
            raise TypeError(f"{type(value).__name__} is not a dataclass and cannot be configured")
        params = {f.name: _encode(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
        return {"type": _type_name(type(value)), "params": params}
    if isinstance(value, HyperState):
        return {
            "__hyperstate__": {k: _encode(v) for k, v in value.items()},
            "events": {k: list(s) for k, s in value.event_shapes.items()},
        }
    if isinstance(value, torch.Tensor):
        data = value.detach().cpu()
        return {
            "__tensor__": data.reshape(-1).tolist(),
            "dtype": str(data.dtype).removeprefix("torch."),
            "shape": list(data.shape),
        }
    if isinstance(value, torch.dtype):
        return {"__dtype__": str(value).removeprefix("torch.")}
    if isinstance(value, tuple):
        return {"__tuple__": [_encode(v) for v in value]}
    if isinstance(value, list):
        return [_encode(v) for v in value]
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise TypeError("only dicts with string keys can be part of a config")
        return {"__dict__": {k: _encode(v) for k, v in value.items()}}
    raise TypeError(f"a {type(value).__name__} cannot be part of a strategy config")


def _dtype(name: str) -> torch.dtype:
    try:
        return _DTYPES[name]
    except KeyError:
        raise ValueError(f"config: unknown dtype {name!r}") from None


def _decode(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if not isinstance(value, dict):
        raise ValueError(f"config: unexpected {type(value).__name__}")
    if "type" in value and "params" in value:
        cls = Configurable._registry.get(value["type"])
        if cls is None:
            raise ValueError(
                f"config: unknown type {value['type']!r}; only registered fedgp settings classes can be "
                "built (import the module that defines it first)"
            )
        return cls(**{k: _decode(v) for k, v in value["params"].items()})
    if "__tensor__" in value:
        shape = [int(s) for s in value["shape"]]
        return torch.tensor(value["__tensor__"], dtype=_dtype(value["dtype"])).reshape(shape)
    if "__hyperstate__" in value:
        values = {k: _decode(v) for k, v in value["__hyperstate__"].items()}
        return HyperState(values, {k: tuple(s) for k, s in value["events"].items()})
    if "__dtype__" in value:
        return _dtype(value["__dtype__"])
    if "__tuple__" in value:
        return tuple(_decode(v) for v in value["__tuple__"])
    if "__dict__" in value:
        return {k: _decode(v) for k, v in value["__dict__"].items()}
    raise ValueError(f"config: unrecognised entry with keys {sorted(value)}")


def to_config(obj: Configurable) -> dict:
    """``obj.to_config()``: a strategy or one of its parts as plain JSON-ready settings."""
    return obj.to_config()


def from_config(config: dict) -> Any:
    """Rebuild any registered settings object from its config."""
    return _decode(config)


def config_json(obj: Configurable) -> str:
    """The config as a canonical JSON string (sorted keys), e.g. to compare or store it."""
    return json.dumps(obj.to_config(), sort_keys=True, allow_nan=False)
