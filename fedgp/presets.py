"""Models and strategies by name: what ``fedgp fit`` and ``FederatedGPRegressor`` accept as strings.

A name stands for GPyTorch modules or a fedgp strategy with its defaults, so that a command line
or a scikit-learn parameter grid can say ``kernel="matern52"`` or ``strategy="ifca"``. Everything
a name gives can be written out in Python, and both entry points also take the objects themselves.
"""

from __future__ import annotations

from typing import Any

import gpytorch

from fedgp import defaults
from fedgp.errors import InputError
from fedgp.models.named import KERNELS, MEANS, make_kernel, make_mean, pick
from fedgp.models.spec import GPSpec
from fedgp.strategies.base import Strategy
from fedgp.strategies.fgpr import FGPR
from fedgp.strategies.ifca import IFCA

__all__ = ["KERNELS", "MEANS", "STRATEGIES", "make_kernel", "make_mean", "make_spec", "make_strategy"]

#: Strategy names: FGPR (one shared prior) and IFCA (``num_clusters`` shared priors).
STRATEGIES = {"fgpr": FGPR, "ifca": IFCA}


def make_spec(
    kernel: str | gpytorch.kernels.Kernel = defaults.KERNEL,
    mean: str | gpytorch.means.Mean = defaults.MEAN,
    d: int = 1,
    ard: bool = defaults.ARD,
) -> GPSpec:
    """A :class:`~fedgp.GPSpec` from names (or modules) for ``d`` input features:
    ``GPSpec(kernel, mean, ard=ard).for_inputs(d)``."""
    if isinstance(d, bool) or not isinstance(d, int) or d < 1:
        raise InputError(f"d must be a positive number of input features, got {d!r}")
    return GPSpec(kernel=kernel, mean=mean, ard=ard).for_inputs(d)


def make_strategy(strategy: str | Strategy = defaults.STRATEGY, **settings: Any) -> Strategy:
    """The strategy called ``strategy`` with ``settings`` (those given as ``None`` keep the
    strategy's defaults); a :class:`~fedgp.strategies.Strategy` is returned as it is (then
    ``settings`` must be empty)."""
    given = {k: v for k, v in settings.items() if v is not None}
    if isinstance(strategy, Strategy):
        if given:
            raise InputError(
                f"settings {sorted(given)} apply to a strategy given by name, not to {strategy!r}"
            )
        return strategy
    cls = pick("strategy", strategy, STRATEGIES, "a fedgp.strategies.Strategy")
    if "num_clusters" in given and cls is not IFCA:
        raise InputError(f"num_clusters (--clusters) applies to ifca, not to {strategy!r}")
    if "personal" in given and cls is not FGPR:
        raise InputError(f"personal (--personal) applies to fgpr, not to {strategy!r}")
    return cls(**given)
