"""Owners that share a core of features and may record one of their own, with a known truth.

Every owner sees ``y = sin(x1) + x2 / 2 + e`` on the core ``(x1, x2)``, with noise sd 0.1; an owner
whose kind is ``"signal"`` also records ``z``, and its response carries ``sin(2 z)`` (sd about 0.7:
on the core alone it is unexplained noise); a ``"noise"`` owner records a ``z`` that its response
ignores; a ``"none"`` owner records the core only. For :mod:`fedgp.models.own_features`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from fedgp.data.client import ClientData
from fedgp.errors import InputError

__all__ = ["OWN_CORE", "own_feature_owners"]

#: The core's names.
OWN_CORE = ("x1", "x2")
_KINDS = ("none", "signal", "noise")


def own_feature_owners(
    kinds: Sequence[str] = ("none", "signal", "noise", "none"),
    n: int = 40,
    test_fraction: float = 0.5,
    seed: int = 0,
) -> list[ClientData]:
    """One owner per entry of ``kinds`` (ids ``o0``, ``o1``, ...), ``n`` rows each on the unit box
    ``[-2, 2]``, its columns named (``x1``, ``x2`` and, unless ``"none"``, ``z``), ``test_fraction`` of
    them held out. Build the federation with ``OwnFeaturesSpec(OWN_CORE).federation(owners)``."""
    bad = [k for k in kinds if k not in _KINDS]
    if bad:
        raise InputError(f"own_feature_owners: kinds must be among {list(_KINDS)}, got {bad}")
    rng = np.random.default_rng(seed)
    owners = []
    for i, kind in enumerate(kinds):
        X, z = rng.uniform(-2, 2, size=(n, 2)), rng.uniform(-2, 2, size=n)
        y = np.sin(X[:, 0]) + X[:, 1] / 2 + (np.sin(2 * z) if kind == "signal" else 0.0)
        frame = pd.DataFrame(X, columns=list(OWN_CORE))
        if kind != "none":
            frame["z"] = z
        owner = ClientData(frame, y + 0.1 * rng.standard_normal(n), id=f"o{i}")
        owners.append(owner.split(test_fraction, seed * 1000 + i))
    return owners
