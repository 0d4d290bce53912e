"""fedgp: federated Gaussian-process regression on GPyTorch.

Spec + federation + strategy + engine, one ``fit``, a result that predicts per client::

    import fedgp
    draws = fedgp.synthetic.gp_federation(num_clients=20, n=250, d=2, seed=0)
    result = fedgp.fit(draws.spec, draws.federation, fedgp.strategies.FGPR(), rounds=50)
    mean, var = result.predict(X_new, client=3)

Every subpackage is an attribute of ``fedgp`` without importing it first (``fedgp.baselines``,
``fedgp.plotting``, ...). They are imported on first use (PEP 562): importing torch alone takes
about 1.8 s on a 2-core machine, so ``import fedgp`` itself imports nothing heavy
(``benchmarks/import_time.py``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from fedgp.errors import MissingExtraError, missing_extra
from fedgp.errors import __all__ as _ERRORS
from fedgp.version import DISTRIBUTION, __version__

if TYPE_CHECKING:  # what static tools (type checkers, IDEs, the API docs) see
    from fedgp import (
        aggregators,
        attacks,
        baselines,
        bo,
        clustering,
        data,
        datasets,
        engines,
        errors,
        experiments,
        export,
        messages,
        models,
        plotting,
        run,
        strategies,
        synthetic,
        transforms,
    )
    from fedgp.errors import *  # noqa: F403
    from fedgp.models import GPSpec, HyperState, VariationalGPSpec
    from fedgp.run import FitResult, fit, load

#: The objects at the top level, and where each is defined: ``name -> (module, attribute)``.
_OBJECTS = {
    "fit": ("fedgp.run", "fit"),
    "FitResult": ("fedgp.run", "FitResult"),
    "load": ("fedgp.run", "load"),
    "GPSpec": ("fedgp.models", "GPSpec"),
    "VariationalGPSpec": ("fedgp.models", "VariationalGPSpec"),
    "HyperState": ("fedgp.models", "HyperState"),
    **{name: ("fedgp.errors", name) for name in _ERRORS},
}

#: Every public module, each an attribute of ``fedgp`` on first use. ``__all__`` (what
#: ``from fedgp import *`` imports) leaves out ``flower`` and ``sklearn``, which need the extras of
#: those names, ``testing``, which needs pytest, and the plumbing the layers share (checks, cli,
#: defaults, files, layout, presets, rng, version).
_SUBMODULES = (
    "aggregators",
    "attacks",
    "baselines",
    "bo",
    "checks",
    "cli",
    "clustering",
    "commands",
    "data",
    "datasets",
    "defaults",
    "engines",
    "errors",
    "experiments",
    "export",
    "files",
    "flower",
    "layout",
    "messages",
    "models",
    "plotting",
    "presets",
    "rng",
    "run",
    "sklearn",
    "strategies",
    "summaries",
    "synthetic",
    "testing",
    "transformed",
    "transforms",
    "version",
)

#: Subpackages that need an optional extra: the module it brings, named in the error when it is missing.
_EXTRAS = {"flower": "flwr", "sklearn": "sklearn"}

__all__ = [
    "fit",
    "FitResult",
    "load",
    "GPSpec",
    "VariationalGPSpec",
    "HyperState",
    "DISTRIBUTION",
    "__version__",
    *_ERRORS,
    "aggregators",
    "attacks",
    "baselines",
    "bo",
    "clustering",
    "data",
    "datasets",
    "engines",
    "errors",
    "experiments",
    "export",
    "messages",
    "models",
    "plotting",
    "run",
    "strategies",
    "synthetic",
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
            if isinstance(err, MissingExtraError):  # the module said which extra it needs
                raise
            needs = _EXTRAS.get(name, err.name)  # the extra's module, or the one that is missing
            raise missing_extra(needs, f"fedgp.{name}", err.name) from err
    if name in _OBJECTS:
        module, attribute = _OBJECTS[name]
        value = getattr(importlib.import_module(module), attribute)
        globals()[name] = value  # later look-ups skip this function
        return value
    raise AttributeError(f"module 'fedgp' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_OBJECTS, *_SUBMODULES})
