"""fedgp: federated Gaussian-process regression on GPyTorch.

Spec + federation + strategy + engine, one ``fit``, a result that predicts per client::

    import fedgp
    draws = fedgp.data.gp_federation(num_clients=20, n=250, d=2, seed=0)
    result = fedgp.fit(draws.spec, draws.federation, fedgp.strategies.FGPR(), rounds=50)
    mean, var = result.predict(X_new, client=3)

Every subpackage is an attribute of ``fedgp`` without importing it first (``fedgp.baselines``,
``fedgp.plotting``, ...). They are imported on first use (PEP 562): importing torch alone takes
about 1.8 s on a 2-core machine, so ``import fedgp`` itself imports nothing heavy
(``benchmarks/import_time.py``).
"""

from __future__ import annotations

import importlib
import sys
import types
from importlib import metadata as _metadata
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what static tools (type checkers, IDEs, the API docs) see
    from fedgp import (
        aggregators,
        attacks,
        baselines,
        clustering,
        data,
        engines,
        experiments,
        export,
        messages,
        models,
        plotting,
        stopping,
        strategies,
        transforms,
    )
    from fedgp.export.saved import load_result as load
    from fedgp.fit import FitResult, fit
    from fedgp.models import GPSpec, HyperState
    from fedgp.stopping import ConvergenceWarning

DISTRIBUTION = "fedgp-gpytorch"
"""The name on PyPI: ``fedgp`` there is an unrelated package, so fedgp is installed as this."""

try:
    __version__ = _metadata.version(DISTRIBUTION)
except _metadata.PackageNotFoundError:  # a source tree that was never installed says so
    __version__ = "0+unknown"

#: The objects at the top level, and where each is defined: ``name -> (module, attribute)``.
_OBJECTS = {
    "fit": ("fedgp.fit", "fit"),
    "FitResult": ("fedgp.fit", "FitResult"),
    "load": ("fedgp.export.saved", "load_result"),
    "GPSpec": ("fedgp.models", "GPSpec"),
    "HyperState": ("fedgp.models", "HyperState"),
    "ConvergenceWarning": ("fedgp.stopping", "ConvergenceWarning"),
}

#: Every public module, each an attribute of ``fedgp`` on first use. ``fedgp.fit`` is the function
#: (its module is ``sys.modules["fedgp.fit"]``), so the module ``fit`` is not listed. ``__all__``
#: (what ``from fedgp import *`` imports) leaves out ``flower`` and ``sklearn``, which need the
#: extras of those names, and the plumbing the layers share (checks, cli, files, presets, progress,
#: rng, rounds, state_codec).
_SUBMODULES = (
    "aggregators",
    "attacks",
    "baselines",
    "checks",
    "cli",
    "clustering",
    "data",
    "engines",
    "experiments",
    "export",
    "files",
    "flower",
    "messages",
    "models",
    "plotting",
    "presets",
    "progress",
    "rng",
    "rounds",
    "sklearn",
    "state_codec",
    "stopping",
    "strategies",
    "transforms",
)

#: Subpackages that need an optional extra, named in the error when it is missing.
_EXTRAS = {"flower": "flower", "sklearn": "sklearn"}

__all__ = [
    "fit",
    "FitResult",
    "load",
    "GPSpec",
    "HyperState",
    "ConvergenceWarning",
    "DISTRIBUTION",
    "aggregators",
    "attacks",
    "baselines",
    "clustering",
    "data",
    "engines",
    "experiments",
    "export",
    "messages",
    "models",
    "plotting",
    "stopping",
    "strategies",
    "transforms",
]


def __getattr__(name: str):
    """Import a subpackage, or the module defining a top-level object, on first use (PEP 562)."""
    if name in _SUBMODULES:
        try:
            return importlib.import_module(f"{__name__}.{name}")  # the import binds it on fedgp too
        except ModuleNotFoundError as err:
            if err.name is None or err.name.split(".")[0] == __name__:
                raise
            missing, extra = err.name.split(".")[0], _EXTRAS.get(name)
            fix = f"pip install 'fedgp-gpytorch[{extra}]'" if extra else f"install {missing}"
            raise ModuleNotFoundError(f"fedgp.{name} needs {missing!r}: {fix}", name=missing) from err
    if name in _OBJECTS:
        module, attribute = _OBJECTS[name]
        value = getattr(importlib.import_module(module), attribute)
        globals()[name] = value  # later look-ups skip this function
        return value
    raise AttributeError(f"module 'fedgp' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_OBJECTS, *_SUBMODULES})


class _Package(types.ModuleType):
    """``fedgp`` itself. Importing the submodule ``fedgp.fit`` would bind the module over the function
    ``fedgp.fit`` (the import system sets a loaded submodule as its parent's attribute); refused here,
    so ``fedgp.fit`` is the function whatever was imported first."""

    def __setattr__(self, name: str, value) -> None:
        if name in _OBJECTS and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
