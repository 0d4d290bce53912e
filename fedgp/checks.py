"""Settings checked where they are constructed: a bad value fails at ``FGPR(lr=-1)``, not rounds later.

``check_settings(obj, lr="positive", ...)`` reads the named fields of a settings dataclass and
raises a ``ValueError`` naming the class, the field, the rule and the field's default, e.g.
``FGPR: lr must be a finite number > 0, got -1 (default 0.05)``. A ``bool`` is never a number here
(``True`` is an ``int`` to Python, but ``batch_size=True`` is a mistake).
"""

from __future__ import annotations

import math
from dataclasses import MISSING, fields
from numbers import Integral, Real
from typing import Any

from fedgp.errors import InputError

__all__ = ["RULES", "check_settings"]


def _real(v: Any) -> bool:
    return isinstance(v, Real) and not isinstance(v, bool) and math.isfinite(v)


def _int(v: Any) -> bool:
    return isinstance(v, Integral) and not isinstance(v, bool)


#: rule name -> (test, what the rule asks for)
RULES = {
    "positive": (lambda v: _real(v) and v > 0, "a finite number > 0"),
    "nonnegative": (lambda v: _real(v) and v >= 0, "a finite number >= 0"),
    "fraction": (lambda v: _real(v) and 0 <= v < 1, "a number in [0, 1)"),
    "count": (lambda v: _int(v) and v >= 1, "an int >= 1"),
    "count_or_none": (lambda v: v is None or (_int(v) and v >= 1), "an int >= 1, or None"),
    "batch_or_none": (lambda v: v is None or (_int(v) and v >= 2), "an int >= 2, or None for all local data"),
}


def check_settings(obj: Any, **rules: str) -> None:
    """Check each named field of the dataclass ``obj`` against its rule (a key of ``RULES``)."""
    defaults = {f.name: f.default for f in fields(obj) if f.default is not MISSING}
    for name, rule in rules.items():
        test, wanted = RULES[rule]
        value = getattr(obj, name)
        if not test(value):
            hint = f" (default {defaults[name]!r})" if name in defaults else ""
            raise InputError(f"{type(obj).__name__}: {name} must be {wanted}, got {value!r}{hint}")
