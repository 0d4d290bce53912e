"""Strategies and their parts as JSON configs: what a client needs to rebuild the algorithm it runs.

Strategies are frozen dataclasses of settings, and so are their parts (initialisers, assigners,
solvers, aggregators, optimisers, local training). :class:`Configurable` gives each a
``to_config()`` — plain JSON through :mod:`fedgp.messages.codec`, never a pickle — and registers
the class, so that ``from_config`` can rebuild it and nothing else. A client rebuilds the strategy
from its config and its own ``GPSpec``.
"""

from __future__ import annotations

import json
from typing import Any

from fedgp.errors import InputTypeError
from fedgp.messages.codec import decode, encode, register_name

__all__ = ["Configurable", "from_config", "config_json"]


class Configurable:
    """Mixin for frozen-dataclass settings objects that travel as JSON configs."""

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        register_name(cls)  # before @dataclass has run: the codec checks the class when it reads one

    def to_config(self) -> dict:
        """``{"type": ..., "params": {...}}``, JSON-able; ``from_config`` inverts it."""
        return encode(self, where=type(self).__name__)

    @classmethod
    def from_config(cls, config: dict) -> Any:
        """Rebuild an object from :meth:`to_config`'s settings; a config of another class is an
        ``InputTypeError``."""
        obj = decode(config)
        if not isinstance(obj, cls):
            raise InputTypeError(f"config describes a {type(obj).__name__}, not a {cls.__name__}")
        return obj


def from_config(config: dict) -> Any:
    """Rebuild any registered settings object from its config."""
    return decode(config)


def config_json(obj: Configurable) -> str:
    """The config as a canonical JSON string (sorted keys), e.g. to compare or store it."""
    return json.dumps(obj.to_config(), sort_keys=True, allow_nan=False)
